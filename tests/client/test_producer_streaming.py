"""The Python producer client's streamed appends (`Producer(streaming=True)`, the
default) against a real gateway (uvicorn, memory and Redis), directly and through a
TCP relay that counts and loses requests; its `Retry-After` parsing and the END error
it publishes. Its fallback behind a buffering proxy runs with real nginx in
tests/system/test_deploy.py."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from gateway.bridge.base import StreamBridge
from gateway.client.producer import Producer, _Retryable, retry_after_seconds
from gateway.values import End
from tests.client.test_producer_client import numbers, stream_of
from tests.support import http_server
from tests.support.fault_relay import Fault, FaultRelay
from tests.support.http_server import RunningServer
from tests.support.proxies import GatewayProcess
from tests.support.sse_client import SSEResult

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
gateway_server = http_server.gateway_server
client = http_server.client


@pytest.fixture
async def relay(gateway_server: RunningServer) -> AsyncIterator[FaultRelay]:
    port = int(gateway_server.base_url.rsplit(":", 1)[1])
    faults = FaultRelay(("127.0.0.1", port), marker=b"POST /v1/runs")
    async with anyio.create_task_group() as tg:
        await tg.start(faults.serve)
        yield faults
        tg.cancel_scope.cancel()


async def test_a_turn_of_tokens_costs_one_streamed_request(
    relay: FaultRelay, client: httpx.AsyncClient
) -> None:
    """300 tokens sent one by one over a while: the claim, one streamed append, the END."""
    relay.plan = lambda n: Fault.PASS
    async with Producer(relay.url, session_id="streamed", stream_seconds=30) as run:
        for n in range(300):
            await run.send("token", {"n": n, "text": f"{n} "})
            if n % 30 == 0:
                await anyio.sleep(0.01)  # the subject: tokens that come over time
    assert run.end_status == "success" and run.fell_back is None
    assert run.streams_sent == 1 and run.events_sent == 300
    assert relay.requests == 3, vars(relay)  # claim, stream, END
    result = await stream_of(client, run.run_id)
    assert numbers(result) == list(range(300))
    assert result.events[-1].id == run.last_event_id
    turns = (await client.get("/v1/sessions/streamed/turns")).json()["turns"]
    assert [t["text"] for t in turns] == ["".join(f"{n} " for n in range(300))]


@pytest.mark.system  # fault injection (a lossy relay) or a whole serve --demo: slow
async def test_streams_cut_by_a_lossy_relay_are_resent_and_apply_once(
    relay: FaultRelay, client: httpx.AsyncClient
) -> None:
    # Every other request fails: its reply cut once the gateway answers (lines applied,
    # acks lost), the request dropped, or a 503 from the relay. The client re-sends from
    # its first unacknowledged line; the overlap is answered with the first ids.
    faults = [Fault.PASS, Fault.DROP_REPLY, Fault.PASS, Fault.DROP_REQUEST, Fault.REPLY_503]
    relay.plan = lambda n: faults[n % len(faults)]
    total = 300
    async with Producer(relay.url, renew_interval=0.05) as run:
        for n in range(total):
            await run.send("token", {"n": n})
            if n % 20 == 19:
                await run.flush()  # ends the stream: many streamed requests, each at risk
    assert run.end_status == "success" and run.fell_back is None
    assert run.streams_sent >= total // 20 and relay.cut >= 2 and relay.refused >= 2
    result = await stream_of(client, run.run_id)
    assert numbers(result) == list(range(total))  # nothing lost, nothing twice, in order


async def test_an_idle_stream_keeps_the_lease_with_blank_lines(
    relay: FaultRelay, client: httpx.AsyncClient
) -> None:
    """A pause of more than two leases mid-stream: blank lines keep the lease and the body
    alive, so no lease request and no second stream is needed."""
    relay.plan = lambda n: Fault.PASS
    async with Producer(relay.url, lease_seconds=0.6, stream_seconds=30) as run:
        await run.send("token", {"n": 0})
        await anyio.sleep(1.5)  # the subject: the pause
        await run.send("token", {"n": 1})
    assert run.end_status == "success" and run.streams_sent == 1
    assert relay.requests == 3, vars(relay)  # claim, stream, END
    assert numbers(await stream_of(client, run.run_id)) == [0, 1]


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("3", 3.0),
        (" 2 ", 2.0),
        ("\u0661", 0.0),
        ("\u00b2", 0.0),
        ("-1", 0.0),
        ("1.5", 0.0),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),
        ("", 0.0),
        ("9" * 40, 0.0),
    ],
)
def test_a_malformed_retry_after_means_the_normal_backoff(value: str, seconds: float) -> None:
    assert retry_after_seconds(value) == seconds
    response = httpx.Response(503, headers={"Retry-After": value.encode()})
    assert _Retryable(response).retry_after == seconds  # never a ValueError


async def _end_error(srv: RunningServer, run_id: str) -> Any:
    async def read() -> Any:
        bridge: StreamBridge = srv.state.bridge
        async for item in bridge.subscribe(run_id):
            if isinstance(item, End):
                return item.error
        raise AssertionError("no END")

    return await anyio.to_thread.run_sync(srv.call, read)


@pytest.mark.parametrize("publish", [False, True])
async def test_the_end_error_carries_the_message_only_when_opted_in(
    gateway_server: RunningServer, publish: bool
) -> None:
    producer = Producer(gateway_server.base_url, publish_error_messages=publish)
    with pytest.raises(RuntimeError, match="secret prompt"):
        async with producer as run:
            await run.send("token", {"n": 0})
            raise RuntimeError("secret prompt")
    error = await _end_error(gateway_server, producer.run_id)
    if publish:
        assert error == {"type": "RuntimeError", "message": "secret prompt"}
    else:
        assert error == {"type": "RuntimeError"}


def _redis_connections(pid: int, redis_port: int) -> int:
    """TCP connections of process `pid` to `redis_port` (its socket inodes, matched in
    /proc/net/tcp by remote port)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            link = os.readlink(fd)
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    count = 0
    for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = row.split()
        remote_port = int(fields[2].rsplit(":", 1)[1], 16)
        if remote_port == redis_port and fields[9] in inodes and fields[3] == "01":
            count += 1  # (state 01: established)
    return count


async def test_one_follower_and_one_streaming_producer_hold_a_few_redis_connections(
    redis_url: str, key_prefix: str
) -> None:
    """The pool opens connections as concurrency needs them: a gateway with one follower
    and one producer streaming tokens holds at most 4 connections to Redis (commands,
    scripts, the pub/sub listener)."""
    redis_port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    with GatewayProcess(redis_url=redis_url, key_prefix=key_prefix, heartbeat=0.3) as gw:
        assert gw.proc is not None
        seen: list[int] = []
        followed: list[SSEResult] = []

        async def follow(run_id: str) -> None:
            followed.append(await stream_of(plain, run_id))

        async with (
            httpx.AsyncClient(base_url=gw.url, timeout=10) as plain,
            anyio.create_task_group() as tg,
            Producer(gw.url) as run,
        ):
            tg.start_soon(follow, run.run_id)
            for n in range(200):
                await run.send("token", {"n": n})
                await anyio.sleep(0.002)  # the subject: a token stream over time
                if n % 20 == 0:
                    seen.append(_redis_connections(gw.proc.pid, redis_port))
        assert numbers(followed[0]) == list(range(200))
        assert run.streams_sent >= 1 and max(seen) >= 1
        assert max(seen) <= 4, seen
