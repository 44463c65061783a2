"""A producer whose streamed append dies is lost within seconds (docs/protocol.md,
"Starting a turn twice and stopping one"), through the real server on both backends.

The producer is a raw socket: a chunked `application/x-ndjson` body that the test cuts
by closing the socket without the body's last chunk, as a crashed process leaves it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import orjson
import pytest
from anyio.abc import SocketStream

from tests.support import http_server
from tests.support.http_server import ProducerClient, RunningServer, make_settings, serve
from tests.support.sse_client import read_stream

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
gateway_server = http_server.gateway_server
client = http_server.client

GRACE = 1.0  # the grace of the tests that show what keeps a run (the default is 5 s)


def line(n: int) -> bytes:
    return orjson.dumps({"event": "token", "data": {"n": n}}) + b"\n"


class RawAppend:
    """A streamed append over a plain socket: `send` a chunk, `ack` reads the next line."""

    def __init__(self, sock: SocketStream) -> None:
        self.sock = sock
        self._buffer = b""

    async def send(self, data: bytes) -> None:
        await self.sock.send(b"%x\r\n%s\r\n" % (len(data), data))

    async def ack(self) -> dict[str, Any]:
        # The response is chunked; the acks are JSON lines inside its chunks.
        with anyio.fail_after(10):
            while True:
                start = self._buffer.find(b"{")
                end = self._buffer.find(b"\n", start)
                if start >= 0 and end >= 0:
                    value: dict[str, Any] = orjson.loads(self._buffer[start:end])
                    self._buffer = self._buffer[end + 1 :]
                    return value
                self._buffer += await self.sock.receive()

    async def finish(self) -> dict[str, Any]:
        await self.sock.send(b"0\r\n\r\n")
        return await self.ack()


@asynccontextmanager
async def raw_append(base_url: str, producer: ProducerClient) -> AsyncIterator[RawAppend]:
    host, port = base_url.removeprefix("http://").split(":")
    sock = await anyio.connect_tcp(host, int(port))
    head = (
        f"POST /v1/runs/{producer.run_id}/events HTTP/1.1\r\nHost: {host}\r\n"
        f"X-Producer-Token: {producer.token}\r\nContent-Type: application/x-ndjson\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    )
    await sock.send(head.encode())
    async with sock:  # leaving closes the socket: a cut unless `finish` ended the body
        yield RawAppend(sock)


async def streamed(base_url: str, producer: ProducerClient, n: int) -> None:
    """One line appended and acknowledged, then the connection cut mid-body."""
    async with raw_append(base_url, producer) as append:
        await append.send(line(n))
        assert len((await append.ack())["ids"]) == 1


async def cut_seen(server: RunningServer, run_id: str) -> None:
    """Until the gateway has cut the run's lease (it ends within the grace)."""

    async def cut() -> None:
        while True:
            info = await server.state.bridge.get_run(run_id)
            assert info is not None
            if info.lease_expires_at < time.time() + GRACE + 1:
                return
            await asyncio.sleep(0.01)

    await anyio.to_thread.run_sync(server.call, cut)


async def run_of(client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    reply: dict[str, Any] = (await client.get(f"/v1/runs/{run_id}")).json()
    return reply


# The default heartbeat: the liveness monitor's next look may be 15 s away, so the END
# within 10 s is the drop's own check.
@pytest.mark.gateway_settings(heartbeat_interval_seconds=15.0)
async def test_a_follower_of_a_crashed_producer_sees_producer_lost_within_10s(
    gateway_server: RunningServer, client: httpx.AsyncClient
) -> None:
    """The default grace (5 s) against the default lease (30 s): the END comes from the
    drop, not from the lease."""
    assert gateway_server.settings.producer_lost_grace_seconds == 5.0
    assert gateway_server.settings.lease_seconds == 30.0
    producer = await ProducerClient.claim(client, session_id="chat")
    cut_at: list[float] = []

    async def produce_then_crash() -> None:
        await streamed(gateway_server.base_url, producer, 1)
        cut_at.append(time.monotonic())

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(produce_then_crash)
            result = await read_stream(client, f"/v1/runs/{producer.run_id}/stream")
    waited = time.monotonic() - cut_at[0]
    assert [f.json() for f in result.frames if f.event == "token"] == [{"n": 1}]
    assert result.terminal is not None and result.terminal.event == "end"
    assert result.terminal.json()["status"] == "producer_lost"
    assert 4.5 <= waited < 10, waited  # the grace, then at once
    turn = (await client.get("/v1/sessions/chat/turns")).json()["turns"][0]
    assert turn["run_id"] == producer.run_id and turn["state"] == "producer_lost"
    # the producer that comes back is told, as after a lapsed lease
    late = await client.post(
        f"/v1/runs/{producer.run_id}/end",
        json={"status": "success"},
        headers={"X-Producer-Token": producer.token},
    )
    assert late.status_code == 409


@pytest.mark.gateway_settings(producer_lost_grace_seconds=GRACE)
async def test_what_keeps_a_run_after_a_drop(
    gateway_server: RunningServer, client: httpx.AsyncClient
) -> None:
    base = gateway_server.base_url
    # 1. A streamed append that reconnects within the grace, and stays open idle.
    first = await ProducerClient.claim(client)
    await streamed(base, first, 1)
    async with raw_append(base, first) as again:
        await again.send(b"\n")  # a keep-alive line: no event, the stream is open
        await anyio.sleep(GRACE * 2.5)  # time passing: nothing may happen
        assert (await run_of(client, first.run_id))["status"] == "running"
        await again.send(line(2))
        assert len((await again.ack())["ids"]) == 1
        assert (await again.finish())["done"] is True
    # 2. A batch append within the grace (a producer that goes on with batches).
    second = await ProducerClient.claim(client)
    await streamed(base, second, 1)
    await second.publish(("token", {"n": 2}))
    # 3. A clean end of the body is no drop.
    third = await ProducerClient.claim(client)
    async with raw_append(base, third) as append:
        await append.send(line(1))
        await append.ack()
        assert (await append.finish())["done"] is True
    await anyio.sleep(GRACE * 2.5)  # time passing: nothing may happen
    for producer in (second, third):
        run = await run_of(client, producer.run_id)
        assert run["status"] == "running"
        await producer.end()
    # 4. A lease renewal within the grace keeps it too (one after the cut: see it cut).
    fourth = await ProducerClient.claim(client)
    await streamed(base, fourth, 1)
    await cut_seen(gateway_server, fourth.run_id)
    renewed = await client.post(
        f"/v1/runs/{fourth.run_id}/lease", json={}, headers={"X-Producer-Token": fourth.token}
    )
    assert renewed.status_code == 200
    assert renewed.json()["lease_expires_at"] > time.time() + 20  # the whole lease again
    await anyio.sleep(GRACE * 2.5)
    assert (await run_of(client, fourth.run_id))["status"] == "running"
    await fourth.end()
    # And one left alone is lost after the grace, even if it renewed its lease while its
    # stream was open (as a producer does while its model pauses).
    fifth = await ProducerClient.claim(client)
    async with raw_append(base, fifth) as append:
        await append.send(line(1))
        assert len((await append.ack())["ids"]) == 1
        renewed = await client.post(
            f"/v1/runs/{fifth.run_id}/lease", json={}, headers={"X-Producer-Token": fifth.token}
        )
        assert renewed.status_code == 200
        await anyio.sleep(0.2)  # the model pauses a while longer, then the process dies
    with anyio.fail_after(GRACE + 5):
        result = await read_stream(client, f"/v1/runs/{fifth.run_id}/stream")
    assert result.terminal is not None and result.terminal.json()["status"] == "producer_lost"


@pytest.mark.timeout(90)
async def test_the_grace_holds_across_gateways(redis_url: str, key_prefix: str) -> None:
    """Two gateways on one Redis: a producer cut on A that reconnects to B within the
    grace keeps its run; one that does not is ended by A, and B's follower sees it."""
    settings = make_settings("redis", redis_url, key_prefix, producer_lost_grace_seconds=GRACE)
    # B's liveness monitor looks only every 15 s: the END must come from A's drop check.
    slow = make_settings(
        "redis",
        redis_url,
        key_prefix,
        producer_lost_grace_seconds=GRACE,
        heartbeat_interval_seconds=15.0,
    )
    with serve(settings, "redis") as a, serve(slow, "redis") as b:
        async with (
            httpx.AsyncClient(base_url=a.base_url, timeout=10) as on_a,
            httpx.AsyncClient(base_url=b.base_url, timeout=10) as on_b,
        ):
            kept = await ProducerClient.claim(on_a)
            await streamed(a.base_url, kept, 1)
            async with raw_append(b.base_url, kept) as again:
                await again.send(line(2))
                assert len((await again.ack())["ids"]) == 1
                await anyio.sleep(GRACE * 2.5)  # time passing: nothing may happen
                assert (await run_of(on_b, kept.run_id))["status"] == "running"
                assert (await again.finish())["done"] is True

            lost = await ProducerClient.claim(on_a)
            with anyio.fail_after(GRACE + 8):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(streamed, a.base_url, lost, 1)
                    result = await read_stream(on_b, f"/v1/runs/{lost.run_id}/stream")
            assert result.terminal is not None
            assert result.terminal.json()["status"] == "producer_lost"


@pytest.mark.anyio
async def test_the_drop_check_waits_for_a_backend_clock_behind_this_process() -> None:
    """The backend decides by its own clock: one 0.3 s behind this process still counts
    the cut lease live when the check first looks; the check tries again until the
    backend ends the run (here the memory bridge, given such a clock; no monitor runs)."""
    from gateway.bridge.memory import MemoryStreamBridge
    from gateway.http.streaming.liveness import open_drop_watch
    from gateway.settings import Settings
    from gateway.values import End

    bridge = MemoryStreamBridge(Settings(), clock=lambda: time.time() - 0.3)
    claim = await bridge.claim("behind")
    await bridge.renew_lease("behind", producer_token=claim.token, stream="m")
    last = (await bridge.publish("behind", "t", 1, producer_token=claim.token)).ids[-1]
    with anyio.fail_after(10):
        async with open_drop_watch(bridge, 0.5) as watch:
            watch.dropped("behind", claim.token, "m", last)
            async for item in bridge.subscribe("behind"):
                if isinstance(item, End):
                    assert item.status == "producer_lost"
                    break
