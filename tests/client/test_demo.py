"""The demo producer against a real gateway (memory and Redis), and the log formatters.

The demo writes through the HTTP producer API with the producer client, so its turns
are turns of the session `demo` like any producer's: the tests read them back from the
session routes and the run streams. The log tests count what `gateway serve --demo`
writes (a real subprocess) and which request lines its filter quiets.
"""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from gateway.client.demo import (
    DEMO_SESSION,
    PARAGRAPH,
    QUESTION,
    DemoRequests,
    console_url,
    demo_tokens,
    run_demo,
    watch_command,
    with_demo_key,
)
from gateway.http.edge.observe import request_log
from gateway.logging import JsonFormatter, RedactAccessTokenFilter, TextFormatter
from gateway.settings import Settings
from tests.support import http_server
from tests.support.http_server import RunningServer
from tests.support.sse_client import read_stream
from tests.test_cli import Server, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]
gateway_server = http_server.gateway_server
client = http_server.client


class Collect(logging.Handler):
    """Keeps the demo's log records; `run_started` is set at the first 'watch it' line."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.run_started = anyio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        if "watch it with" in record.getMessage():
            self.run_started.set()


@pytest.fixture
async def demo_log() -> AsyncIterator[Collect]:
    handler = Collect()
    logger = logging.getLogger("gateway.demo")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(old)


def run_ids(handler: Collect) -> list[str]:
    return [str(r.__dict__["run_id"]) for r in handler.records if "watch it with" in r.getMessage()]


async def read_run(client: httpx.AsyncClient, run_id: str) -> tuple[list[str], str]:
    """The texts of a run's token events and its END status."""
    with anyio.fail_after(15):
        result = await read_stream(client, f"/v1/runs/{run_id}/stream")
    assert all(frame.event == "token" for frame in result.events)
    assert result.terminal is not None and result.terminal.event == "end"
    return [frame.json()["text"] for frame in result.events], result.terminal.json()["status"]


async def turns(client: httpx.AsyncClient) -> list[dict[str, Any]]:
    reply = await client.get(f"/v1/sessions/{DEMO_SESSION}/turns")
    assert reply.status_code == 200, reply.text
    found: list[dict[str, Any]] = reply.json()["turns"]
    return found


async def test_demo_turns_are_turns_of_the_demo_session(
    gateway_server: RunningServer, client: httpx.AsyncClient, demo_log: Collect
) -> None:
    url = gateway_server.base_url
    done = await run_demo(url, display_url="http://127.0.0.1:9", token_delay=0, pause=0, max_runs=2)
    assert done == 2
    ids = run_ids(demo_log)
    assert len(ids) == 2 and ids[0] != ids[1]
    for run_id in ids:
        texts, status = await read_run(client, run_id)
        assert "".join(texts) == PARAGRAPH and status == "success"
    # The session knows them: the index, and each turn with its question and answer.
    index = (await client.get("/v1/sessions")).json()["sessions"]
    assert [(row["session_id"], row["turn_count"]) for row in index] == [(DEMO_SESSION, 2)]
    recorded = await turns(client)
    assert [t["run_id"] for t in recorded] == ids
    for turn in recorded:
        assert turn["text"] == PARAGRAPH and turn["state"] == "success"
        assert turn["history"][0]["role"] == "user"
        assert turn["history"][0]["parts"] == [{"kind": "text", "text": QUESTION}]
    messages = [r.getMessage() for r in demo_log.records]
    assert f"open the console: {console_url('http://127.0.0.1:9')}" in messages[0]
    watch = next(m for m in messages if "watch it with" in m)
    assert f"curl -N http://127.0.0.1:9/v1/runs/{ids[0]}/stream" in watch


async def test_the_running_demo_turn_is_visible_in_the_session_while_it_streams(
    gateway_server: RunningServer, client: httpx.AsyncClient, demo_log: Collect
) -> None:
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_demo(gateway_server.base_url, token_delay=0.02, max_runs=1))
        with anyio.fail_after(10):
            await demo_log.run_started.wait()
            while True:  # the session's turn fills up while the run is still running
                (turn,) = await turns(client)
                if turn["state"] == "running" and turn["text"]:
                    break
                await anyio.sleep(0.02)
        assert PARAGRAPH.startswith(turn["text"]) and turn["text"] != PARAGRAPH
    assert [t["state"] for t in await turns(client)] == ["success"]


async def test_cancelling_the_demo_ends_its_run_interrupted(
    gateway_server: RunningServer, client: httpx.AsyncClient, demo_log: Collect
) -> None:
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_demo(gateway_server.base_url, token_delay=0.01))
        with anyio.fail_after(5):
            await demo_log.run_started.wait()
        tg.cancel_scope.cancel()
    (run_id,) = run_ids(demo_log)
    _, status = await read_run(client, run_id)
    assert status == "interrupted"


async def test_stop_event_lets_the_current_run_finish(
    gateway_server: RunningServer, client: httpx.AsyncClient, demo_log: Collect
) -> None:
    stop = anyio.Event()
    result: list[int] = []

    async def producer() -> None:
        result.append(await run_demo(gateway_server.base_url, stop=stop, token_delay=0.001))

    async with anyio.create_task_group() as tg:
        tg.start_soon(producer)
        with anyio.fail_after(5):
            await demo_log.run_started.wait()
        stop.set()
    assert result == [1]
    _, status = await read_run(client, run_ids(demo_log)[0])
    assert status == "success"


async def test_cancel_request_ends_the_demo_run_cancelled(
    gateway_server: RunningServer, client: httpx.AsyncClient, demo_log: Collect
) -> None:
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_demo(gateway_server.base_url, token_delay=0.01, max_runs=1))
        with anyio.fail_after(5):
            await demo_log.run_started.wait()
        cancel = await client.post(f"/v1/runs/{run_ids(demo_log)[0]}/cancel", json={})
        assert cancel.status_code == 202
    texts, status = await read_run(client, run_ids(demo_log)[0])
    assert status == "cancelled" and len(texts) < len(list(demo_tokens()))


@pytest.mark.gateway_settings(api_keys=("operator-key",), jwt_secret="s" * 32)
async def test_the_demo_authenticates_like_any_producer(
    gateway_server: RunningServer, demo_log: Collect
) -> None:
    """Against a gateway that needs API keys: refused without one, streams with one."""
    url = gateway_server.base_url
    assert await run_demo(url, None, token_delay=0, pause=0, max_runs=1) == 0
    assert any("demo run failed" in r.getMessage() for r in demo_log.records)
    assert await run_demo(url, "operator-key", token_delay=0, pause=0, max_runs=1) == 1
    watch = next(r.getMessage() for r in demo_log.records if "watch it with" in r.getMessage())
    assert 'Authorization: Bearer $GATEWAY_API_KEY"' in watch


def test_serve_demo_gets_a_key_of_its_own_only_when_the_gateway_needs_one() -> None:
    open_settings = Settings()
    assert with_demo_key(open_settings) == (open_settings, None)
    keyed, key = with_demo_key(Settings(jwt_secret="s" * 32))
    assert key is not None and len(key) >= 32 and keyed.api_keys == (key,)
    keyed, other = with_demo_key(Settings(api_keys=("a",)))
    assert other is not None and other != key and keyed.api_keys == ("a", other)


def test_watch_command_mentions_auth_when_needed() -> None:
    assert watch_command("http://h:1/", "r") == "curl -N http://h:1/v1/runs/r/stream"
    assert "Bearer $GATEWAY_API_KEY" in watch_command("http://h:1", "r", auth="api_key")
    assert "$(gateway token --run r)" in watch_command("http://h:1", "r", auth="token")
    assert console_url("http://h:1/") == "http://h:1/?session=demo"


# -- log formatters ------------------------------------------------------------------------


def _format(formatter: logging.Formatter, **extra: object) -> str:
    record = logging.LogRecord("gateway.http", logging.INFO, __file__, 1, "hello %s", ("x",), None)
    for key, value in extra.items():
        setattr(record, key, value)
    return formatter.format(record)


def test_json_log_lines_carry_extras_but_never_payloads() -> None:
    line = _format(
        JsonFormatter(),
        run_id="r1",
        request_id="q1",
        outcome="success",
        data={"secret": "payload"},
        producer_token="tok",
    )
    entry = json.loads(line)
    assert entry["msg"] == "hello x" and entry["level"] == "INFO"
    assert entry["logger"] == "gateway.http" and entry["ts"].endswith("Z")
    assert entry["run_id"] == "r1" and entry["request_id"] == "q1"
    assert entry["outcome"] == "success"
    assert "data" not in entry and "producer_token" not in entry
    assert "payload" not in line and "\n" not in line


def test_text_log_lines() -> None:
    line = _format(TextFormatter(), run_id="r1", text="answer text")
    assert "INFO gateway.http: hello x" in line and "run_id=r1" in line
    assert "answer text" not in line


def test_access_token_is_masked_in_access_logs() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(TextFormatter())
    handler.addFilter(RedactAccessTokenFilter())
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:1", "GET", "/v1/runs/r/stream?access_token=eyJ.abc.def&x=1", "1.1", 200),
        None,
    )
    handler.handle(record)
    assert "eyJ" not in stream.getvalue() and "access_token=***&x=1" in stream.getvalue()


# -- a calm log: one INFO line per demo turn -----------------------------------------------


def test_the_demo_text_is_true_on_every_backend() -> None:
    # The same paragraph streams on memory and on Redis: it names neither.
    assert "redis" not in PARAGRAPH.lower() and "memory" not in PARAGRAPH.lower()


class RequestLines(logging.Handler):
    """The request log's records, at every level."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def levels(self, request_id: Callable[[str], bool]) -> list[str]:
        return [r.levelname for r in self.records if request_id(str(r.__dict__["request_id"]))]


@pytest.fixture
def request_lines() -> Iterator[RequestLines]:
    handler = RequestLines()
    old = request_log.level
    request_log.addHandler(handler)
    request_log.setLevel(logging.DEBUG)
    yield handler
    request_log.removeHandler(handler)
    request_log.setLevel(old)


@pytest.mark.gateway_settings(api_keys=("operator-key",))
async def test_only_the_demos_own_successful_requests_are_quieted(
    gateway_server: RunningServer, request_lines: RequestLines, demo_log: Collect
) -> None:
    requests = DemoRequests()
    request_log.addFilter(requests.filter)
    url = gateway_server.base_url
    try:
        async with requests.client() as demo_client:
            # Without a key the claim is refused: a failure stays at INFO.
            assert await run_demo(url, None, max_runs=1, pause=0, client=demo_client) == 0
            failed = request_lines.levels(lambda rid: rid.startswith(requests.prefix))
            assert failed == ["INFO"]
            ok = await run_demo(
                url, "operator-key", token_delay=0, pause=0, max_runs=1, client=demo_client
            )
            assert ok == 1
        # Claim, appends, END: each a DEBUG line with the next demo request id.
        ids = [str(r.__dict__["request_id"]) for r in request_lines.records]
        demo_lines = [
            (rid, r.levelname)
            for rid, r in zip(ids, request_lines.records, strict=True)
            if rid.startswith(requests.prefix)
        ]
        # The refused claim (INFO, above), then the successful run: all DEBUG.
        assert len(demo_lines) >= 4
        assert [level for _, level in demo_lines[1:]] == ["DEBUG"] * (len(demo_lines) - 1)
        numbers = [int(rid.removeprefix(requests.prefix)) for rid, _ in demo_lines]
        assert sorted(numbers) == list(range(1, len(demo_lines) + 1))
        # Another client cannot quiet its own lines by guessing: not `demo`, not a
        # request id of the same shape, not the prefix of another process.
        guesses = ["demo", "demo-1", f"demo-{'0' * 32}-1", f"{DemoRequests().prefix}1"]
        headers = {"Authorization": "Bearer operator-key"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=10) as other:
            for guess in guesses:
                reply = await other.get("/v1/sessions", headers={"X-Request-ID": guess})
                assert reply.status_code == 200 and reply.headers["x-request-id"] == guess
        assert request_lines.levels(lambda rid: rid in guesses) == ["INFO"] * len(guesses)
    finally:
        request_log.removeFilter(requests.filter)
    # The demo's own lines: the curl hint at INFO, the successful end at DEBUG.
    levels = [(r.levelname, r.getMessage()[:18]) for r in demo_log.records]
    assert levels[-3:] == [
        ("INFO", "demo producer star"),
        ("INFO", "demo run streaming"),
        ("DEBUG", "demo run ended"),
    ]


@pytest.fixture
def demo_server(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def start(*args: str) -> Server:
        servers.append(Server(tmp_path, *args))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


LOG_LINE = re.compile(r"^\S+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) (\S+): (.*)$")


def log_lines(text: str) -> list[tuple[str, str, str]]:
    """(level, logger, message) of each complete log line."""
    matches = (LOG_LINE.match(line) for line in text.splitlines())
    return [(m[1], m[2], m[3]) for m in matches if m is not None]


@pytest.mark.system  # fault injection (a lossy relay) or a whole serve --demo: slow
@pytest.mark.timeout(60)
def test_serve_demo_logs_one_info_line_per_turn(
    demo_server: Callable[..., Server],
) -> None:
    server = demo_server("--demo", "--demo-pause", "0.2")
    hint = "demo run streaming; watch it with: curl"

    def third_turn() -> bool:
        return sum(hint in message for _, _, message in log_lines(server.log())) >= 3

    wait_for(third_turn, 40, "the demo's third turn")
    lines = log_lines(server.log())
    starts = [i for i, (_, _, message) in enumerate(lines) if hint in message]
    # Two whole turns, from the first curl line to the third: what the operator sees.
    two_turns = lines[starts[0] : starts[2]]
    assert [(level, logger) for level, logger, _ in two_turns] == [("INFO", "gateway.demo")] * 2
    assert all(hint in message for _, _, message in two_turns)

    # Another client's request logs at INFO, whatever request id it picks.
    for guess in ("demo", "demo-1"):
        reply = httpx.get(f"{server.base}/v1/sessions", headers={"X-Request-ID": guess}, timeout=5)
        assert reply.status_code == 200

    def other_lines() -> list[str]:
        return [
            level
            for level, logger, message in log_lines(server.log())
            if logger == "gateway.http.requests" and "GET /v1/sessions 200" in message
        ]

    assert wait_for(lambda: len(other_lines()) == 2 and other_lines(), 10, "two request lines")
    assert other_lines() == ["INFO", "INFO"]
    assert "request_id=demo " in server.log() and "request_id=demo-1 " in server.log()
    assert server.terminate() == 0
