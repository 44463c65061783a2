"""The langgraph-sdk's `runs.join_stream` against the gateway, including a dropped connection.

The drop is a real server-side cut: the SDK talks to the gateway through a small TCP
proxy that the test can sever mid-stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

import anyio
import httpx
import pytest
from anyio.abc import SocketStream
from langgraph_sdk import get_client

from tests.support import http_server
from tests.support.http_server import ProducerClient, RunningServer
from tests.support.sse_client import read_stream

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(40)]
gateway_server = http_server.gateway_server
client = http_server.client


class CuttableProxy:
    """TCP proxy to the gateway; `cut()` severs every open connection."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.connections = 0
        self._scopes: list[anyio.CancelScope] = []

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        task_status.started()
        async with listener:  # serve() returns on cancellation without closing it
            await listener.serve(self._handle)

    async def _handle(self, downstream: SocketStream) -> None:
        # Closed however the handler ends, also when a cut lands while it connects.
        async with downstream:
            with anyio.CancelScope() as scope:
                self._scopes.append(scope)
                self.connections += 1
                upstream = await anyio.connect_tcp("127.0.0.1", self.upstream_port)
                async with upstream, anyio.create_task_group() as tg:
                    tg.start_soon(_pipe, downstream, upstream, tg.cancel_scope)
                    tg.start_soon(_pipe, upstream, downstream, tg.cancel_scope)

    def cut(self) -> None:
        for scope in self._scopes:
            scope.cancel()
        self._scopes.clear()


async def _pipe(src: SocketStream, dst: SocketStream, scope: anyio.CancelScope) -> None:
    try:
        async for chunk in src:
            await dst.send(chunk)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass
    scope.cancel()


@pytest.fixture
async def proxy(gateway_server: RunningServer) -> AsyncIterator[CuttableProxy]:
    port = int(gateway_server.base_url.rsplit(":", 1)[1])
    proxy = CuttableProxy(port)
    async with anyio.create_task_group() as tg:
        await tg.start(proxy.run)
        yield proxy
        tg.cancel_scope.cancel()


async def test_thread_routes_location_and_status(client: httpx.AsyncClient) -> None:
    producer = await ProducerClient.claim(client, session_id="thread-1")
    await producer.publish(("values", {"a": 1}))
    status = await client.get(f"/threads/thread-1/runs/{producer.run_id}")
    assert status.json() == {
        "run_id": producer.run_id,
        "thread_id": "thread-1",
        "status": "running",
    }
    await producer.end("cancelled")
    status = await client.get(f"/threads/thread-1/runs/{producer.run_id}")
    assert status.json()["status"] == "interrupted"
    for tail in ("stream", "join"):
        result = await read_stream(client, f"/threads/thread-1/runs/{producer.run_id}/{tail}")
        assert result.headers["location"] == f"/threads/thread-1/runs/{producer.run_id}/stream"
        assert result.frames[-1].event == "end"
    # A run is only reachable under its own session.
    other = await client.get(f"/threads/thread-2/runs/{producer.run_id}")
    assert other.status_code == 404 and other.json()["error"] == "run_not_found"
    assert (await client.get(f"/threads/bad%20id/runs/{producer.run_id}")).status_code == 422


async def test_sdk_join_stream_after_cursor(
    client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    producer = await ProducerClient.claim(client, session_id="t")
    ids = await producer.publish(*[("values", {"i": i}) for i in range(5)])
    await producer.end()
    async with get_client(url=gateway_server.base_url) as sdk:  # closes its connections
        with anyio.fail_after(15):
            stream = sdk.runs.join_stream("t", producer.run_id, last_event_id=ids[1])
            parts = [part async for part in stream]
    assert [p.event for p in parts] == ["values", "values", "values", "end"]
    assert [p.data for p in parts[:3]] == [{"i": 2}, {"i": 3}, {"i": 4}]


async def test_sdk_reconnects_after_server_side_cut(
    client: httpx.AsyncClient, proxy: CuttableProxy
) -> None:
    producer = await ProducerClient.claim(client, session_id="t")
    first = await producer.publish(*[("values", {"i": i}) for i in range(3)])
    received: list[object] = []
    async with get_client(url=f"http://127.0.0.1:{proxy.port}") as sdk:
        with anyio.fail_after(30):
            # aclosing: leaving the loop early still closes the stream's connection
            async with aclosing(sdk.runs.join_stream("t", producer.run_id)) as stream:
                async for part in stream:
                    received.append(part.data)
                    if len(received) == 3:
                        proxy.cut()  # server-side drop mid-stream
                        later = await producer.publish(*[("values", {"i": i}) for i in range(3, 6)])
                        await producer.end()
                    if part.event == "end":
                        break
    assert len(first) == 3 and len(later) == 3
    assert proxy.connections >= 2  # the SDK really reconnected
    assert received == [{"i": i} for i in range(6)] + [{"status": "success"}]


async def test_sdk_cancel_reaches_the_producer(
    client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    producer = await ProducerClient.claim(client, session_id="t")
    await producer.publish(("values", {"i": 0}))
    async with get_client(url=gateway_server.base_url) as sdk:
        with anyio.fail_after(10):
            assert await sdk.runs.cancel("t", producer.run_id) is not None
    reply = await client.post(
        f"/v1/runs/{producer.run_id}/events",
        json={"event": "values", "data": {"i": 1}},
        headers={"X-Producer-Token": producer.token},
    )
    assert reply.json()["cancel_requested"] is True
    lease = await client.post(
        f"/v1/runs/{producer.run_id}/lease", json={}, headers={"X-Producer-Token": producer.token}
    )
    assert lease.json()["cancel_requested"] is True
    await producer.end("cancelled")
    status = await client.get(f"/threads/t/runs/{producer.run_id}")
    assert status.json()["status"] == "interrupted"


async def test_thread_cancel_checks_thread_and_origin(client: httpx.AsyncClient) -> None:
    producer = await ProducerClient.claim(client, session_id="t")
    path = f"/threads/t/runs/{producer.run_id}/cancel"
    # Only under its own thread; an unknown run is a 404 too.
    assert (await client.post(f"/threads/u/runs/{producer.run_id}/cancel")).status_code == 404
    assert (await client.post("/threads/t/runs/nope/cancel")).status_code == 404
    # What a web page could send unasked (a form, text/plain, or no type from a page
    # with an Origin) is refused; JSON is accepted as on the /v1 route.
    for headers in (
        {"Content-Type": "text/plain"},
        {"Origin": "http://evil.example"},
        {"Content-Type": "application/x-www-form-urlencoded", "Origin": "http://evil.example"},
    ):
        refused = await client.post(path, headers=headers, content=b"")
        assert refused.status_code == 415, headers
    status = await client.get(f"/v1/runs/{producer.run_id}")
    assert status.json()["cancel_requested"] is False
    accepted = await client.post(path, json={})
    assert accepted.status_code == 202
    assert accepted.json() == {
        "run_id": producer.run_id,
        "thread_id": "t",
        "cancel_requested": True,
    }


async def test_sdk_cancel_with_wait_returns_once_the_run_ended(
    client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    producer = await ProducerClient.claim(client, session_id="t")
    await producer.publish(("values", {"i": 0}))

    async def honour_cancel() -> None:
        # a producer that checks its lease replies until asked to stop, then ends
        while True:
            lease = await client.post(
                f"/v1/runs/{producer.run_id}/lease",
                json={},
                headers={"X-Producer-Token": producer.token},
            )
            if lease.json()["cancel_requested"]:
                break
            await anyio.sleep(0.05)
        await producer.end("cancelled")

    async with get_client(url=gateway_server.base_url) as sdk:
        with anyio.fail_after(15):
            async with anyio.create_task_group() as tg:
                tg.start_soon(honour_cancel)
                done = await sdk.runs.cancel("t", producer.run_id, wait=True)
    assert done == {
        "run_id": producer.run_id,
        "thread_id": "t",
        "cancel_requested": True,
        "status": "interrupted",
    }
