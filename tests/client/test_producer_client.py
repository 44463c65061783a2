"""The Python producer client (`gateway.client.producer.Producer`) against a real gateway process
(uvicorn on the memory and on the Redis bridge), directly and through a TCP relay that
loses requests and replies."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import httpx
import pytest

from gateway.client.producer import Producer
from gateway.errors import (
    BackendUnavailable,
    PayloadTooLarge,
    ProducerFenced,
    RunOwned,
    StreamEnded,
    TurnExists,
)
from tests.support import http_server
from tests.support.fault_relay import Fault, FaultRelay
from tests.support.http_server import RunningServer
from tests.support.sse_client import SSEResult, read_stream

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
gateway_server = http_server.gateway_server
client = http_server.client


async def stream_of(client: httpx.AsyncClient, run_id: str) -> SSEResult:
    with anyio.fail_after(20):
        return await read_stream(client, f"/v1/runs/{run_id}/stream")


def numbers(result: SSEResult) -> list[int]:
    return [frame.json()["n"] for frame in result.events]


def end_status(result: SSEResult) -> str:
    assert result.terminal is not None and result.terminal.event == "end", result.frames[-3:]
    status: str = result.terminal.json()["status"]
    return status


async def run_status(client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    body: dict[str, Any] = (await client.get(f"/v1/runs/{run_id}")).json()
    return body


@pytest.fixture
async def relay(gateway_server: RunningServer) -> AsyncIterator[FaultRelay]:
    """A relay in front of the gateway; every POST to a run route is a request to it."""
    port = int(gateway_server.base_url.rsplit(":", 1)[1])
    faults = FaultRelay(("127.0.0.1", port), marker=b"POST /v1/runs")
    async with anyio.create_task_group() as tg:
        await tg.start(faults.serve)
        yield faults
        tg.cancel_scope.cancel()


def cycle_plan(*faults: Fault) -> Callable[[int], Fault]:
    pattern = list(faults)
    return lambda n: pattern[n % len(pattern)]


# ------------------------------------------------------------------- exactly once, in order


@pytest.mark.system  # fault injection (a lossy relay) or a whole serve --demo: slow
async def test_every_event_arrives_exactly_once_in_order_through_a_lossy_relay(
    relay: FaultRelay, client: httpx.AsyncClient
) -> None:
    # Every other request fails: after the gateway applied it (the reply is dropped),
    # before (the request is dropped), or answered 503 by the relay. Claim, appends,
    # lease renewals and END all go through it.
    relay.plan = cycle_plan(
        Fault.PASS, Fault.DROP_REPLY, Fault.PASS, Fault.DROP_REQUEST, Fault.PASS, Fault.REPLY_503
    )
    total = 400
    async with Producer(
        relay.url, session_id="lossy", batch_window=0.002, renew_interval=0.05
    ) as run:
        for n in range(total):
            await run.send("token", {"n": n, "text": f"{n} "})
            if n % 10 == 9:
                await run.flush()  # so the events go in many batches, each one at risk
        await run.flush()
        assert run.events_sent == total
    assert run.end_status == "success"
    assert min(relay.cut, relay.refused, relay.unavailable) >= 3, vars(relay)
    # Each fault was answered by a retry (but for a lease renewal the end of the block may
    # have stopped while it was on the wire).
    assert run.retries >= relay.cut + relay.refused + relay.unavailable - 1
    assert run.batches_sent >= total // 10
    result = await stream_of(client, run.run_id)
    assert numbers(result) == list(range(total))  # nothing lost, nothing twice, in order
    assert end_status(result) == "success"
    assert result.events[-1].id == run.last_event_id
    turns = (await client.get("/v1/sessions/lossy/turns")).json()["turns"]
    assert [t["text"] for t in turns] == ["".join(f"{n} " for n in range(total))]


async def test_a_claim_whose_reply_was_lost_is_retried_as_a_takeover_of_our_own_run(
    relay: FaultRelay, client: httpx.AsyncClient
) -> None:
    relay.plan = lambda n: Fault.DROP_REPLY if n == 0 else Fault.PASS
    async with Producer(relay.url) as run:
        await run.send("token", {"n": 0})
    assert run.epoch == 2 and relay.cut == 1
    result = await stream_of(client, run.run_id)
    assert numbers(result) == [0] and end_status(result) == "success"


async def test_a_gateway_that_stays_away_is_backend_unavailable() -> None:
    with socket.socket() as unused:  # bound, never listening: connections are refused
        unused.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{unused.getsockname()[1]}"
        started = anyio.current_time()
        with pytest.raises(BackendUnavailable):
            async with Producer(url, retry_timeout=0.5):
                raise AssertionError("claimed without a gateway")
        assert anyio.current_time() - started < 10


# ------------------------------------------------------------------- batching


async def test_small_events_are_coalesced_into_few_batches(
    gateway_server: RunningServer, client: httpx.AsyncClient
) -> None:
    async with Producer(gateway_server.base_url, batch_window=0.05) as run:
        await run.send_many(("token", {"n": n}) for n in range(300))
        await run.send("token", {"n": 300})
    assert run.batches_sent <= 3, run.batches_sent
    assert numbers(await stream_of(client, run.run_id)) == list(range(301))


async def test_a_batch_never_exceeds_the_byte_or_event_limits(
    gateway_server: RunningServer, client: httpx.AsyncClient
) -> None:
    async with Producer(
        gateway_server.base_url,
        batch_window=0.05,
        batch_events=50,
        batch_bytes=2000,
        streaming=False,
    ) as run:
        await run.send_many(("token", {"n": n, "pad": "x" * 100}) for n in range(100))
        await run.flush()
        assert run.batches_sent >= 7  # 2000 bytes hold at most 16 of these events
    assert numbers(await stream_of(client, run.run_id)) == list(range(100))


# ------------------------------------------------------------------- how the block ends


async def test_a_block_that_raises_ends_the_run_as_error_and_the_error_propagates(
    gateway_server: RunningServer, client: httpx.AsyncClient
) -> None:
    producer = Producer(gateway_server.base_url)
    with pytest.raises(KeyError, match="boom"):
        async with producer as run:
            await run.send("token", {"n": 0})
            raise KeyError("boom")
    result = await stream_of(client, producer.run_id)
    assert numbers(result) == [0] and end_status(result) == "error"
    info = await run_status(client, producer.run_id)
    assert info["status"] == "error"


async def test_a_cancelled_block_ends_cancelled_and_the_cancellation_goes_on(
    gateway_server: RunningServer, client: httpx.AsyncClient
) -> None:
    producer = Producer(gateway_server.base_url, batch_window=0.01)
    reached_after_block = False
    with anyio.CancelScope() as outer:
        async with producer as run:
            await run.send("token", {"n": 0})
            await run.flush()
            await run.send("token", {"n": 1})  # queued, not yet sent: sent before END
            outer.cancel()
            await anyio.sleep_forever()
        reached_after_block = True  # the cancellation must not be swallowed
    assert outer.cancelled_caught and not reached_after_block
    result = await stream_of(client, producer.run_id)
    assert numbers(result) == [0, 1] and end_status(result) == "cancelled"


async def test_a_cancel_request_stops_the_block_and_ends_the_run_cancelled(
    gateway_server: RunningServer, client: httpx.AsyncClient
) -> None:
    async with Producer(gateway_server.base_url, renew_interval=0.05) as run:
        await run.send("token", {"n": 0})
        await run.flush()
        assert (await client.post(f"/v1/runs/{run.run_id}/cancel", json={})).status_code == 202
        with anyio.fail_after(10):
            await anyio.sleep_forever()  # the cancel request cancels this
    assert run.cancel_requested and run.end_status == "cancelled"
    assert end_status(await stream_of(client, run.run_id)) == "cancelled"


async def test_without_cancel_on_request_the_code_awaits_the_request_itself(
    gateway_server: RunningServer, client: httpx.AsyncClient
) -> None:
    async with Producer(
        gateway_server.base_url, renew_interval=0.05, cancel_on_request=False
    ) as run:
        assert not run.cancel_requested
        assert (await client.post(f"/v1/runs/{run.run_id}/cancel", json={})).status_code == 202
        with anyio.fail_after(10):
            await run.wait_cancel_requested()
        assert run.cancel_requested
        await run.send("token", {"n": 0})  # still usable: the code decides when to stop
    assert end_status(await stream_of(client, run.run_id)) == "success"


async def test_an_idle_producer_keeps_its_lease(
    gateway_server: RunningServer, client: httpx.AsyncClient
) -> None:
    async with Producer(gateway_server.base_url, lease_seconds=0.6) as run:
        first = run.lease_expires_at
        await anyio.sleep(1.5)  # the subject: idle for longer than the lease
        assert run.lease_expires_at > first
        info = await run_status(client, run.run_id)
        assert info["status"] == "running"
        await run.send("token", {"n": 0})
    result = await stream_of(client, run.run_id)
    assert numbers(result) == [0] and end_status(result) == "success"


# ------------------------------------------------------------------- typed errors


async def test_a_takeover_fences_the_old_producer_with_a_typed_error(
    gateway_server: RunningServer, client: httpx.AsyncClient
) -> None:
    old = Producer(gateway_server.base_url, run_id="taken-over", renew_interval=0.05)
    with pytest.raises(ProducerFenced):
        async with old as run:
            await run.send("token", {"n": 0})
            await run.flush()
            claim = await client.post("/v1/runs", json={"run_id": "taken-over", "takeover": True})
            assert claim.status_code == 201
            with anyio.fail_after(10):
                await anyio.sleep_forever()  # the old block is cancelled once it is fenced
    assert old.end_status is None  # a fenced producer cannot END the run
    info = await run_status(client, "taken-over")
    assert info["status"] == "running" and info["retained_events"] == 1


@pytest.mark.gateway_settings(max_event_bytes=100)
async def test_a_refused_batch_cancels_the_block_and_ends_the_run_error(
    gateway_server: RunningServer, client: httpx.AsyncClient
) -> None:
    producer = Producer(gateway_server.base_url)
    reached = False
    with pytest.raises(PayloadTooLarge):
        async with producer as run:
            await run.send("token", {"n": 0})
            await run.flush()
            await run.send("token", {"n": 1, "pad": "x" * 200})  # over max_event_bytes
            with anyio.fail_after(10):
                await anyio.sleep_forever()  # cancelled by the failed batch
            reached = True
    assert not reached
    result = await stream_of(client, producer.run_id)
    assert numbers(result) == [0] and end_status(result) == "error"


async def test_claiming_an_owned_run_is_run_owned_and_an_ended_one_is_ended(
    gateway_server: RunningServer,
) -> None:
    url = gateway_server.base_url
    async with Producer(url, run_id="owned-run"):
        with pytest.raises(RunOwned):
            async with Producer(url, run_id="owned-run"):
                raise AssertionError("claimed a run with a live lease")
    with pytest.raises(StreamEnded):
        async with Producer(url, run_id="owned-run"):
            raise AssertionError("claimed an ended run")


async def test_sending_after_the_block_is_refused(gateway_server: RunningServer) -> None:
    async with Producer(gateway_server.base_url) as run:
        await run.send("token", {"n": 0})
    with pytest.raises(StreamEnded):
        await run.send("token", {"n": 1})


@pytest.mark.system  # fault injection (a lossy relay) or a whole serve --demo: slow
async def test_503s_from_a_gateway_whose_redis_replies_are_lost_are_retried_exactly_once(
    redis_url: str, key_prefix: str
) -> None:
    """The gateway itself answers 503 `backend_unavailable` when Redis ran a script but
    its reply was lost (the bridge never re-sends a write); the client re-sends the
    numbered batch and the gateway answers it with the ids of the first time."""
    from urllib.parse import urlsplit

    from tests.support.http_server import make_settings, serve

    target = urlsplit(redis_url)
    assert target.hostname is not None and target.port is not None
    relay = FaultRelay((target.hostname, target.port), marker=b"EVALSHA")
    async with anyio.create_task_group() as tg:
        await tg.start(relay.serve)
        settings = make_settings("redis", f"redis://127.0.0.1:{relay.port}", key_prefix)
        with serve(settings, "redis") as srv:
            # Every fourth script's reply is lost: claims, appends, renewals, END.
            relay.plan = lambda n: Fault.DROP_REPLY if n % 4 == 2 else Fault.PASS
            async with Producer(srv.base_url, batch_window=0.002) as run:
                for n in range(60):
                    await run.send("token", {"n": n})
                    if n % 5 == 4:
                        await run.flush()
            relay.plan = None  # read back without faults
            async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as reader:
                result = await stream_of(reader, run.run_id)
        tg.cancel_scope.cancel()
    assert relay.cut >= 3, relay.cut
    assert run.retries >= 3
    assert numbers(result) == list(range(60)) and end_status(result) == "success"


async def test_a_second_producer_with_the_key_gets_the_turn_already_running(
    gateway_server: RunningServer,
) -> None:
    url = gateway_server.base_url
    async with Producer(url, session_id="tab", idempotency_key="msg-1") as first:
        with pytest.raises(TurnExists) as told:
            async with Producer(url, session_id="tab", idempotency_key="msg-1"):
                raise AssertionError("started a second turn")
        assert told.value.run_id == first.run_id
        await first.send("token", {"n": 0})


async def test_a_keyed_claim_whose_reply_was_lost_goes_on(
    relay: FaultRelay, client: httpx.AsyncClient
) -> None:
    relay.plan = lambda n: Fault.DROP_REPLY if n == 0 else Fault.PASS
    async with Producer(relay.url, session_id="s", idempotency_key="k") as run:
        await run.send("token", {"n": 0})
    assert run.epoch == 2 and relay.cut == 1  # the retry took its own turn back
    result = await stream_of(client, run.run_id)
    assert numbers(result) == [0] and end_status(result) == "success"
