"""Structured logs (`--log-format json`): request lines, request ids, lifecycle events,
and no payload or credential in any line. A real uvicorn server on both bridges.

The `json_logs` fixture installs the real configuration (`configure_logging("json")`)
with its stream redirected to a buffer, plus a handler that lets a test wait for a line
(a condition with a deadline, never a sleep).
"""

from __future__ import annotations

import io
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest

from gateway.http.app import drain
from gateway.logging import JsonFormatter, configure_logging
from tests.support import http_server
from tests.support.http_server import ProducerClient, RunningServer, make_settings, serve
from tests.support.redis_servers import RedisServer
from tests.support.sse_client import iter_frames, read_stream

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
gateway_server = http_server.gateway_server
client = http_server.client

Entry = dict[str, Any]


class JsonLogs(logging.Handler):
    """Captures every record as the JSON line the real handler wrote for it."""

    def __init__(self, buffer: io.StringIO) -> None:
        super().__init__(logging.DEBUG)
        self.buffer = buffer
        self.entries: list[Entry] = []
        self._changed = threading.Condition()
        self._format = JsonFormatter()

    def emit(self, record: logging.LogRecord) -> None:
        entry = orjson.loads(self._format.format(record))
        with self._changed:
            self.entries.append(entry)
            self._changed.notify_all()

    def wait(self, match: Callable[[Entry], bool], timeout: float = 10.0) -> Entry:
        """The first line matching `match`, waiting for it up to `timeout` seconds."""
        with self._changed:
            found: list[Entry] = []

            def check() -> bool:
                found[:] = [e for e in self.entries if match(e)]
                return bool(found)

            assert self._changed.wait_for(check, timeout), "no matching log line"
            return found[0]

    def lines(self) -> list[Entry]:
        """Every line the configured (real) handler wrote, parsed."""
        return [orjson.loads(line) for line in self.buffer.getvalue().splitlines() if line]


def _server_side(record: logging.LogRecord) -> bool:
    """Drop the test's own HTTP client logs (httpx/httpcore log its URLs and headers)."""
    return not record.name.startswith(("httpx", "httpcore"))


@pytest.fixture
def json_logs() -> Iterator[JsonLogs]:
    root = logging.getLogger()
    names = ("uvicorn", "uvicorn.error", "uvicorn.access")
    saved_root = (list(root.handlers), root.level)
    saved = {n: (list(logging.getLogger(n).handlers), logging.getLogger(n).level) for n in names}
    saved_propagate = {n: logging.getLogger(n).propagate for n in names}
    buffer = io.StringIO()
    configure_logging("json", logging.DEBUG)
    real = root.handlers[0]
    assert isinstance(real, logging.StreamHandler)
    real.setStream(buffer)
    real.addFilter(_server_side)
    capture = JsonLogs(buffer)
    capture.addFilter(_server_side)
    root.addHandler(capture)
    try:
        yield capture
    finally:
        root.handlers[:] = saved_root[0]
        root.setLevel(saved_root[1])
        for name in names:
            logger = logging.getLogger(name)
            logger.handlers[:] = saved[name][0]
            logger.setLevel(saved[name][1])
            logger.propagate = saved_propagate[name]


def request_line(route: str, **fields: Any) -> Callable[[Entry], bool]:
    def match(entry: Entry) -> bool:
        if entry.get("event") != "request" or entry.get("route") != route:
            return False
        return all(entry.get(key) == value for key, value in fields.items())

    return match


def event_line(event: str, **fields: Any) -> Callable[[Entry], bool]:
    def match(entry: Entry) -> bool:
        return entry.get("event") == event and all(entry.get(k) == v for k, v in fields.items())

    return match


# ---------------------------------------------------------------------------------- tests


async def test_request_lines_ids_and_no_payload_or_token(
    json_logs: JsonLogs, client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    marker = f"PAYLOAD-MARKER-{uuid.uuid4().hex}"
    producer = await ProducerClient.claim(
        client, input_message={"role": "user", "parts": [{"kind": "text", "text": marker}]}
    )
    request_id = f"req-{uuid.uuid4().hex[:12]}"
    published = await client.post(
        f"/v1/runs/{producer.run_id}/events",
        json={"events": [{"event": "token", "data": {"text": marker}}] * 2},
        headers={"X-Producer-Token": producer.token, "X-Request-ID": request_id},
    )
    assert published.status_code == 200
    assert published.headers["x-request-id"] == request_id
    await producer.end("error", error={"message": marker})

    result = await read_stream(
        client,
        f"/v1/runs/{producer.run_id}/stream",
        params={"access_token": "not-a-real-token"},
    )
    assert result.terminal is not None and result.terminal.event == "end"
    generated = result.headers["x-request-id"]
    assert len(generated) == 32 and int(generated, 16) >= 0

    line = json_logs.wait(request_line("/v1/runs/{run_id}/events", request_id=request_id))
    assert line["method"] == "POST" and line["status"] == 200 and line["outcome"] == "ok"
    assert line["run_id"] == producer.run_id and line["level"] == "INFO"
    assert isinstance(line["duration_ms"], float | int) and line["duration_ms"] >= 0
    sse = json_logs.wait(request_line("/v1/runs/{run_id}/stream", request_id=generated))
    assert sse["status"] == 200 and sse["outcome"] == "end"
    assert sse["events_delivered"] == 2 and sse["run_id"] == producer.run_id

    claim = json_logs.wait(request_line("/v1/runs", method="POST", status=201))
    assert "run_id" not in claim  # the claim's run id is in the body, not the route

    text = json_logs.buffer.getvalue()
    assert marker not in text
    assert producer.token not in text and "not-a-real-token" not in text
    assert "/v1/runs/" + producer.run_id not in text  # templates, never raw paths
    lines = json_logs.lines()  # every line the real handler wrote is one JSON object
    assert lines and all({"ts", "level", "logger", "msg"} <= entry.keys() for entry in lines)


async def test_bad_request_id_is_replaced(json_logs: JsonLogs, client: httpx.AsyncClient) -> None:
    for bad in ("has space", "x" * 129, 'quote"d'):
        response = await client.get("/healthz", headers={"X-Request-ID": bad})
        echoed = response.headers["x-request-id"]
        assert echoed != bad and len(echoed) == 32
        line = json_logs.wait(request_line("/healthz", request_id=echoed))
        assert line["level"] == "DEBUG"  # successful probes stay out of INFO


async def test_fenced_write_and_error_outcome(
    json_logs: JsonLogs, client: httpx.AsyncClient
) -> None:
    producer = await ProducerClient.claim(client)
    response = await client.post(
        f"/v1/runs/{producer.run_id}/events",
        json={"event": "a", "data": 1},
        headers={"X-Producer-Token": "stale-token-value", "X-Request-ID": "fence-1"},
    )
    assert response.status_code == 409
    fenced = json_logs.wait(event_line("fenced_write", request_id="fence-1"))
    assert fenced["run_id"] == producer.run_id
    line = json_logs.wait(request_line("/v1/runs/{run_id}/events", request_id="fence-1"))
    assert line["status"] == 409 and line["outcome"] == "fenced"
    assert "stale-token-value" not in json_logs.buffer.getvalue()


@pytest.mark.gateway_settings(max_events_per_run=3)
async def test_gap_served_and_disconnect_outcomes(
    json_logs: JsonLogs, client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    producer = await ProducerClient.claim(client)
    ids: list[str] = []
    for i in range(8):
        ids += await producer.publish(("token", i))
    url = f"/v1/runs/{producer.run_id}/stream"
    gap = await read_stream(client, url, headers={"Last-Event-ID": ids[0], "X-Request-ID": "g-1"})
    assert gap.terminal is not None and gap.terminal.event == "gap"
    served = json_logs.wait(event_line("gap", request_id="g-1"))
    assert served["reason"] == "trimmed" and served["requested_event_id"] == ids[0]
    assert served["run_id"] == producer.run_id
    line = json_logs.wait(request_line("/v1/runs/{run_id}/stream", request_id="g-1"))
    assert line["outcome"] == "gap" and line["events_delivered"] == 0

    left = await read_stream(
        client, url, headers={"X-Request-ID": "d-1"}, stop=lambda f: f.data_id is not None
    )
    assert left.events
    line = json_logs.wait(request_line("/v1/runs/{run_id}/stream", request_id="d-1"))
    assert line["outcome"] == "disconnect"
    gateway_server.wait_open_sse(0)


async def test_drain_lifecycle_and_stream_outcome(
    json_logs: JsonLogs, client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    producer = await ProducerClient.claim(client)
    await producer.publish(("token", 1))
    url = f"/v1/runs/{producer.run_id}/stream"
    async with client.stream("GET", url, headers={"X-Request-ID": "drain-1"}) as response:
        frames = iter_frames(response)
        async for frame in frames:  # the replayed event is on the wire before the drain
            if frame.event == "token":
                break

        async def start_drain() -> None:
            drain(gateway_server.server.config.app)

        gateway_server.call(start_drain)
        [frame async for frame in frames]
    started = json_logs.wait(event_line("drain"))
    assert started["open_sse"] == 1
    line = json_logs.wait(request_line("/v1/runs/{run_id}/stream", request_id="drain-1"))
    assert line["outcome"] == "drain" and line["events_delivered"] == 1


async def test_startup_shutdown_and_recovery_end(json_logs: JsonLogs, key_prefix: str) -> None:
    with serve(make_settings("memory", None, key_prefix), "memory") as srv:
        startup = json_logs.wait(event_line("startup"))
        assert startup["backend"] == "memory" and startup["legacy_end_scan"] is True
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as client:
            producer = await ProducerClient.claim(client, lease_seconds=0.5)
            await producer.publish(("token", 1))
            result = await read_stream(client, f"/v1/runs/{producer.run_id}/stream")
            assert result.terminal is not None
            assert result.terminal.json()["status"] == "producer_lost"
        recovery = json_logs.wait(event_line("recovery_end", run_id=producer.run_id))
        assert recovery["level"] == "WARNING" and recovery["end_id"]
    json_logs.wait(event_line("shutdown"))


async def test_backend_unavailable_logged(
    json_logs: JsonLogs, redis_server_factory: Callable[..., RedisServer], key_prefix: str
) -> None:
    redis = redis_server_factory()
    with serve(make_settings("redis", redis.url, key_prefix), "redis") as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as client:
            redis.kill()
            response = await client.post("/v1/runs", json={}, headers={"X-Request-ID": "down-1"})
            assert response.status_code == 503
    event = json_logs.wait(event_line("backend_unavailable", request_id="down-1"))
    assert event["route_kind"] == "producer" and event["level"] == "WARNING"
    line = json_logs.wait(request_line("/v1/runs", request_id="down-1"))
    assert line["status"] == 503 and line["outcome"] == "backend_unavailable"
