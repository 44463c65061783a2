"""Memory-only rules of MemoryStreamBridge (the shared contract suite covers the rest).

Generations and their retirement, close, the exact last-evicted boundary, live readers
overtaken by eviction, payload isolation, heartbeats, fencing, END idempotency and timers.
Synchronisation is by events and task scheduling; real time is only used where time is
the thing under test (heartbeats, delayed cleanup, TTL).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest

from gateway.bridge.memory import MemoryStreamBridge
from gateway.bridge.rules import READ_BATCH
from gateway.errors import (
    BridgeClosed,
    InvalidInput,
    ProducerFenced,
    RunOwned,
    StreamEnded,
)
from gateway.settings import Settings
from gateway.values import HEARTBEAT, End, StreamEvent, StreamGap, StreamItem

pytestmark = pytest.mark.anyio

REMOVED = StreamGap(None, None, None, "stream_removed")
CLOSED = StreamGap(None, None, None, "bridge_closed")


def removed_after(event_id: str, reason: str = "stream_removed") -> StreamGap:
    """The gap of a reader whose log went away after it had `event_id` (the last one)."""
    return StreamGap(event_id, None, None, reason)  # type: ignore[arg-type]


class FakeClock:
    """A wall clock the test moves by hand (leases and ids read it)."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make(clock: FakeClock | None = None, **overrides: Any) -> MemoryStreamBridge:
    values: dict[str, Any] = {"heartbeat_interval_seconds": 60.0, **overrides}
    return MemoryStreamBridge(Settings(**values), clock=clock or time.time)


@pytest.fixture
def bridge() -> Iterator[MemoryStreamBridge]:
    yield make(max_events_per_run=3)


async def nxt(it: AsyncIterator[StreamItem]) -> StreamItem:
    with anyio.fail_after(2):
        return await anext(it)


async def drain(it: AsyncIterator[StreamItem]) -> list[StreamItem]:
    """Every item up to and including the terminal END or gap."""
    items: list[StreamItem] = []
    while True:
        item = await nxt(it)
        items.append(item)
        if isinstance(item, End | StreamGap):
            return items


async def parked(it: AsyncIterator[StreamItem]) -> asyncio.Task[StreamItem]:
    """A task blocked inside the reader's wait (it runs until its first real suspension)."""
    task = asyncio.ensure_future(anext(it))
    for _ in range(3):
        await asyncio.sleep(0)
    assert not task.done()
    return task


async def result(task: asyncio.Task[StreamItem]) -> StreamItem:
    with anyio.fail_after(2):
        return await task


def ids(items: list[StreamItem]) -> list[str]:
    return [i.id for i in items if isinstance(i, StreamEvent)]


async def started(bridge: MemoryStreamBridge, run: str, n: int = 0) -> tuple[str, list[str]]:
    claim = await bridge.claim(run)
    published: list[str] = []
    for i in range(n):
        published += (await bridge.publish(run, "tick", {"i": i}, producer_token=claim.token)).ids
    return claim.token, published


# ---------------------------------------------------------------- ids, leases, END


async def test_ids_strictly_increase_when_the_clock_repeats_or_goes_back() -> None:
    clock = FakeClock(1000.0)
    bridge = make(clock)
    token = (await bridge.claim("r")).token
    got = []
    for now in (1000.0, 1000.0, 999.0, 1000.0005, 1001.0):
        clock.now = now
        got += (await bridge.publish("r", "e", now, producer_token=token)).ids
    assert got == ["1000000-0", "1000000-1", "1000000-2", "1000000-3", "1001000-0"]
    end = await bridge.publish_end("r", "success", producer_token=token)
    assert end.id == "1001000-1"


async def test_takeover_fences_the_old_token_and_writes_nothing() -> None:
    clock = FakeClock()
    bridge = make(clock)
    first = await bridge.claim("r", lease_seconds=10)
    assert first.epoch == 1
    with pytest.raises(RunOwned):
        await bridge.claim("r")
    second = await bridge.claim("r", takeover=True)
    assert second.epoch == 2 and second.token != first.token
    with pytest.raises(ProducerFenced):
        await bridge.publish("r", "e", 1, producer_token=first.token)
    with pytest.raises(ProducerFenced):
        await bridge.publish_end("r", "error", producer_token=first.token)
    with pytest.raises(ProducerFenced):
        await bridge.renew_lease("r", producer_token=first.token)
    assert not await bridge.stream_exists("r")
    await bridge.publish("r", "e", 1, producer_token=second.token)
    info = await bridge.get_run("r")
    assert info is not None and info.retained_events == 1 and info.status == "running"


async def test_lease_expiry_fences_and_allows_claim_with_next_epoch() -> None:
    clock = FakeClock()
    bridge = make(clock, lease_seconds=5, max_lease_seconds=20)
    claim = await bridge.claim("r", lease_seconds=1000)
    assert claim.lease_expires_at == clock.now + 20  # capped at max_lease_seconds
    clock.now += 10
    await bridge.publish("r", "e", 1, producer_token=claim.token)  # renews for 20 s
    clock.now += 20
    with pytest.raises(ProducerFenced):
        await bridge.publish("r", "e", 2, producer_token=claim.token)
    again = await bridge.claim("r")
    assert again.epoch == 2
    assert (await bridge.get_run("r")).retained_events == 1  # type: ignore[union-attr]


async def test_end_is_idempotent_and_final() -> None:
    bridge = make()
    token, _ = await started(bridge, "r", 1)
    first = await bridge.publish_end("r", "success", producer_token=token)
    assert first.id is not None and not first.deduplicated
    again = await bridge.publish_end("r", "error", {"x": 1}, producer_token=token)
    assert (again.id, again.deduplicated) == (first.id, True)
    with pytest.raises(StreamEnded):
        await bridge.publish("r", "e", 1, producer_token=token)
    with pytest.raises(ProducerFenced):  # the token check comes before the END check
        await bridge.publish("r", "e", 1, producer_token="wrong")
    with pytest.raises(StreamEnded):
        await bridge.claim("r", takeover=True)
    items = await drain(bridge.subscribe("r"))
    assert items[-1] == End("success", None, first.id)
    # The record remembers the END after the log is gone: still no second END.
    await bridge.cleanup("r")
    assert await bridge.publish_end("r", "error", producer_token=token) == again


async def test_recovery_end_is_a_noop_on_a_missing_run_and_needs_an_expired_lease() -> None:
    clock = FakeClock()
    bridge = make(clock)
    res = await bridge.publish_end("ghost", "producer_lost", producer_token=None)
    assert (res.id, res.deduplicated) == (None, False)
    assert await bridge.get_run("ghost") is None and not await bridge.stream_exists("ghost")

    await started(bridge, "r", 1)
    with pytest.raises(ProducerFenced):
        await bridge.publish_end("r", "producer_lost", producer_token=None)
    clock.now += 3600
    res = await bridge.publish_end("r", "producer_lost", producer_token=None)
    assert res.id is not None and not res.deduplicated
    info = await bridge.get_run("r")
    assert info is not None and info.status == "producer_lost"

    # A cleaned-up running run with an expired lease: nothing is recreated.
    await started(bridge, "s", 1)
    await bridge.cleanup("s")
    clock.now += 3600
    res = await bridge.publish_end("s", "producer_lost", producer_token=None)
    assert res.id is None and not await bridge.stream_exists("s")


async def test_payloads_are_detached_at_publish() -> None:
    bridge = make()
    token = (await bridge.claim("r")).token
    data: dict[str, Any] = {"items": [1, 2]}
    await bridge.publish("r", "e", data, producer_token=token)
    error: dict[str, Any] = {"why": "x"}
    await bridge.publish_end("r", "error", error, producer_token=token)
    data["items"].append(3)
    error["why"] = "mutated"
    items = await drain(bridge.subscribe("r"))
    assert isinstance(items[0], StreamEvent) and items[0].value() == {"items": [1, 2]}
    assert isinstance(items[1], End) and items[1].error == {"why": "x"}
    with pytest.raises(InvalidInput):
        await bridge.publish("r2", "e", object(), producer_token=token)


# ---------------------------------------------------------------- retention and cursors


async def test_exact_last_evicted_boundary(bridge: MemoryStreamBridge) -> None:
    token, published = await started(bridge, "r", 5)  # keeps the newest 3
    end = await bridge.publish_end("r", "success", producer_token=token)
    info = await bridge.get_run("r")
    assert info is not None
    assert (info.first_event_id, info.last_event_id, info.retained_events) == (
        published[2],
        published[4],
        3,
    )
    tail = await drain(bridge.subscribe("r", published[1]))  # exactly the last evicted id
    assert ids(tail) == published[2:] and tail[-1] == End("success", None, end.id)
    for older in (published[0], "0-0"):
        gap = await drain(bridge.subscribe("r", older))
        assert gap == [StreamGap(older, published[2], published[4], "trimmed")]
    assert ids(await drain(bridge.subscribe("r", "not-a-cursor"))) == published[2:]
    assert ids(await drain(bridge.subscribe("r", published[3]))) == published[4:]
    far = "99999999999999-0"  # no id the log issued: a gap, whatever follows it
    assert await drain(bridge.subscribe("r", far)) == [
        StreamGap(far, published[2], published[4], "unknown_position")
    ]


async def test_zero_cursor_on_untrimmed_stream_is_a_full_replay() -> None:
    bridge = make(max_events_per_run=10)
    _, published = await started(bridge, "r", 4)
    it = bridge.subscribe("r", "0-0")
    assert [(await nxt(it)).id for _ in range(4)] == published  # type: ignore[union-attr]


async def test_live_reader_overtaken_by_eviction_gets_gap_with_last_delivered_id(
    bridge: MemoryStreamBridge,
) -> None:
    token, published = await started(bridge, "r", 1)
    it = bridge.subscribe("r")
    first = await nxt(it)
    assert isinstance(first, StreamEvent) and first.id == published[0]
    more = (await bridge.publish_many("r", [("e", i) for i in range(5)], producer_token=token)).ids
    assert await nxt(it) == StreamGap(published[0], more[2], more[4], "trimmed")


async def test_burst_reaches_many_parked_readers() -> None:
    bridge = make(max_events_per_run=100)
    token = (await bridge.claim("r")).token
    readers = [bridge.subscribe("r") for _ in range(50)]
    tasks = [await parked(it) for it in readers]
    sent = (await bridge.publish_many("r", [("e", i) for i in range(10)], producer_token=token)).ids
    await bridge.publish_end("r", "success", producer_token=token)
    for it, task in zip(readers, tasks, strict=True):
        first = await result(task)
        assert isinstance(first, StreamEvent)
        assert (first.id, *ids(await drain(it))) == sent


async def test_readers_that_lag_a_fast_producer_are_woken_in_batches_not_per_event() -> None:
    """A producer yielding after every publish shares the loop with 300 readers. If they
    were woken for every event they would take the loop after each publish and the
    producer would crawl; they are woken less often and take everything since at once."""
    bridge = make(max_events_per_run=10_000)
    token = (await bridge.claim("r")).token
    readers, events = 300, 2_000
    wakeups = [0] * readers
    received: list[list[str]] = [[] for _ in range(readers)]

    async def reader(i: int) -> None:
        async for batch in bridge.subscribe_batches("r"):
            wakeups[i] += 1
            received[i] += ids(list(batch))
            if isinstance(batch[-1], End):
                return

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for i in range(readers):
                tg.start_soon(reader, i)
            sent: list[str] = []
            for i in range(events):
                sent += (await bridge.publish("r", "e", i, producer_token=token)).ids
                await asyncio.sleep(0)  # a streaming producer yields after each event
            await bridge.publish_end("r", "success", producer_token=token)
    assert all(got == sent for got in received)
    assert max(wakeups) <= events // 4, sorted(wakeups)[-5:]


# ---------------------------------------------------------------- heartbeats


async def test_heartbeat_default_from_settings() -> None:
    bridge = make(heartbeat_interval_seconds=0.05)
    it = bridge.subscribe("never-created")  # unknown run: waits and heartbeats
    assert await nxt(it) is HEARTBEAT
    assert await nxt(it) is HEARTBEAT


async def test_heartbeat_argument_overrides_default() -> None:
    bridge = make(heartbeat_interval_seconds=60)
    await started(bridge, "r")  # claimed, never published
    assert await nxt(bridge.subscribe("r", heartbeat_interval=0.05)) is HEARTBEAT
    quiet = bridge.subscribe("r")
    with anyio.move_on_after(0.2) as scope:
        await anext(quiet)
    assert scope.cancelled_caught
    with pytest.raises(InvalidInput):
        bridge.subscribe("r", heartbeat_interval=0)


# ---------------------------------------------------------------- generations


async def test_cleanup_wakes_a_tailing_reader_with_an_empty_gap(bridge: MemoryStreamBridge) -> None:
    _, published = await started(bridge, "r", 1)
    it = bridge.subscribe("r")
    assert (await nxt(it)).id == published[0]  # type: ignore[union-attr]
    task = await parked(it)
    await bridge.cleanup("r")
    assert await result(task) == removed_after(published[0])
    assert not await bridge.stream_exists("r")


async def test_cleanup_mid_replay_gives_gap_but_a_fully_consumed_ended_run_gives_end() -> None:
    """A reader takes up to `READ_BATCH` events per read, as on Redis: one mid-replay
    when the log goes gets the rest of what it read, then a gap; one that read the whole
    ended log gets its END."""
    bridge = make()
    claim = await bridge.claim("r")
    batch = [("tick", {"i": i}) for i in range(READ_BATCH + 3)]
    published = list((await bridge.publish_many("r", batch, producer_token=claim.token)).ids)
    end = await bridge.publish_end("r", "success", producer_token=claim.token)
    midway = bridge.subscribe("r")
    await nxt(midway)
    done = bridge.subscribe("r")
    for _ in range(len(published)):
        await nxt(done)  # consumed every event, END not yet read
    await bridge.cleanup("r")
    rest = await drain(midway)
    assert [item.id for item in rest[:-1]] == published[1:READ_BATCH]  # type: ignore[union-attr]
    assert rest[-1] == removed_after(published[READ_BATCH - 1])
    assert await nxt(done) == End("success", None, end.id)


async def test_reader_that_captured_a_retired_generation_gets_a_gap() -> None:
    bridge = make()
    token, published = await started(bridge, "r", 2)
    end = await bridge.publish_end("r", "success", producer_token=token)
    cursorless = bridge.subscribe("r")  # captured, not yet read
    at_end = bridge.subscribe("r", published[-1])
    await bridge.cleanup("r")
    assert await drain(cursorless) == [REMOVED]
    # A cursor at the last event missed nothing: it learns how the run ended (as on Redis).
    assert await drain(at_end) == [End("success", None, end.id)]
    # A reader arriving after the log is gone learns how the run ended from its record.
    assert await drain(bridge.subscribe("r")) == [End("success", None, end.id)]


async def test_readers_never_attach_to_a_recreated_stream(bridge: MemoryStreamBridge) -> None:
    token, published = await started(bridge, "r", 1)
    old = bridge.subscribe("r")
    await nxt(old)
    task = await parked(old)
    await bridge.cleanup("r")
    new_ids = (await bridge.publish("r", "e", "new", producer_token=token)).ids
    assert await result(task) == removed_after(published[0])
    fresh = bridge.subscribe("r")
    item = await nxt(fresh)
    assert isinstance(item, StreamEvent) and item.id == new_ids[0] and item.value() == "new"
    info = await bridge.get_run("r")
    assert info is not None and info.first_event_id == new_ids[0] and info.retained_events == 1


async def test_reader_of_unknown_run_attaches_to_its_first_generation() -> None:
    bridge = make()
    it = bridge.subscribe("later")
    task = await parked(it)
    token, published = await started(bridge, "later", 1)
    first = await result(task)
    assert isinstance(first, StreamEvent) and first.id == published[0]
    await bridge.publish_end("later", "success", producer_token=token)
    assert isinstance(await nxt(it), End)


async def test_delayed_cleanup_runs_on_a_timer() -> None:
    bridge = make()
    _, published = await started(bridge, "r", 1)
    it = bridge.subscribe("r")
    await nxt(it)
    task = await parked(it)
    await bridge.cleanup("r", delay=0.05)
    assert await bridge.stream_exists("r") and not task.done()
    assert await result(task) == removed_after(published[0])
    assert not await bridge.stream_exists("r")
    # A pending delayed cleanup is cancelled by close, not left to fire later.
    await started(bridge, "s", 1)
    await bridge.cleanup("s", delay=0.01)
    await bridge.close()


async def test_ended_log_is_removed_after_ended_ttl_and_its_record_kept() -> None:
    bridge = make(ended_ttl_seconds=0.05)
    token, _ = await started(bridge, "r", 1)
    await bridge.publish_end("r", "success", producer_token=token)
    assert await bridge.stream_exists("r")
    await asyncio.sleep(0.2)  # the TTL itself is under test
    assert not await bridge.stream_exists("r")
    # As on Redis, the record outlives the log (at least the rolling TTL): how it ended.
    info = await bridge.get_run("r")
    assert info is not None and info.status == "success" and not info.log_exists


# ---------------------------------------------------------------- the reader's last word


async def until_expired(bridge: MemoryStreamBridge, run: str) -> None:
    """Until the run's TTL (under test) removed it whole."""
    with anyio.fail_after(5):
        while await bridge.get_run(run) is not None:
            await asyncio.sleep(0.02)


@pytest.mark.timeout(10)
async def test_a_reader_placed_at_the_last_event_by_its_cursor_gets_end_on_close() -> None:
    """It had every event (its cursor says so, nothing was delivered): the END that lands
    with the close is its last word, not a `bridge_closed` gap."""
    bridge = make()
    token, published = await started(bridge, "r", 2)
    task = await parked(bridge.subscribe("r", published[-1]))
    end = await bridge.publish_end("r", "success", producer_token=token)
    await bridge.close()
    assert await result(task) == End("success", None, end.id)


@pytest.mark.timeout(10)
async def test_an_old_cursor_on_a_log_of_only_an_end_gets_a_gap_on_close() -> None:
    """Events, a removal, then the END alone in a new log: a reader with a cursor before
    the removal point missed events, so on close it gets a gap, never that END."""
    bridge = make()
    token, published = await started(bridge, "r", 3)
    await bridge.cleanup("r")
    await bridge.publish_end("r", "success", producer_token=token)
    it = bridge.subscribe("r", published[0])
    await bridge.close()
    assert await drain(it) == [removed_after(published[0], "bridge_closed")]


@pytest.mark.timeout(10)
async def test_an_old_cursor_on_a_log_of_only_an_end_gets_a_gap_when_the_run_expires() -> None:
    bridge = make(stream_ttl_seconds=0.2, ended_ttl_seconds=0.2)
    token, published = await started(bridge, "r", 3)
    await bridge.cleanup("r")
    await bridge.publish_end("r", "success", producer_token=token)
    it = bridge.subscribe("r", published[0])  # captures the END-only log
    await until_expired(bridge, "r")
    assert await drain(it) == [removed_after(published[0])]


@pytest.mark.timeout(10)
async def test_readers_waiting_for_a_first_log_keep_waiting_after_the_run_expires() -> None:
    """Readers that came before the producer wait on one shared registration; when the
    run expires unwritten they are woken, register afresh and wait on (heartbeats), rather
    than waking at once forever on the spent one (which blocked the event loop)."""
    bridge = make(stream_ttl_seconds=0.2, heartbeat_interval_seconds=0.3)
    readers = [bridge.subscribe("later") for _ in range(2)]
    tasks = [await parked(it) for it in readers]
    await bridge.claim("later")  # nothing published: they stay parked
    await until_expired(bridge, "later")
    for task in tasks:
        assert await result(task) == HEARTBEAT
    await bridge.close()


# ---------------------------------------------------------------- close


async def test_close_wakes_readers_and_refuses_everything_after() -> None:
    bridge = make()
    token, published = await started(bridge, "r", 1)
    tailing = bridge.subscribe("r")
    await nxt(tailing)
    tailing_task = await parked(tailing)
    waiting = bridge.subscribe("unknown")
    waiting_task = await parked(waiting)
    token2, _ = await started(bridge, "done", 1)
    end = await bridge.publish_end("done", "success", producer_token=token2)
    consumed = bridge.subscribe("done")
    await nxt(consumed)

    await bridge.close()
    assert await result(tailing_task) == removed_after(published[0], "bridge_closed")
    assert await result(waiting_task) == CLOSED
    assert await nxt(consumed) == End("success", None, end.id)
    assert await drain(bridge.subscribe("r")) == [CLOSED]
    for call in (
        bridge.claim("x"),
        bridge.publish("r", "e", 1, producer_token=token),
        bridge.publish_end("r", "success", producer_token=token),
        bridge.get_run("r"),
        bridge.stream_exists("r"),
        bridge.cleanup("r"),
        bridge.request_cancel("r"),
        bridge.ping(),
    ):
        with pytest.raises(BridgeClosed):
            await call
    await bridge.close()  # idempotent


async def test_cancel_flag_is_reported_to_the_producer() -> None:
    bridge = make()
    token, _ = await started(bridge, "r")
    assert not await bridge.request_cancel("nope")
    assert await bridge.request_cancel("r")
    assert (await bridge.publish("r", "e", 1, producer_token=token)).cancel_requested
    assert (await bridge.renew_lease("r", producer_token=token)).cancel_requested
