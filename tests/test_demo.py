"""The demo producer against the in-process memory bridge, and the log formatters."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import AsyncIterator

import anyio
import pytest

from gateway.bridge.memory import MemoryStreamBridge
from gateway.demo import DEMO_SESSION, demo_tokens, run_demo, watch_command
from gateway.logging import JsonFormatter, RedactAccessTokenFilter, TextFormatter
from gateway.settings import Settings
from gateway.values import End, StreamEvent

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(20)]


@pytest.fixture
async def bridge() -> AsyncIterator[MemoryStreamBridge]:
    b = MemoryStreamBridge(Settings.model_validate({"heartbeat_interval_seconds": 0.2}))
    try:
        yield b
    finally:
        await b.close()


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
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(old)


def run_ids(handler: Collect) -> list[str]:
    return [str(r.__dict__["run_id"]) for r in handler.records if "watch it with" in r.getMessage()]


async def read_all(bridge: MemoryStreamBridge, run_id: str) -> tuple[list[str], End | None]:
    texts: list[str] = []
    end: End | None = None
    with anyio.fail_after(10):
        async for item in bridge.subscribe(run_id):
            if isinstance(item, StreamEvent):
                assert item.event == "token"
                texts.append(item.value()["text"])
            elif isinstance(item, End):
                end = item
                break
    return texts, end


async def test_demo_streams_a_paragraph_then_ends(
    bridge: MemoryStreamBridge, demo_log: Collect
) -> None:
    done = await run_demo(bridge, base_url="http://127.0.0.1:9", token_delay=0, pause=0, max_runs=2)
    assert done == 2
    ids = run_ids(demo_log)
    assert len(ids) == 2 and ids[0] != ids[1]
    for run_id in ids:
        texts, end = await read_all(bridge, run_id)
        assert "".join(texts) == "".join(demo_tokens())
        assert len(texts) > 10
        assert end is not None and end.status == "success"
        info = await bridge.get_run(run_id)
        assert info is not None and info.session_id == DEMO_SESSION
    message = next(r.getMessage() for r in demo_log.records if "watch it with" in r.getMessage())
    assert f"curl -N http://127.0.0.1:9/v1/runs/{ids[0]}/stream" in message


async def test_cancelling_the_demo_ends_its_run_interrupted(
    bridge: MemoryStreamBridge, demo_log: Collect
) -> None:
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_demo(bridge, token_delay=0.01))
        with anyio.fail_after(5):
            await demo_log.run_started.wait()
        tg.cancel_scope.cancel()
    (run_id,) = run_ids(demo_log)
    _, end = await read_all(bridge, run_id)
    assert end is not None and end.status == "interrupted"


async def test_stop_event_lets_the_current_run_finish(
    bridge: MemoryStreamBridge, demo_log: Collect
) -> None:
    stop = anyio.Event()
    result: list[int] = []

    async def producer() -> None:
        result.append(await run_demo(bridge, stop, token_delay=0.001, pause=60))

    async with anyio.create_task_group() as tg:
        tg.start_soon(producer)
        with anyio.fail_after(5):
            await demo_log.run_started.wait()
        stop.set()
    assert result == [1]
    _, end = await read_all(bridge, run_ids(demo_log)[0])
    assert end is not None and end.status == "success"


async def test_cancel_request_ends_the_demo_run_cancelled(
    bridge: MemoryStreamBridge, demo_log: Collect
) -> None:
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_demo(bridge, token_delay=0.01, max_runs=1))
        with anyio.fail_after(5):
            await demo_log.run_started.wait()
        assert await bridge.request_cancel(run_ids(demo_log)[0])
    _, end = await read_all(bridge, run_ids(demo_log)[0])
    assert end is not None and end.status == "cancelled"


def test_watch_command_mentions_auth_when_needed() -> None:
    assert watch_command("http://h:1/", "r") == "curl -N http://h:1/v1/runs/r/stream"
    assert "Bearer $GATEWAY_API_KEY" in watch_command("http://h:1", "r", auth="api_key")
    assert "$(gateway token --run r)" in watch_command("http://h:1", "r", auth="token")


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
