"""Real Python SSE clients, each with its own reconnect mechanism, on both bridges:
httpx-sse, aiohttp-sse-client and langgraph-sdk.

For each client:
- exact resume: the connection is cut mid-run (a loopback TCP proxy) while events are
  published; the client (or, for a client without reconnects, the app's loop) comes
  back with the last id and gets exactly the missed events, then `end`;
- stops after `end`: it sees `end` once, and makes at most one request in the 8 s after
  it (the gateway's request log counts them);
- stops after `gap`: the same for a reader whose cursor is no longer retained, which is
  never handed an event past the gap;
- no empty events: nothing it hands the app is an event without data (the `retry:`
  hint and the heartbeats that arrive while it waits are no events).

The Node clients (npm `eventsource`, `@microsoft/fetch-event-source`) are in
tests/js/clients.test.mjs, driven by tests/system/test_js_client.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
import anyio
import httpx
import pytest
from aiohttp_sse_client import client as aiohttp_sse
from httpx_sse import aconnect_sse
from langgraph_sdk import get_client

from tests.http_app import test_http_langgraph
from tests.http_app.test_http_langgraph import CuttableProxy
from tests.support import http_server
from tests.support.http_server import ProducerClient, RunningServer
from tests.support.request_log import RequestLog, request_log

MAX_EVENTS = 5
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.timeout(60),
    pytest.mark.gateway_settings(max_events_per_run=MAX_EVENTS),
]
gateway_server = http_server.gateway_server
client = http_server.client
proxy = test_http_langgraph.proxy  # a cuttable TCP proxy in front of gateway_server

QUIET_SECONDS = 8.0  # how long a client is watched after `end` / `gap`
SESSION = "clients"


@dataclass
class Seen:
    """What a client handed the app: (event, id, data) in order."""

    events: list[tuple[str, str | None, str]] = field(default_factory=list)
    terminal_at: float | None = None
    stopped: str | None = None  # how the client's loop ended

    def add(self, event: str | None, event_id: str | None, data: str) -> None:
        self.events.append((event or "message", event_id or None, data))
        if event in ("end", "gap") and self.terminal_at is None:
            self.terminal_at = time.monotonic()

    def names(self) -> list[str]:
        return [name for name, _, _ in self.events]


# ------------------------------------------------------------------------------ clients
# Each follows `path` (a stream path plus an optional `?last_event_id=`) under `base`,
# recording into `seen`, the way an app using that client would write it.

Follow = Callable[[str, str, Seen], Awaitable[None]]


async def follow_httpx_sse(base: str, path: str, seen: Seen) -> None:
    """httpx-sse parses; reconnecting is the app's loop: resend the last id, stop on 204."""
    last_id: str | None = None
    retry_ms = 1000
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        while True:
            headers = {"Last-Event-ID": last_id} if last_id else {}
            try:
                async with aconnect_sse(http, "GET", path, headers=headers) as source:
                    if source.response.status_code == 204:
                        seen.stopped = "204"
                        return
                    source.response.raise_for_status()
                    async for sse in source.aiter_sse():
                        if sse.retry is not None:
                            retry_ms = sse.retry
                        last_id = sse.id or last_id
                        seen.add(sse.event, sse.id, sse.data)
            except (httpx.TransportError, httpx.RemoteProtocolError):
                pass  # dropped: reconnect below
            await asyncio.sleep(retry_ms / 1000)


async def follow_aiohttp_sse_client(base: str, path: str, seen: Seen) -> None:
    """aiohttp-sse-client reconnects by itself after the response ends (WHATWG style)."""
    async with aiohttp.ClientSession() as session:
        last_id = ""
        while True:
            headers = {"Last-Event-ID": last_id} if last_id else {}
            try:
                async with aiohttp_sse.EventSource(
                    base + path, session=session, headers=headers
                ) as source:
                    async for message in source:
                        last_id = message.last_event_id or last_id
                        seen.add(message.type, message.last_event_id, message.data)
            except ConnectionAbortedError:
                seen.stopped = "204"  # "wrong response status: 204": it stopped
                return
            except aiohttp.ClientPayloadError:
                pass  # a cut mid-response is raised to the app: resume with the last id


async def follow_langgraph_sdk(base: str, path: str, seen: Seen) -> None:
    """langgraph-sdk `runs.join_stream`: reconnects by itself (Location + Last-Event-ID)."""
    run_id = path.split("/")[4].split("?")[0]
    cursor = path.partition("last_event_id=")[2] or None
    async with get_client(url=base) as sdk:  # (closes its connections, also when cancelled)
        async for part in sdk.runs.join_stream(SESSION, run_id, last_event_id=cursor):
            seen.add(part.event, getattr(part, "id", None), str(part.data))
    seen.stopped = "returned"


CLIENTS: dict[str, Follow] = {
    "httpx-sse": follow_httpx_sse,
    "aiohttp-sse-client": follow_aiohttp_sse_client,
    "langgraph-sdk": follow_langgraph_sdk,
}


def _path(client_name: str, run_id: str, cursor: str | None = None) -> str:
    if client_name == "langgraph-sdk":
        path = f"/threads/{SESSION}/runs/{run_id}/stream"
    else:
        path = f"/v1/runs/{run_id}/stream"
    return path if cursor is None else f"{path}?last_event_id={cursor}"


async def _until(what: str, check: Callable[[], bool], timeout: float = 15.0) -> None:
    with anyio.fail_after(timeout):
        while not check():
            await anyio.sleep(0.02)


@asynccontextmanager
async def following(follow: Follow, base: str, path: str, seen: Seen) -> AsyncIterator[RequestLog]:
    """The client follows `path` in the background; the request log meanwhile."""
    with request_log() as log:
        async with anyio.create_task_group() as tg:
            tg.start_soon(follow, base, path, seen)
            yield log
            tg.cancel_scope.cancel()


async def quiet_reads(seen: Seen, log: RequestLog, run_id: str) -> list[str]:
    """The reader requests in the `QUIET_SECONDS` after the client saw `end`/`gap`."""
    await _until("end or gap", lambda: seen.terminal_at is not None, timeout=30)
    assert seen.terminal_at is not None
    await anyio.sleep(QUIET_SECONDS)
    return log.reads_after(run_id, seen.terminal_at)


def _data_events(seen: Seen) -> list[str]:
    return [data for name, _, data in seen.events if name not in ("end", "gap", "error")]


# -------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("name", list(CLIENTS))
async def test_client_resumes_exactly_and_stops_after_end(
    name: str, client: httpx.AsyncClient, proxy: CuttableProxy
) -> None:
    follow = CLIENTS[name]
    producer = await ProducerClient.claim(client, session_id=SESSION)
    await producer.publish(("values", {"i": 0}), ("values", {"i": 1}))
    seen = Seen()
    base = f"http://127.0.0.1:{proxy.port}"
    async with following(follow, base, _path(name, producer.run_id), seen) as log:
        await _until("two events", lambda: len(_data_events(seen)) == 2)
        await anyio.sleep(0.7)  # idle: heartbeats (every 0.3 s) reach the client
        proxy.cut()  # the network drops; the run goes on
        await producer.publish(("values", {"i": 2}), ("values", {"i": 3}))
        await producer.end()
        after = await quiet_reads(seen, log, producer.run_id)
    assert _data_events(seen) == [
        str({"i": i}) if name == "langgraph-sdk" else f'{{"i":{i}}}' for i in range(4)
    ], seen.events
    assert seen.names().count("end") == 1 and seen.names()[-1] == "end", seen.events
    assert all(data for _, _, data in seen.events), f"an empty event: {seen.events}"
    assert len(after) <= 1, after


@pytest.mark.parametrize("name", list(CLIENTS))
async def test_client_stops_after_a_gap_and_is_never_moved_past_it(
    name: str, client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    follow = CLIENTS[name]
    producer = await ProducerClient.claim(client, session_id=SESSION)
    ids = []
    for i in range(MAX_EVENTS + 4):  # one by one, so Redis approximate trimming acts
        ids += await producer.publish(("values", {"i": i}))
    seen = Seen()
    path = _path(name, producer.run_id, ids[0])
    async with following(follow, gateway_server.base_url, path, seen) as log:
        await _until("gap", lambda: seen.terminal_at is not None)
        # The run goes on: nothing of it may reach a client that was sent the gap.
        await producer.publish(("values", {"i": 99}))
        after = await quiet_reads(seen, log, producer.run_id)
    assert seen.names().count("gap") == 1, seen.events
    assert _data_events(seen) == [], seen.events
    assert len(after) <= 1, after
    await producer.end()
