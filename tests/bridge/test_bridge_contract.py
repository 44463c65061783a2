"""The stream-bridge contract suite (docs/protocol.md §1-2), run against both backends.

Written from the contract, not from the implementations: every test here is a sentence
of docs/protocol.md §2 (or of the `StreamBridge` docstrings) made executable. The `make_bridge`
fixture (tests/conftest.py) parametrizes every test over "memory" and "redis"; the
Redis-only tests at the end skip on memory.

Conventions
- every test is bounded by `anyio.fail_after`, so a reader that never ends fails
  instead of hanging the suite;
- trimming is forced with a small `max_events_per_run` and a bulk of events large
  enough to trim on Redis even if it trimmed approximately; expected ids are computed
  from what `get_run` reports as the exact first retained id;
- readers are synchronised with the tail by waiting for their first HEARTBEAT (a reader
  that heartbeats is idle at the tail), never by a blind sleep.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any
from uuid import uuid4

import anyio
import pytest

from gateway.bridge.base import StreamBridge, close_subscription
from gateway.cursor import parse_cursor
from gateway.errors import BridgeClosed, InvalidInput, ProducerFenced, RunOwned, StreamEnded
from gateway.values import (
    Claim,
    End,
    Heartbeat,
    StreamEvent,
    StreamGap,
    StreamItem,
)

pytestmark = pytest.mark.anyio

BridgeFactory = Callable[..., contextlib.AbstractAsyncContextManager[StreamBridge]]

TIMEOUT = 15.0  # per-test bound (seconds)
MAX = 5  # max_events_per_run used to force trimming
BULK = 250  # enough events to trim even with approximate (node-sized) trimming
TOK = "tok"


# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------


def new_run_id() -> str:
    return f"run-{uuid4().hex[:12]}"


def key(event_id: str) -> tuple[int, int]:
    return parse_cursor(event_id)


def is_hb(item: object) -> bool:
    return isinstance(item, Heartbeat)


def is_terminal(item: object) -> bool:
    return isinstance(item, End | StreamGap)


@contextlib.asynccontextmanager
async def subscription(
    bridge: StreamBridge,
    run_id: str,
    last_event_id: str | None = None,
    heartbeat_interval: float | None = None,
) -> AsyncIterator[AsyncIterator[StreamItem]]:
    it = bridge.subscribe(run_id, last_event_id, heartbeat_interval=heartbeat_interval)
    try:
        yield it
    finally:
        await close_subscription(it)


async def next_item(it: AsyncIterator[StreamItem], *, heartbeats: bool = False) -> StreamItem:
    """The next item (skipping heartbeats unless asked for)."""
    while True:
        item = await anext(it)
        if heartbeats or not is_hb(item):
            return item


async def assert_ended(it: AsyncIterator[StreamItem]) -> None:
    """After End or StreamGap the subscription ends: no further item, no hang."""
    with pytest.raises(StopAsyncIteration):
        extra = await anext(it)
        raise AssertionError(f"item after the terminal item: {extra!r}")


async def drain(it: AsyncIterator[StreamItem]) -> list[StreamItem]:
    """Every non-heartbeat item up to and including the terminal one; checks the end."""
    out: list[StreamItem] = []
    while True:
        try:
            item = await next_item(it)
        except StopAsyncIteration:
            raise AssertionError(f"ended without End/StreamGap after {out!r}") from None
        out.append(item)
        if is_terminal(item):
            await assert_ended(it)
            return out


async def read_all(
    bridge: StreamBridge,
    run_id: str,
    last_event_id: str | None = None,
    heartbeat_interval: float | None = None,
) -> list[StreamItem]:
    async with subscription(bridge, run_id, last_event_id, heartbeat_interval) as it:
        return await drain(it)


async def wait_heartbeat(it: AsyncIterator[StreamItem]) -> None:
    """Wait until the reader is idle at the tail (it yields a heartbeat)."""
    item = await anext(it)
    assert is_hb(item), f"expected the reader to be idle at the tail, got {item!r}"


def events(items: Sequence[StreamItem]) -> list[StreamEvent]:
    return [i for i in items if isinstance(i, StreamEvent)]


def event_ids(items: Sequence[StreamItem]) -> list[str]:
    return [e.id for e in events(items)]


def only_end(items: Sequence[StreamItem]) -> End:
    ends = [i for i in items if isinstance(i, End)]
    assert len(ends) == 1 and items[-1] is ends[0], items
    assert not any(isinstance(i, StreamGap) for i in items), items
    return ends[0]


def only_gap(items: Sequence[StreamItem]) -> StreamGap:
    gaps = [i for i in items if isinstance(i, StreamGap)]
    assert len(gaps) == 1 and items[-1] is gaps[0], items
    assert not any(isinstance(i, End) for i in items), items
    return gaps[0]


async def new_run(
    bridge: StreamBridge, n: int = 0, *, run_id: str | None = None, **claim_kw: Any
) -> tuple[str, Claim, list[str]]:
    """Claim a fresh run and publish `n` events `tok {"i": i}` one by one."""
    run_id = run_id or new_run_id()
    claim = await bridge.claim(run_id, **claim_kw)
    ids = [
        (await bridge.publish(run_id, TOK, {"i": i}, producer_token=claim.token)).ids[0]
        for i in range(n)
    ]
    return run_id, claim, ids


async def bulk(
    bridge: StreamBridge, run_id: str, claim: Claim, n: int, start: int = 0
) -> list[str]:
    ids: list[str] = []
    for lo in range(start, start + n, 50):
        hi = min(lo + 50, start + n)
        result = await bridge.publish_many(
            run_id, [(TOK, {"i": i}) for i in range(lo, hi)], producer_token=claim.token
        )
        ids += result.ids
    return ids


async def trimmed_run(
    bridge: StreamBridge, *, end: bool = False
) -> tuple[str, Claim, list[str], int]:
    """A run whose first events were trimmed. Returns (run, claim, ids, first_retained_index)."""
    run_id, claim, _ = await new_run(bridge)
    ids = await bulk(bridge, run_id, claim, BULK)
    if end:
        await bridge.publish_end(run_id, "success", producer_token=claim.token)
    info = await bridge.get_run(run_id)
    assert info is not None and info.first_event_id is not None
    idx = ids.index(info.first_event_id)
    assert idx >= 2, f"expected trimming with max_events_per_run={MAX}: first retained #{idx}"
    return run_id, claim, ids, idx


async def wait_lease_expired(
    bridge: StreamBridge, run_id: str, claim: Claim, deadline: float = 5.0
) -> None:
    """Deadline loop until the lease is over (by the bridge's own clock and record)."""
    with anyio.fail_after(deadline):
        while time.time() <= claim.lease_expires_at + 0.05:
            await anyio.sleep(0.02)
        while True:
            info = await bridge.get_run(run_id)
            assert info is not None
            if info.lease_expires_at <= time.time():
                return
            await anyio.sleep(0.02)


async def recovery_end_when_expired(
    bridge: StreamBridge, run_id: str, deadline: float = 5.0
) -> Any:
    with anyio.fail_after(deadline):
        while True:
            try:
                return await bridge.publish_end(run_id, "producer_lost", producer_token=None)
            except ProducerFenced:
                await anyio.sleep(0.02)


# ---------------------------------------------------------------------------------------
# fixtures local to this module
# ---------------------------------------------------------------------------------------


@pytest.fixture
def backend(make_bridge: Any) -> str:
    return str(make_bridge.backend)


@pytest.fixture
def redis_only(backend: str) -> None:
    if backend != "redis":
        pytest.skip("Redis-only contract")


@pytest.fixture
async def small(make_bridge: BridgeFactory) -> AsyncIterator[StreamBridge]:
    """A bridge with max_events_per_run=MAX, to force trimming."""
    async with make_bridge(max_events_per_run=MAX) as b:
        yield b


# ---------------------------------------------------------------------------------------
# 2.2 cursors: none / retained / exact boundary / older / 0-0 / newer / malformed
# ---------------------------------------------------------------------------------------


async def test_no_cursor_replays_everything_then_follows_live(bridge: StreamBridge) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, claim, ids = await new_run(bridge, 3)
        async with subscription(bridge, run_id, heartbeat_interval=0.2) as it:
            replay = [await next_item(it) for _ in range(3)]
            assert event_ids(replay) == ids
            assert [e.value() for e in events(replay)] == [{"i": 0}, {"i": 1}, {"i": 2}]
            assert all(e.event == TOK for e in events(replay))
            await wait_heartbeat(it)  # idle at the tail
            live = await bridge.publish(run_id, "live", {"x": 1}, producer_token=claim.token)
            item = await next_item(it)
            assert isinstance(item, StreamEvent)
            assert (item.id, item.event, item.value()) == (live.ids[0], "live", {"x": 1})
            end = await bridge.publish_end(run_id, "success", producer_token=claim.token)
            rest = await drain(it)
            assert only_end(rest).status == "success"
            assert end.deduplicated is False and end.id is not None


async def test_valid_retained_cursor_resumes_right_after_it(bridge: StreamBridge) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, claim, ids = await new_run(bridge, 5)
        async with subscription(bridge, run_id, ids[1], heartbeat_interval=0.2) as it:
            got = [await next_item(it) for _ in range(3)]
            assert event_ids(got) == ids[2:]
            await wait_heartbeat(it)
            live = await bridge.publish(run_id, TOK, {"i": 5}, producer_token=claim.token)
            item = await next_item(it)
            assert isinstance(item, StreamEvent) and item.id == live.ids[0]
        await bridge.publish_end(run_id, "success", producer_token=claim.token)
        items = await read_all(bridge, run_id, ids[3])
        assert event_ids(items) == [ids[4], live.ids[0]]
        assert only_end(items).status == "success"
        # resuming from the very last event of an ended run: just END
        items = await read_all(bridge, run_id, live.ids[0])
        assert only_end(items).status == "success" and not events(items)


async def test_every_event_of_a_run_has_a_strictly_increasing_id(bridge: StreamBridge) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, claim, ids = await new_run(bridge, 20)
        ids += (
            await bridge.publish_many(
                run_id, [(TOK, {"i": i}) for i in range(20, 40)], producer_token=claim.token
            )
        ).ids
        ids += (await bridge.publish(run_id, TOK, {"i": 40}, producer_token=claim.token)).ids
        keys = [key(i) for i in ids]  # every id parses as a valid cursor
        assert all(a < b for a, b in itertools.pairwise(keys))
        assert len(set(ids)) == 41


@pytest.mark.parametrize("ended", [False, True], ids=["active", "ended"])
async def test_cursor_exactly_last_trimmed_id_replays_successors_without_gap(
    small: StreamBridge, ended: bool
) -> None:
    bridge = small
    with anyio.fail_after(TIMEOUT):
        run_id, claim, ids, idx = await trimmed_run(bridge, end=ended)
        boundary = ids[idx - 1]  # the exact last trimmed id
        if ended:
            items = await read_all(bridge, run_id, boundary)
            assert event_ids(items) == ids[idx:]
            assert only_end(items).status == "success"
            return
        async with subscription(bridge, run_id, boundary, heartbeat_interval=0.2) as it:
            got = [await next_item(it) for _ in range(len(ids) - idx)]
            assert event_ids(got) == ids[idx:]  # no gap, nothing missing
            await wait_heartbeat(it)
            live = await bridge.publish(run_id, TOK, {"i": -1}, producer_token=claim.token)
            item = await next_item(it)
            assert isinstance(item, StreamEvent) and item.id == live.ids[0]


@pytest.mark.parametrize("ended", [False, True], ids=["active", "ended"])
@pytest.mark.parametrize("which", ["before-boundary", "first-ever", "zero"])
async def test_cursor_older_than_last_trimmed_gets_trimmed_gap(
    small: StreamBridge, which: str, ended: bool
) -> None:
    bridge = small
    with anyio.fail_after(TIMEOUT):
        run_id, _claim, ids, idx = await trimmed_run(bridge, end=ended)
        cursor = {"before-boundary": ids[idx - 2], "first-ever": ids[0], "zero": "0-0"}[which]
        info = await bridge.get_run(run_id)
        assert info is not None
        items = await read_all(bridge, run_id, cursor)  # drain() also checks the end
        assert items == [items[-1]], f"a gap must not follow a partial replay: {items!r}"
        gap = only_gap(items)
        assert gap.reason == "trimmed"
        assert gap.requested_event_id == cursor
        assert gap.earliest_available_event_id == ids[idx] == info.first_event_id
        if ended:
            # the retained window ends with the last event (or with the END entry)
            assert gap.latest_available_event_id is not None
            assert key(gap.latest_available_event_id) >= key(ids[-1])
        else:
            assert gap.latest_available_event_id == ids[-1]


async def test_zero_cursor_on_never_trimmed_stream_replays_everything(bridge: StreamBridge) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, claim, ids = await new_run(bridge, 4)
        await bridge.publish_end(run_id, "success", producer_token=claim.token)
        items = await read_all(bridge, run_id, "0-0")
        assert event_ids(items) == ids
        assert only_end(items).status == "success"


async def test_zero_cursor_on_small_bridge_before_trimming_replays_everything(
    small: StreamBridge,
) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, claim, ids = await new_run(small, MAX)  # exactly full, nothing trimmed yet
        await small.publish_end(run_id, "success", producer_token=claim.token)
        info = await small.get_run(run_id)
        assert info is not None
        if info.first_event_id == ids[0]:  # the END entry did not push anything out
            items = await read_all(small, run_id, "0-0")
            assert event_ids(items) == ids
            assert only_end(items).status == "success"


def unknown(cursor: str, first: str | None, last: str | None) -> StreamGap:
    return StreamGap(cursor, first, last, "unknown_position")


async def test_cursor_newer_than_newest_is_a_gap_never_a_wait(bridge: StreamBridge) -> None:
    """No log hands out an id above its newest: such a cursor was issued by a log that
    went backwards (a failover, a restart) and is a gap, not a wait at the tail."""
    with anyio.fail_after(TIMEOUT):
        run_id, _, ids = await new_run(bridge, 3)
        ms, seq = key(ids[-1])
        cursor = f"{ms}-{seq + 1}"
        assert await read_all(bridge, run_id, cursor) == [unknown(cursor, ids[0], ids[-1])]


async def test_cursor_newer_than_newest_of_ended_run_is_a_gap(bridge: StreamBridge) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, claim, ids = await new_run(bridge, 3)
        end = await bridge.publish_end(run_id, "cancelled", producer_token=claim.token)
        assert end.id is not None
        for cursor in ("99999999999999-0", f"{key(ids[-1])[0]}-{key(ids[-1])[1] + 1}"):
            if key(cursor) == key(end.id):
                continue  # (the END's own id is a position of the log)
            assert await read_all(bridge, run_id, cursor) == [unknown(cursor, ids[0], ids[-1])]


async def test_a_cursor_absent_from_the_log_above_its_floor_is_a_gap(bridge: StreamBridge) -> None:
    """Between two ids of the log, below its first entry (never trimmed): not an id it
    issued, so nothing vouches for what follows it. 0-0 needs no vouching."""
    with anyio.fail_after(TIMEOUT):
        run_id, claim, ids = await new_run(bridge, 3)
        await bridge.publish_end(run_id, "success", producer_token=claim.token)
        (ms0, _), (ms1, seq1) = key(ids[0]), key(ids[1])
        between: str | None = f"{ms1}-{seq1 - 1}" if seq1 > 0 else f"{ms1 - 1}-999"
        if between is not None and key(between) <= key(ids[0]):
            between = None  # no id fits between them: the second case still applies
        below = f"{ms0 - 1}-0"
        for cursor in filter(None, (between, below)):
            assert await read_all(bridge, run_id, cursor) == [unknown(cursor, ids[0], ids[-1])]
        assert event_ids(await read_all(bridge, run_id, "0-0")) == ids
        assert event_ids(await read_all(bridge, run_id, ids[0])) == ids[1:]


MALFORMED_CURSORS = [
    pytest.param("abc", id="letters"),
    pytest.param("", id="empty"),
    pytest.param("1-2-3", id="three-parts"),
    pytest.param("١٢-3", id="arabic-digits"),
    pytest.param("+1-2", id="sign"),
    pytest.param(" 1-2", id="space"),
    pytest.param("18446744073709551616-0", id="overflow"),
    pytest.param("$", id="dollar"),
]


@pytest.mark.parametrize("cursor", MALFORMED_CURSORS)
async def test_malformed_cursor_on_active_stream(
    bridge: StreamBridge, backend: str, cursor: str
) -> None:
    """memory: replay retained events (no gap); redis: live tail only."""
    with anyio.fail_after(TIMEOUT):
        run_id, claim, ids = await new_run(bridge, 3)
        async with subscription(bridge, run_id, cursor, heartbeat_interval=0.2) as it:
            if backend == "memory":
                got = [await next_item(it) for _ in ids]
                assert event_ids(got) == ids
            await wait_heartbeat(it)  # redis: nothing replayed, idle at the tail
            live = await bridge.publish(run_id, TOK, {"i": 3}, producer_token=claim.token)
            item = await next_item(it)
            assert isinstance(item, StreamEvent) and item.id == live.ids[0]
            await bridge.publish_end(run_id, "success", producer_token=claim.token)
            assert only_end(await drain(it)).status == "success"


@pytest.mark.parametrize("cursor", MALFORMED_CURSORS)
async def test_malformed_cursor_on_ended_stream_replays_through_end(
    bridge: StreamBridge, cursor: str
) -> None:
    """Both backends: an ended stream is replayed with all retained events, then END."""
    with anyio.fail_after(TIMEOUT):
        run_id, claim, ids = await new_run(bridge, 3)
        await bridge.publish_end(run_id, "error", {"message": "boom"}, producer_token=claim.token)
        items = await read_all(bridge, run_id, cursor)
        assert event_ids(items) == ids
        end = only_end(items)
        assert end.status == "error" and end.error == {"message": "boom"}


async def test_malformed_cursor_on_trimmed_stream_never_gaps(small: StreamBridge) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, _claim, ids, idx = await trimmed_run(small, end=True)
        items = await read_all(small, run_id, "garbage")
        assert event_ids(items) == ids[idx:]
        assert only_end(items).status == "success"


# ---------------------------------------------------------------------------------------
# 2.3 live readers falling behind
# ---------------------------------------------------------------------------------------


async def test_live_reader_falling_behind_the_window_gets_a_gap(small: StreamBridge) -> None:
    bridge = small
    with anyio.fail_after(TIMEOUT):
        run_id, claim, ids = await new_run(bridge, 3)
        async with subscription(bridge, run_id) as it:
            first = await next_item(it)
            assert isinstance(first, StreamEvent) and first.id == ids[0]
            # the reader holds its item without iterating while the producer races ahead
            ids += await bulk(bridge, run_id, claim, BULK, start=3)
            rest = await drain(it)
        # whatever was still delivered is a contiguous continuation, never a skip
        delivered = [ids[0], *event_ids(rest)]
        assert delivered == ids[: len(delivered)], "silent skip"
        gap = only_gap(rest)
        assert gap.reason == "trimmed"
        assert gap.requested_event_id == delivered[-1]
        info = await bridge.get_run(run_id)
        assert info is not None
        assert gap.earliest_available_event_id == info.first_event_id
        assert gap.latest_available_event_id == ids[-1]
        # the gap was justified: the reader's successor is no longer retained
        assert ids.index(gap.earliest_available_event_id) > ids.index(delivered[-1]) + 1


async def test_reader_resuming_from_gap_bound_gets_the_rest(small: StreamBridge) -> None:
    """The client rejoins with Last-Event-ID = latest_available_event_id (docs/protocol.md §4)."""
    with anyio.fail_after(TIMEOUT):
        run_id, claim, ids, _ = await trimmed_run(small)
        gap = only_gap(await read_all(small, run_id, ids[0]))
        assert gap.latest_available_event_id == ids[-1]
        await small.publish(run_id, TOK, {"i": "after"}, producer_token=claim.token)
        await small.publish_end(run_id, "success", producer_token=claim.token)
        items = await read_all(small, run_id, gap.latest_available_event_id)
        assert [e.value() for e in events(items)] == [{"i": "after"}]
        only_end(items)


# ---------------------------------------------------------------------------------------
# 1 / 2 producer lease, fencing, END
# ---------------------------------------------------------------------------------------


async def test_claim_of_a_live_lease_is_refused(bridge: StreamBridge) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, claim, _ = await new_run(bridge, 1, lease_seconds=30)
        with pytest.raises(RunOwned):
            await bridge.claim(run_id)
        # the holder is not disturbed
        await bridge.publish(run_id, TOK, {}, producer_token=claim.token)


async def test_takeover_fences_the_old_producer(bridge: StreamBridge) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, old, ids = await new_run(bridge, 2, lease_seconds=30)
        new = await bridge.claim(run_id, takeover=True)
        assert new.epoch == old.epoch + 1
        assert new.token != old.token
        before = await bridge.get_run(run_id)
        assert before is not None and before.epoch == new.epoch
        with pytest.raises(ProducerFenced):
            await bridge.publish(run_id, TOK, {"stale": 1}, producer_token=old.token)
        with pytest.raises(ProducerFenced):
            await bridge.publish_many(run_id, [(TOK, {"stale": 2})], producer_token=old.token)
        with pytest.raises(ProducerFenced):
            await bridge.publish_end(run_id, "success", producer_token=old.token)
        with pytest.raises(ProducerFenced):
            await bridge.renew_lease(run_id, producer_token=old.token)
        after = await bridge.get_run(run_id)
        assert after is not None
        assert (after.last_event_id, after.retained_events, after.status) == (
            before.last_event_id,
            before.retained_events,
            "running",
        )
        res = await bridge.publish(run_id, TOK, {"new": 1}, producer_token=new.token)
        await bridge.publish_end(run_id, "success", producer_token=new.token)
        items = await read_all(bridge, run_id)
        assert event_ids(items) == [*ids, res.ids[0]]  # nothing from the fenced writes
        assert only_end(items).status == "success"


async def test_claim_after_lease_expiry_takes_over_with_next_epoch(bridge: StreamBridge) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, old, ids = await new_run(bridge, 1, lease_seconds=0.6)
        await wait_lease_expired(bridge, run_id, old)
        with pytest.raises(ProducerFenced):  # an expired lease writes nothing either
            await bridge.publish(run_id, TOK, {"late": 1}, producer_token=old.token)
        new = await bridge.claim(run_id)
        assert new.epoch == old.epoch + 1
        with pytest.raises(ProducerFenced):
            await bridge.publish(run_id, TOK, {"late": 2}, producer_token=old.token)
        res = await bridge.publish(run_id, TOK, {"new": 1}, producer_token=new.token)
        await bridge.publish_end(run_id, "success", producer_token=new.token)
        assert event_ids(await read_all(bridge, run_id)) == [*ids, res.ids[0]]


async def test_wrong_token_is_fenced_and_writes_nothing(bridge: StreamBridge) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, claim, ids = await new_run(bridge, 1)
        with pytest.raises(ProducerFenced):
            await bridge.publish(run_id, TOK, {}, producer_token="not-the-token")
        with pytest.raises(ProducerFenced):
            await bridge.publish_end(run_id, "success", producer_token="not-the-token")
        await bridge.publish_end(run_id, "success", producer_token=claim.token)
        assert event_ids(await read_all(bridge, run_id)) == ids


async def test_publish_after_end_is_refused(bridge: StreamBridge) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, claim, ids = await new_run(bridge, 1)
        await bridge.publish_end(run_id, "success", producer_token=claim.token)
        with pytest.raises(StreamEnded):
            await bridge.publish(run_id, TOK, {}, producer_token=claim.token)
        with pytest.raises(StreamEnded):
            await bridge.publish_many(run_id, [(TOK, {})], producer_token=claim.token)
        with pytest.raises(StreamEnded):
            await bridge.claim(run_id)
        with pytest.raises(StreamEnded):
            await bridge.claim(run_id, takeover=True)
        items = await read_all(bridge, run_id)
        assert event_ids(items) == ids
        only_end(items)


async def test_end_is_idempotent(bridge: StreamBridge) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, claim, ids = await new_run(bridge, 2)
        first = await bridge.publish_end(run_id, "success", producer_token=claim.token)
        second = await bridge.publish_end(run_id, "success", producer_token=claim.token)
        third = await bridge.publish_end(run_id, "error", {"m": 1}, producer_token=claim.token)
        assert first.deduplicated is False and first.id is not None
        assert (second.id, second.deduplicated) == (first.id, True)
        assert (third.id, third.deduplicated) == (first.id, True)
        items = await read_all(bridge, run_id)
        assert event_ids(items) == ids
        end = only_end(items)  # exactly one END, the first one
        assert end.status == "success"
        if end.id is not None:
            assert end.id == first.id
        info = await bridge.get_run(run_id)
        assert info is not None and info.status == "success"


async def test_end_from_reader_already_waiting(bridge: StreamBridge) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, claim, _ = await new_run(bridge)
        async with subscription(bridge, run_id, heartbeat_interval=0.2) as it:
            await wait_heartbeat(it)
            await bridge.publish_end(run_id, "interrupted", producer_token=claim.token)
            assert only_end(await drain(it)).status == "interrupted"


async def test_recovery_end_on_missing_stream_is_a_noop(
    bridge: StreamBridge, backend: str, request: pytest.FixtureRequest, key_prefix: str
) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id = new_run_id()
        result = await bridge.publish_end(run_id, "producer_lost", producer_token=None)
        assert result.id is None
        assert await bridge.stream_exists(run_id) is False
        if backend == "redis":
            raw = await _raw_redis(request)
            try:
                assert await raw.keys(key_prefix + "*") == []
            finally:
                await raw.aclose()


async def test_recovery_end_on_claimed_but_unpublished_run_creates_no_stream(
    bridge: StreamBridge, backend: str, request: pytest.FixtureRequest, key_prefix: str
) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, claim, _ = await new_run(bridge, lease_seconds=0.2)
        existed = await bridge.stream_exists(run_id)
        if backend == "redis":
            raw = await _raw_redis(request)
            keys_before = set(await raw.keys(key_prefix + "*"))
        await wait_lease_expired(bridge, run_id, claim)
        if not existed:
            result = await bridge.publish_end(run_id, "producer_lost", producer_token=None)
            assert result.id is None
            assert await bridge.stream_exists(run_id) is False
        if backend == "redis":
            try:
                assert set(await raw.keys(key_prefix + "*")) == keys_before
            finally:
                await raw.aclose()


async def test_recovery_end_while_lease_is_live_is_refused(bridge: StreamBridge) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, claim, _ = await new_run(bridge, 2, lease_seconds=30)
        with pytest.raises(ProducerFenced):
            await bridge.publish_end(run_id, "producer_lost", producer_token=None)
        # nothing written: the producer continues and ends normally
        await bridge.publish(run_id, TOK, {}, producer_token=claim.token)
        await bridge.publish_end(run_id, "success", producer_token=claim.token)
        items = await read_all(bridge, run_id)
        assert len(events(items)) == 3
        assert only_end(items).status == "success"


async def test_recovery_end_after_lease_expiry_ends_the_run(bridge: StreamBridge) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, claim, ids = await new_run(bridge, 2, lease_seconds=0.6)
        async with subscription(bridge, run_id, heartbeat_interval=0.1) as it:
            got = [await next_item(it) for _ in ids]
            assert event_ids(got) == ids
            await wait_lease_expired(bridge, run_id, claim)
            result = await recovery_end_when_expired(bridge, run_id)
            assert result.id is not None and result.deduplicated is False
            end = only_end(await drain(it))
            assert end.status == "producer_lost"
        again = await bridge.publish_end(run_id, "producer_lost", producer_token=None)
        assert (again.id, again.deduplicated) == (result.id, True)
        with pytest.raises((ProducerFenced, StreamEnded)):
            await bridge.publish(run_id, TOK, {}, producer_token=claim.token)
        info = await bridge.get_run(run_id)
        assert info is not None and info.status == "producer_lost"
        items = await read_all(bridge, run_id)
        assert event_ids(items) == ids and only_end(items).status == "producer_lost"


# ---------------------------------------------------------------------------------------
# heartbeats
# ---------------------------------------------------------------------------------------


async def test_heartbeat_default_comes_from_settings(make_bridge: BridgeFactory) -> None:
    async with make_bridge(heartbeat_interval_seconds=0.3) as bridge:
        with anyio.fail_after(TIMEOUT):
            run_id, claim, _ = await new_run(bridge)  # unpublished: keeps heartbeating
            async with subscription(bridge, run_id) as it:
                start = time.monotonic()
                for _ in range(2):
                    assert is_hb(await anext(it))
                elapsed = time.monotonic() - start
                assert 0.45 <= elapsed < 5, elapsed
                res = await bridge.publish(run_id, TOK, {}, producer_token=claim.token)
                item = await next_item(it)
                assert isinstance(item, StreamEvent) and item.id == res.ids[0]
                assert is_hb(await anext(it))  # idle again after the event


async def test_heartbeat_per_call_override_shorter(make_bridge: BridgeFactory) -> None:
    async with make_bridge(heartbeat_interval_seconds=60) as bridge:
        with anyio.fail_after(TIMEOUT):
            run_id, _claim, _ = await new_run(bridge, 1)
            async with subscription(bridge, run_id, heartbeat_interval=0.2) as it:
                assert isinstance(await anext(it), StreamEvent)
                assert is_hb(await anext(it))


async def test_heartbeat_per_call_override_longer(make_bridge: BridgeFactory) -> None:
    async with make_bridge(heartbeat_interval_seconds=0.1) as bridge:
        with anyio.fail_after(TIMEOUT):
            run_id, claim, _ = await new_run(bridge)
            async with subscription(bridge, run_id, heartbeat_interval=60) as it:
                got: list[StreamItem] = []

                async def reader() -> None:
                    got.append(await anext(it))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(reader)
                    await anyio.sleep(1.0)
                    assert got == [], f"override of 60s ignored: {got!r}"
                    res = await bridge.publish(run_id, TOK, {}, producer_token=claim.token)
                assert isinstance(got[0], StreamEvent) and got[0].id == res.ids[0]


async def test_heartbeat_settings_must_be_positive_finite() -> None:
    from pydantic import ValidationError

    from gateway.settings import Settings

    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValidationError):
            Settings(heartbeat_interval_seconds=bad)
    assert Settings().heartbeat_interval_seconds == 15


# ---------------------------------------------------------------------------------------
# publication
# ---------------------------------------------------------------------------------------


async def test_publish_many_returns_one_id_per_event_in_order(bridge: StreamBridge) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, claim, ids = await new_run(bridge, 1)
        batch = [("a", 1), ("b", [1, 2]), ("c", {"k": "v"}), ("d", None), ("e", "s")]
        res = await bridge.publish_many(run_id, batch, producer_token=claim.token)
        assert len(res.ids) == len(batch)
        keys = [key(i) for i in [*ids, *res.ids]]
        assert all(a < b for a, b in itertools.pairwise(keys))
        assert res.cancel_requested is False
        await bridge.publish_end(run_id, "success", producer_token=claim.token)
        items = events(await read_all(bridge, run_id, ids[0]))
        assert [(e.id, e.event, e.value()) for e in items] == [
            (i, name, data) for i, (name, data) in zip(res.ids, batch, strict=True)
        ]


async def test_payload_is_detached_at_publish(bridge: StreamBridge) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, claim, _ = await new_run(bridge)
        one = {"a": [1], "b": {"c": 1}}
        await bridge.publish(run_id, "one", one, producer_token=claim.token)
        one["a"].append(2)
        one["b"]["c"] = 99
        one["new"] = True
        two = {"x": [1]}
        batch = [("two", two)]
        await bridge.publish_many(run_id, batch, producer_token=claim.token)
        two["x"].append(2)
        batch.append(("three", {}))
        await bridge.publish_end(run_id, "success", producer_token=claim.token)
        items = events(await read_all(bridge, run_id))
        assert [(e.event, e.value()) for e in items] == [
            ("one", {"a": [1], "b": {"c": 1}}),
            ("two", {"x": [1]}),
        ]
        # readers get fresh objects too: mutating one reader's value changes nothing
        v = items[0].value()
        v["a"].append(3)
        assert events(await read_all(bridge, run_id))[0].value() == {"a": [1], "b": {"c": 1}}


# ---------------------------------------------------------------------------------------
# cleanup and close
# ---------------------------------------------------------------------------------------


async def test_cleanup_removes_the_log(bridge: StreamBridge) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, claim, _ = await new_run(bridge, 2)
        await bridge.publish_end(run_id, "success", producer_token=claim.token)
        assert await bridge.stream_exists(run_id) is True
        await bridge.cleanup(run_id)
        assert await bridge.stream_exists(run_id) is False
        info = await bridge.get_run(run_id)
        assert info is None or info.log_exists is False


async def test_cleanup_with_delay_removes_later(bridge: StreamBridge) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, _claim, _ = await new_run(bridge, 2)
        async with anyio.create_task_group() as tg:
            tg.start_soon(bridge.cleanup, run_id, 0.6)
            await anyio.sleep(0.1)
            assert await bridge.stream_exists(run_id) is True
        with anyio.fail_after(5):
            while await bridge.stream_exists(run_id):
                await anyio.sleep(0.05)


async def test_cleanup_during_replay_gives_empty_bound_gap(bridge: StreamBridge) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, _claim, ids = await new_run(bridge, 5)
        async with subscription(bridge, run_id, heartbeat_interval=0.2) as it:
            first = await next_item(it)
            assert isinstance(first, StreamEvent) and first.id == ids[0]
            await bridge.cleanup(run_id)
            rest = await drain(it)
        delivered = [ids[0], *event_ids(rest)]
        assert delivered == ids[: len(delivered)], "silent skip"
        gap = only_gap(rest)
        assert gap.reason == "stream_removed"
        assert gap.earliest_available_event_id is None
        assert gap.latest_available_event_id is None
        assert gap.requested_event_id in (delivered[-1], None)
        assert await bridge.stream_exists(run_id) is False


async def test_cleanup_wakes_reader_waiting_at_the_tail(bridge: StreamBridge) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, _claim, ids = await new_run(bridge, 2)
        async with subscription(bridge, run_id, heartbeat_interval=0.2) as it:
            assert event_ids([await next_item(it) for _ in ids]) == ids
            await wait_heartbeat(it)
            await bridge.cleanup(run_id)
            with anyio.fail_after(5):
                gap = only_gap(await drain(it))
        assert gap.reason == "stream_removed"
        assert (gap.earliest_available_event_id, gap.latest_available_event_id) == (None, None)


async def test_memory_cleanup_after_everything_consumed_still_gets_end(
    bridge: StreamBridge, backend: str
) -> None:
    if backend != "memory":
        pytest.skip("docs/protocol.md §2.3 states this for the memory bridge")
    with anyio.fail_after(TIMEOUT):
        run_id, claim, ids = await new_run(bridge, 2)
        await bridge.publish_end(run_id, "success", producer_token=claim.token)
        async with subscription(bridge, run_id) as it:
            assert event_ids([await next_item(it) for _ in ids]) == ids
            await bridge.cleanup(run_id)
            assert only_end(await drain(it)).status == "success"


async def test_memory_reader_never_attaches_to_recreated_stream(
    bridge: StreamBridge, backend: str
) -> None:
    if backend != "memory":
        pytest.skip("docs/protocol.md §2.3 states this for the memory bridge")
    with anyio.fail_after(TIMEOUT):
        run_id, claim, ids = await new_run(bridge, 2)
        async with subscription(bridge, run_id, heartbeat_interval=0.2) as it:
            assert event_ids([await next_item(it) for _ in ids]) == ids
            await wait_heartbeat(it)
            await bridge.cleanup(run_id)
            # a new generation of the same run id: the old reader must not see it
            with contextlib.suppress(ProducerFenced, StreamEnded):
                await bridge.publish(run_id, TOK, {"gen": 2}, producer_token=claim.token)
            gap = only_gap(await drain(it))
            assert gap.reason == "stream_removed"


async def test_close_wakes_every_waiting_reader(make_bridge: BridgeFactory) -> None:
    async with make_bridge() as bridge:
        with anyio.fail_after(TIMEOUT):
            runs = [await new_run(bridge, 1) for _ in range(2)]
            results: dict[int, list[StreamItem]] = {}

            async def reader(n: int, run_id: str, ready: anyio.Event) -> None:
                async with subscription(bridge, run_id, heartbeat_interval=0.2) as it:
                    assert isinstance(await next_item(it), StreamEvent)
                    await wait_heartbeat(it)
                    ready.set()
                    results[n] = await drain(it)

            async with anyio.create_task_group() as tg:
                readies = []
                for n, (run_id, _, _) in enumerate([*runs, runs[0]]):  # two readers on run 0
                    ready = anyio.Event()
                    readies.append(ready)
                    tg.start_soon(reader, n, run_id, ready)
                for ready in readies:
                    await ready.wait()
                with anyio.fail_after(5):  # promptly, not at some far timeout
                    await bridge.close()
                    while len(results) < 3:
                        await anyio.sleep(0.01)
            for n in range(3):
                gap = only_gap(results[n])
                assert gap.reason == "bridge_closed", results[n]


async def test_publish_after_close_raises_bridge_closed(make_bridge: BridgeFactory) -> None:
    async with make_bridge() as bridge:
        with anyio.fail_after(TIMEOUT):
            run_id, claim, _ = await new_run(bridge, 1)
            await bridge.close()
            with pytest.raises(BridgeClosed):
                await bridge.publish(run_id, TOK, {}, producer_token=claim.token)


# ---------------------------------------------------------------------------------------
# run record, cancel, lease renewal
# ---------------------------------------------------------------------------------------


async def test_get_run_reports_the_record(small: StreamBridge, backend: str) -> None:
    bridge = small
    with anyio.fail_after(TIMEOUT):
        assert await bridge.get_run(new_run_id()) is None
        run_id, claim, _ = await new_run(bridge, session_id="sess-1")
        info = await bridge.get_run(run_id)
        assert info is not None
        assert (info.run_id, info.session_id, info.status) == (run_id, "sess-1", "running")
        assert (info.first_event_id, info.last_event_id, info.retained_events) == (None, None, 0)
        assert info.cancel_requested is False and info.epoch == claim.epoch
        assert info.ended is False
        assert abs(info.lease_expires_at - claim.lease_expires_at) < 1
        assert info.created_at <= info.updated_at
        ids = await bulk(bridge, run_id, claim, 3)
        info = await bridge.get_run(run_id)
        assert info is not None
        assert (info.first_event_id, info.last_event_id, info.retained_events) == (
            ids[0],
            ids[-1],
            3,
        )
        ids += await bulk(bridge, run_id, claim, BULK, start=3)
        info = await bridge.get_run(run_id)
        assert info is not None and info.log_exists is True
        assert info.last_event_id == ids[-1]
        if backend == "memory":
            assert info.retained_events == MAX
            assert info.first_event_id == ids[-MAX]
        assert info.retained_events >= MAX
        replay = event_ids(await read_all_until_quiet(bridge, run_id))
        assert replay[0] == info.first_event_id  # exact first retained id
        assert len(replay) == info.retained_events
        assert replay == ids[-len(replay) :]
        end = await bridge.publish_end(run_id, "error", {"code": 7}, producer_token=claim.token)
        info = await bridge.get_run(run_id)
        assert info is not None
        assert info.status == "error" and info.ended is True and info.error == {"code": 7}
        assert info.last_event_id in (ids[-1], end.id)


async def read_all_until_quiet(bridge: StreamBridge, run_id: str) -> list[StreamItem]:
    """Replay an active run from the start until the reader is idle at the tail."""
    out: list[StreamItem] = []
    async with subscription(bridge, run_id, heartbeat_interval=0.3) as it:
        while not is_hb(item := await anext(it)):
            assert not is_terminal(item), item
            out.append(item)
    return out


async def test_request_cancel_is_seen_by_the_producer(bridge: StreamBridge) -> None:
    with anyio.fail_after(TIMEOUT):
        assert await bridge.request_cancel(new_run_id()) is False
        run_id, claim, _ = await new_run(bridge)
        res = await bridge.publish(run_id, TOK, {}, producer_token=claim.token)
        assert res.cancel_requested is False
        lease = await bridge.renew_lease(run_id, producer_token=claim.token)
        assert lease.cancel_requested is False
        assert await bridge.request_cancel(run_id) is True
        res = await bridge.publish(run_id, TOK, {}, producer_token=claim.token)
        assert res.cancel_requested is True
        res = await bridge.publish_many(run_id, [(TOK, {})], producer_token=claim.token)
        assert res.cancel_requested is True
        lease = await bridge.renew_lease(run_id, producer_token=claim.token)
        assert lease.cancel_requested is True
        info = await bridge.get_run(run_id)
        assert info is not None and info.cancel_requested is True
        # cancellation is a request to the producer, not an END
        assert info.status == "running"


async def test_renew_lease_extends_and_is_fenced(bridge: StreamBridge) -> None:
    with anyio.fail_after(TIMEOUT):
        # Leases in these tests leave room for a loaded CI machine between two calls.
        run_id, claim, _ = await new_run(bridge, 1, lease_seconds=1.5)
        lease = await bridge.renew_lease(run_id, producer_token=claim.token, lease_seconds=30)
        assert lease.lease_expires_at > claim.lease_expires_at + 20
        with pytest.raises(RunOwned):
            await bridge.claim(run_id)
        with pytest.raises(ProducerFenced):
            await bridge.renew_lease(run_id, producer_token="nope")
        await anyio.sleep(1.6)  # past the original lease: still owned
        await bridge.publish(run_id, TOK, {}, producer_token=claim.token)
        await bridge.publish_end(run_id, "success", producer_token=claim.token)
        with pytest.raises(StreamEnded):
            await bridge.renew_lease(run_id, producer_token=claim.token)


async def test_publish_renews_the_lease(bridge: StreamBridge) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, claim, _ = await new_run(bridge, lease_seconds=1.5)
        for _ in range(8):  # 2.4 s of activity, well past the lease
            await anyio.sleep(0.3)
            await bridge.publish(run_id, TOK, {}, producer_token=claim.token)
        with pytest.raises(RunOwned):
            await bridge.claim(run_id)
        with pytest.raises(ProducerFenced):
            await bridge.publish_end(run_id, "producer_lost", producer_token=None)


# ---------------------------------------------------------------------------------------
# names, atomic batches, fan-out, extreme cursors, provider teardown
# ---------------------------------------------------------------------------------------

BAD_EVENT_NAMES = ["", "a:b", "has space", "tab\there", "x" * 65, "caf\u00e9", "nl\n"]


async def test_invalid_names_are_refused_and_batches_are_atomic(bridge: StreamBridge) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, claim, ids = await new_run(bridge, 1)
        for name in BAD_EVENT_NAMES:
            with pytest.raises(InvalidInput):
                await bridge.publish(run_id, name, {}, producer_token=claim.token)
            with pytest.raises(InvalidInput):  # one bad event: nothing of the batch written
                await bridge.publish_many(
                    run_id, [(TOK, {"ok": 1}), (name, {})], producer_token=claim.token
                )
        with pytest.raises(InvalidInput):
            await bridge.publish_end(run_id, "done", producer_token=claim.token)  # type: ignore[arg-type]
        for bad_run in ["", "-leading-dash", "a/b", "a b", "x" * 129, "{tag}"]:
            with pytest.raises(InvalidInput):
                await bridge.claim(bad_run)
        ok = await bridge.publish(run_id, "x" * 64, {}, producer_token=claim.token)
        await bridge.publish_end(run_id, "success", producer_token=claim.token)
        items = await read_all(bridge, run_id)
        assert event_ids(items) == [*ids, ok.ids[0]]


async def test_live_fan_out_to_many_readers(bridge: StreamBridge) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, claim, _ = await new_run(bridge)
        results: dict[int, list[StreamItem]] = {}

        async def reader(n: int, ready: anyio.Event) -> None:
            async with subscription(bridge, run_id, heartbeat_interval=0.2) as it:
                await wait_heartbeat(it)
                ready.set()
                results[n] = await drain(it)

        published: list[str] = []
        async with anyio.create_task_group() as tg:
            readies = [anyio.Event() for _ in range(6)]
            for n, ready in enumerate(readies):
                tg.start_soon(reader, n, ready)
            for ready in readies:
                await ready.wait()
            for i in range(40):
                res = await bridge.publish(run_id, TOK, {"i": i}, producer_token=claim.token)
                published += res.ids
                if i % 7 == 0:
                    await anyio.sleep(0.01)  # let readers catch up mid-stream sometimes
            await bridge.publish_end(run_id, "success", producer_token=claim.token)
        for n in range(6):
            assert event_ids(results[n]) == published, n
            assert [e.value() for e in events(results[n])] == [{"i": i} for i in range(40)]
            assert only_end(results[n]).status == "success"


async def read_batches(
    bridge: StreamBridge, run_id: str, last_event_id: str | None = None
) -> list[list[StreamItem]]:
    """Every batch of `subscribe_batches` up to the terminal item, checking their shape."""
    batches: list[list[StreamItem]] = []
    it = bridge.subscribe_batches(run_id, last_event_id, heartbeat_interval=0.2)
    try:
        async for batch in it:
            assert batch, "an empty batch"
            batches.append(list(batch))
            if any(is_terminal(i) for i in batch):
                assert is_terminal(batch[-1]) and not any(is_terminal(i) for i in batch[:-1])
                await assert_ended(it)
                return batches
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            await it.aclose()
    raise AssertionError(f"ended without End/StreamGap after {batches!r}")


def flat(batches: list[list[StreamItem]]) -> list[StreamItem]:
    return [item for batch in batches if not is_hb(batch[0]) for item in batch]


async def test_subscribe_batches_yields_what_subscribe_does_grouped(bridge: StreamBridge) -> None:
    """The same items in the same order; what was ready at once comes as one list."""
    with anyio.fail_after(TIMEOUT):
        run_id, claim, ids = await new_run(bridge)
        ids += await bulk(bridge, run_id, claim, 4)
        live: list[list[StreamItem]] = []

        async def follow(ready: anyio.Event) -> None:
            it = bridge.subscribe_batches(run_id, heartbeat_interval=0.2)
            try:
                async for batch in it:
                    if is_hb(batch[0]):
                        assert len(batch) == 1
                        ready.set()
                        continue
                    live.append(list(batch))
                    if is_terminal(batch[-1]):
                        return
            finally:
                with anyio.CancelScope(shield=True):
                    await it.aclose()

        async with anyio.create_task_group() as tg:
            ready = anyio.Event()
            tg.start_soon(follow, ready)
            await ready.wait()  # replayed the first 4, idle at the tail
            ids += await bulk(bridge, run_id, claim, 3, start=4)  # one publish_many
            await bridge.publish_end(run_id, "success", producer_token=claim.token)
        assert event_ids(flat(live)) == ids
        assert only_end(flat(live)).status == "success"
        assert len(live[0]) == 4  # the replay: everything retained, in one batch
        assert len(live) <= 4  # a batch of 3 cannot be split by the bridge's wake-ups
        replay = await read_batches(bridge, run_id, ids[1])
        assert flat(replay) == (await read_all(bridge, run_id, ids[1]))
        assert len(replay) == 1  # an ended log replays as one batch through END


async def test_subscribe_batches_gap_is_a_batch_of_its_own(small: StreamBridge) -> None:
    bridge = small
    with anyio.fail_after(TIMEOUT):
        run_id, _claim, ids, _first = await trimmed_run(bridge)
        batches = await read_batches(bridge, run_id, ids[0])
        assert len(batches) == 1 and only_gap(batches[0]).reason == "trimmed"


UINT64_MAX_CURSOR = "18446744073709551615-18446744073709551615"


async def test_uint64_max_cursor_is_valid_and_a_gap(bridge: StreamBridge) -> None:
    """The largest id is a valid cursor (no backend error) that no log issued: a gap."""
    with anyio.fail_after(TIMEOUT):
        run_id, claim, ids = await new_run(bridge, 2)
        gap = [unknown(UINT64_MAX_CURSOR, ids[0], ids[-1])]
        assert await read_all(bridge, run_id, UINT64_MAX_CURSOR) == gap
        await bridge.publish_end(run_id, "success", producer_token=claim.token)
        assert await read_all(bridge, run_id, UINT64_MAX_CURSOR) == gap


async def test_provider_teardown_completes_when_cancelled(make_bridge: BridgeFactory) -> None:
    """The task holding the provider context is cancelled: the bridge is still closed and
    a reader (in another task) is woken with a bridge_closed gap."""
    with anyio.fail_after(TIMEOUT):
        holder: list[tuple[StreamBridge, str, Claim]] = []
        opened = anyio.Event()
        torn_down = anyio.Event()
        owner_scope = anyio.CancelScope()

        async def owner() -> None:
            with owner_scope:
                async with make_bridge() as bridge:
                    run_id, claim, _ = await new_run(bridge, 1)
                    holder.append((bridge, run_id, claim))
                    opened.set()
                    await anyio.sleep_forever()
            torn_down.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(owner)
            await opened.wait()
            bridge, run_id, claim = holder[0]
            async with subscription(bridge, run_id, heartbeat_interval=0.2) as it:
                assert isinstance(await next_item(it), StreamEvent)
                await wait_heartbeat(it)
                owner_scope.cancel()  # the surrounding task is cancelled mid-life
                with anyio.fail_after(5):
                    outcome = await drain(it)
            with anyio.fail_after(5):
                await torn_down.wait()
        assert owner_scope.cancelled_caught
        assert only_gap(outcome).reason == "bridge_closed"
        with pytest.raises(BridgeClosed):
            await bridge.publish(run_id, TOK, {}, producer_token=claim.token)


# ---------------------------------------------------------------------------------------
# Redis only
# ---------------------------------------------------------------------------------------


async def _raw_redis(request: pytest.FixtureRequest) -> Any:
    import redis.asyncio as aioredis

    return aioredis.Redis.from_url(request.getfixturevalue("redis_url"))


def _raw_keys(prefix: str, run_id: str) -> tuple[str, str]:
    from gateway.redis.keys import run_keys

    keys = run_keys(prefix, run_id)
    return keys.meta, keys.log


async def _evalsha_calls(raw: Any) -> int:
    stats = await raw.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def test_redis_subscribers_at_one_cursor_share_their_reads(
    bridge: StreamBridge, redis_only: None, request: pytest.FixtureRequest
) -> None:
    """Clients reconnecting together with the same cursor (a deploy, a network blip)
    read the log once between them, and each still gets exactly its events."""
    readers = 50
    with anyio.fail_after(TIMEOUT):
        run_id, claim, _ = await new_run(bridge)
        ids = await bulk(bridge, run_id, claim, 300)
        await bridge.publish_end(run_id, "success", producer_token=claim.token)
        raw = await _raw_redis(request)
        try:
            before = await _evalsha_calls(raw)
            results: list[list[StreamItem]] = []

            async def reader() -> None:
                results.append(await read_all(bridge, run_id, ids[99]))

            async with anyio.create_task_group() as tg:
                for _ in range(readers):
                    tg.start_soon(reader)
            reads = await _evalsha_calls(raw) - before  # read.lua is the only script here
        finally:
            await raw.aclose()
    assert len(results) == readers
    for items in results:
        assert event_ids(items) == ids[100:]
        assert only_end(items).status == "success"
    assert reads < readers // 2, reads  # one read per reader without sharing


@pytest.mark.parametrize("scan", [True, False], ids=["scan-on", "scan-off"])
async def test_redis_legacy_end_scan(
    make_bridge: BridgeFactory,
    redis_only: None,
    request: pytest.FixtureRequest,
    key_prefix: str,
    scan: bool,
) -> None:
    """An unfenced legacy writer left an END mid-stream (followed by events)."""
    async with make_bridge(legacy_end_scan_enabled=scan) as bridge:
        with anyio.fail_after(TIMEOUT):
            run_id, claim, ids = await new_run(bridge, 2)
            _meta, log = _raw_keys(key_prefix, run_id)
            raw = await _raw_redis(request)
            try:
                old_end = (await raw.xadd(log, {"end": "success"})).decode()
                after = [
                    (await raw.xadd(log, {"e": TOK, "d": b'{"legacy":%d}' % i})).decode()
                    for i in range(3)
                ]
                result = await bridge.publish_end(run_id, "error", producer_token=claim.token)
                ends = [eid.decode() for eid, fields in await raw.xrange(log) if b"end" in fields]
            finally:
                await raw.aclose()
            if scan:
                assert (result.id, result.deduplicated) == (old_end, True)
                assert ends == [old_end]  # none added
            else:
                assert result.deduplicated is False
                assert result.id is not None and result.id != old_end
                assert key(result.id) > key(after[-1])
                assert ends == [old_end, result.id]  # tail-only: a new END appended
            # readers act on at most one END: the first one
            items = await read_all(bridge, run_id)
            assert event_ids(items) == ids
            assert only_end(items).status == "success"
            # and the run is over for its producer too, whatever follows that END
            with pytest.raises(StreamEnded):
                await bridge.publish(run_id, "token", {"late": 1}, producer_token=claim.token)


async def test_redis_publish_with_the_legacy_scan_reads_what_follows_last(
    make_bridge: BridgeFactory,
    redis_only: None,
    request: pytest.FixtureRequest,
    key_prefix: str,
) -> None:
    """With the scan on, a publish sees what an unfenced writer appended after the run's
    newest id: its entries (the notification names the newest of them as the id the new
    event follows, so a live reader misses none) and its END (refused)."""
    async with make_bridge(legacy_end_scan_enabled=True) as bridge:
        with anyio.fail_after(TIMEOUT):
            run_id, claim, ids = await new_run(bridge, 2)
            _meta, log = _raw_keys(key_prefix, run_id)
            raw = await _raw_redis(request)
            try:
                async with subscription(bridge, run_id, heartbeat_interval=0.2) as it:
                    assert event_ids([await next_item(it) for _ in ids]) == ids
                    await wait_heartbeat(it)  # at the tail: following the notifications
                    legacy = (await raw.xadd(log, {"e": TOK, "d": b'{"legacy":1}'})).decode()
                    after = await bridge.publish(run_id, TOK, {"n": 3}, producer_token=claim.token)
                    live = [await next_item(it) for _ in range(2)]
                await raw.xadd(log, {"end": "success"})
            finally:
                await raw.aclose()
            with pytest.raises(StreamEnded):
                await bridge.publish(run_id, TOK, {"n": 4}, producer_token=claim.token)
            items = await read_all(bridge, run_id)
    assert event_ids(live) == [legacy, after.ids[0]]
    assert event_ids(items) == [*ids, legacy, after.ids[0]]
    assert only_end(items).status == "success"


async def test_redis_live_reader_stops_at_a_legacy_end_followed_by_entries(
    bridge: StreamBridge, redis_only: None, request: pytest.FixtureRequest, key_prefix: str
) -> None:
    """A reader following the shared window acts on the first END, never on what an
    unfenced legacy writer appended after it."""
    with anyio.fail_after(TIMEOUT):
        run_id, _claim, ids = await new_run(bridge, 2)
        _meta, log = _raw_keys(key_prefix, run_id)
        raw = await _raw_redis(request)
        try:
            async with subscription(bridge, run_id, heartbeat_interval=0.2) as it:
                assert event_ids([await next_item(it) for _ in ids]) == ids
                await wait_heartbeat(it)  # at the tail: reading the shared window
                async with raw.pipeline(transaction=True) as pipe:
                    pipe.xadd(log, {"end": "success"})
                    for i in range(3):
                        pipe.xadd(log, {"e": TOK, "d": b'{"legacy":%d}' % i})
                    pipe.publish(log, "x")  # the change notification the scripts send
                    await pipe.execute()
                rest = await drain(it)
        finally:
            await raw.aclose()
    assert not events(rest) and only_end(rest).status == "success"


async def test_redis_script_flush_then_writes_still_work(
    bridge: StreamBridge, redis_only: None, request: pytest.FixtureRequest
) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, claim, ids = await new_run(bridge, 1)
        raw = await _raw_redis(request)
        try:
            await raw.script_flush()
            ids += (await bridge.publish(run_id, TOK, {"i": 1}, producer_token=claim.token)).ids
            await raw.script_flush()
            ids += (
                await bridge.publish_many(run_id, [(TOK, {"i": 2})], producer_token=claim.token)
            ).ids
            await raw.script_flush()
            await bridge.renew_lease(run_id, producer_token=claim.token)
            await raw.script_flush()
            assert await bridge.request_cancel(run_id) is True
            await raw.script_flush()
            other = await bridge.claim(new_run_id())
            assert other.epoch >= 1
            await raw.script_flush()
            items: list[StreamItem] = []
            async with subscription(bridge, run_id, heartbeat_interval=0.2) as it:
                items += [await next_item(it) for _ in ids]
                await wait_heartbeat(it)
                await raw.script_flush()
                end = await bridge.publish_end(run_id, "success", producer_token=claim.token)
                items += await drain(it)
        finally:
            await raw.aclose()
        assert event_ids(items) == ids
        assert only_end(items).status == "success" and end.deduplicated is False


async def test_redis_stream_deleted_during_replay(
    bridge: StreamBridge, redis_only: None, request: pytest.FixtureRequest, key_prefix: str
) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, _claim, ids = await new_run(bridge, 5)
        raw = await _raw_redis(request)
        try:
            async with subscription(bridge, run_id, heartbeat_interval=0.2) as it:
                first = await next_item(it)
                assert isinstance(first, StreamEvent) and first.id == ids[0]
                assert await raw.delete(_raw_keys(key_prefix, run_id)[1]) == 1
                rest = await drain(it)
        finally:
            await raw.aclose()
        delivered = [ids[0], *event_ids(rest)]
        assert delivered == ids[: len(delivered)]
        gap = only_gap(rest)
        assert gap.reason == "stream_removed"
        assert (gap.earliest_available_event_id, gap.latest_available_event_id) == (None, None)


async def test_redis_stream_deleted_during_tail(
    bridge: StreamBridge, redis_only: None, request: pytest.FixtureRequest, key_prefix: str
) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, _claim, ids = await new_run(bridge, 2)
        raw = await _raw_redis(request)
        try:
            async with subscription(bridge, run_id, heartbeat_interval=0.3) as it:
                assert event_ids([await next_item(it) for _ in ids]) == ids
                await wait_heartbeat(it)
                assert await raw.delete(_raw_keys(key_prefix, run_id)[1]) == 1
                with anyio.fail_after(5):
                    gap = only_gap(await drain(it))
        finally:
            await raw.aclose()
        assert gap.reason == "stream_removed"
        assert (gap.earliest_available_event_id, gap.latest_available_event_id) == (None, None)


async def _read_forever(bridge: StreamBridge, run_id: str, got: list[StreamItem]) -> None:
    async with subscription(bridge, run_id, heartbeat_interval=0.3) as it:
        while True:
            got.append(await anext(it))


async def test_redis_subscriber_cancelled_in_blocking_read_leaves_pool_healthy(
    make_bridge: BridgeFactory, redis_only: None
) -> None:
    # The smallest pool: a leaked or poisoned connection shows up at once.
    async with make_bridge(redis_max_connections=2) as bridge:
        with anyio.fail_after(TIMEOUT * 2):
            run_id, claim, ids = await new_run(bridge, 1)
            # cancel at several points of the reader's wait at the tail (it heartbeats
            # every 0.3 s and blocks in between)
            for delay in (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.29, 0.31):
                got: list[StreamItem] = []
                with anyio.CancelScope() as scope:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(_read_forever, bridge, run_id, got)
                        with anyio.fail_after(5):  # until it is idle at the tail
                            while not any(is_hb(i) for i in got):
                                await anyio.sleep(0.005)
                        await anyio.sleep(delay)
                        scope.cancel()
                assert event_ids(got) == ids
            # the pool still serves writes and reads, with the right replies
            ids += (await bridge.publish(run_id, TOK, {"i": 1}, producer_token=claim.token)).ids
            info = await bridge.get_run(run_id)
            assert info is not None and info.last_event_id == ids[-1]
            async with subscription(bridge, run_id, heartbeat_interval=0.2) as it:
                assert event_ids([await next_item(it) for _ in ids]) == ids
                await wait_heartbeat(it)
                live = await bridge.publish(run_id, TOK, {"i": 2}, producer_token=claim.token)
                item = await next_item(it)
                assert isinstance(item, StreamEvent) and item.id == live.ids[0]
                assert item.value() == {"i": 2}
            await bridge.publish_end(run_id, "success", producer_token=claim.token)
            items = await read_all(bridge, run_id, ids[0])
            assert event_ids(items) == [*ids[1:], live.ids[0]]
            only_end(items)


@pytest.mark.cluster
async def test_redis_cluster_contract_smoke(
    anyio_backend: str, redis_cluster: Any, key_prefix: str
) -> None:
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

    from gateway.bridge.provider import open_bridge
    from gateway.settings import Settings

    url = redis_cluster.url.replace("redis://", "redis+cluster://", 1)
    settings = Settings(redis_url=url, redis_key_prefix=key_prefix, heartbeat_interval_seconds=0.3)
    with anyio.fail_after(TIMEOUT * 2):
        async with open_bridge(settings) as bridge:
            run_ids = [new_run_id() for _ in range(4)]  # spread over several slots
            for run_id in run_ids:
                run_id, claim, ids = await new_run(bridge, 3, run_id=run_id)
                ids += (
                    await bridge.publish_many(
                        run_id, [(TOK, {"i": 3}), (TOK, {"i": 4})], producer_token=claim.token
                    )
                ).ids
                async with subscription(bridge, run_id, heartbeat_interval=0.3) as it:
                    assert event_ids([await next_item(it) for _ in ids]) == ids
                    await wait_heartbeat(it)
                    live = await bridge.publish(run_id, TOK, {}, producer_token=claim.token)
                    item = await next_item(it)
                    assert isinstance(item, StreamEvent) and item.id == live.ids[0]
                ids += live.ids
                new = await bridge.claim(run_id, takeover=True)
                assert new.epoch == claim.epoch + 1
                with pytest.raises(ProducerFenced):
                    await bridge.publish(run_id, TOK, {}, producer_token=claim.token)
                assert await bridge.request_cancel(run_id) is True
                await bridge.publish_end(run_id, "success", producer_token=new.token)
                items = await read_all(bridge, run_id, ids[2])  # resume from a cursor
                assert event_ids(items) == ids[3:]
                assert only_end(items).status == "success"
                info = await bridge.get_run(run_id)
                assert info is not None and info.status == "success"
                assert info.first_event_id == ids[0] and info.retained_events == len(ids)

        raw = AsyncRedisCluster.from_url(redis_cluster.url)
        try:
            all_keys = [
                k.decode() if isinstance(k, bytes) else k
                for k in await raw.keys(key_prefix + "*", target_nodes=AsyncRedisCluster.PRIMARIES)
            ]
            slots_used = set()
            for run_id in run_ids:
                keys = [k for k in all_keys if run_id in k]
                assert len(keys) >= 2, (run_id, all_keys)
                slots = {await raw.cluster_keyslot(k) for k in keys}
                assert len(slots) == 1, (run_id, keys, slots)
                slots_used |= slots
            assert len(slots_used) > 1  # the runs really were spread over the cluster
        finally:
            await raw.aclose()


async def test_redis_every_key_of_a_run_has_a_ttl(
    make_bridge: BridgeFactory, redis_only: None, request: pytest.FixtureRequest, key_prefix: str
) -> None:
    async with make_bridge(stream_ttl_seconds=3600, ended_ttl_seconds=30) as bridge:
        raw = await _raw_redis(request)
        try:
            with anyio.fail_after(TIMEOUT):

                async def ttls() -> dict[bytes, int]:
                    return {k: await raw.pttl(k) for k in await raw.keys(key_prefix + "*")}

                run_id, claim, _ = await new_run(bridge)
                assert all(0 < t <= 3_600_000 for t in (await ttls()).values()), await ttls()
                await bridge.publish(run_id, TOK, {}, producer_token=claim.token)
                await bridge.request_cancel(run_id)
                got = await ttls()
                assert len(got) >= 2 and all(0 < t <= 3_600_000 for t in got.values()), got
                await bridge.publish_end(run_id, "success", producer_token=claim.token)
                got = await ttls()
                assert all(t > 0 for t in got.values()), got  # no unbounded key
                log = _raw_keys(key_prefix, run_id)[1].encode()
                assert 0 < got[log] <= 30_000  # readable for ended_ttl_seconds after END
        finally:
            await raw.aclose()


async def test_redis_live_owner_write_recreates_a_missing_stream(
    bridge: StreamBridge, redis_only: None
) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, claim, _ = await new_run(bridge, 2)
        await bridge.cleanup(run_id)
        assert await bridge.stream_exists(run_id) is False
        res = await bridge.publish(run_id, TOK, {"again": 1}, producer_token=claim.token)
        assert await bridge.stream_exists(run_id) is True
        await bridge.publish_end(run_id, "success", producer_token=claim.token)
        items = await read_all(bridge, run_id)
        assert event_ids(items) == list(res.ids) and only_end(items).status == "success"


# ---------------------------------------------------------------------------------------
# open_stream: the run record and the subscription of a reader that checks the run first
# ---------------------------------------------------------------------------------------


async def _opened(
    bridge: StreamBridge, run_id: str, cursor: str | None
) -> tuple[Any, list[StreamItem]]:
    """`open_stream`'s record, and its subscription's items through the terminal one."""
    info, subscribe = await bridge.open_stream(run_id, cursor)
    items: list[StreamItem] = []
    batches = subscribe()
    try:
        async for batch in batches:
            items.extend(batch)
            if is_terminal(batch[-1]):
                break
    finally:
        await batches.aclose()
    return info, items


async def test_open_stream_gives_get_runs_record_and_subscribes_items(
    small: StreamBridge,
) -> None:
    """Same record as `get_run`, same items as `subscribe` with the same cursor: from a
    cursor, from the start, a malformed cursor, and behind the log's floor (a gap)."""
    bridge = small
    with anyio.fail_after(TIMEOUT):
        run_id, claim, ids = await new_run(bridge, 4)
        await bridge.publish_end(run_id, "success", producer_token=claim.token)
        for cursor in (ids[2], None, "not-a-cursor", ids[-1]):
            info, items = await _opened(bridge, run_id, cursor)
            assert info == await bridge.get_run(run_id)
            assert items == await read_all(bridge, run_id, cursor), cursor
        trimmed, _, old, _ = await trimmed_run(bridge, end=True)
        info, items = await _opened(bridge, trimmed, old[0])
        assert info == await bridge.get_run(trimmed)
        assert items == await read_all(bridge, trimmed, old[0])
        assert isinstance(items[0], StreamGap)
        unknown, _ = await bridge.open_stream(new_run_id(), ids[0])
        assert unknown is None
        # The log removed, the record left: read from the record (END at the last event,
        # a gap before it).
        await bridge.cleanup(run_id)
        for cursor in (ids[-1], ids[0]):
            info, items = await _opened(bridge, run_id, cursor)
            assert info == await bridge.get_run(run_id)
            assert items == await read_all(bridge, run_id, cursor), cursor
            assert isinstance(items[0], End if cursor == ids[-1] else StreamGap), items


async def test_open_stream_of_a_live_run_replays_then_follows(bridge: StreamBridge) -> None:
    with anyio.fail_after(TIMEOUT):
        run_id, claim, ids = await new_run(bridge, 5)
        info, subscribe = await bridge.open_stream(run_id, ids[1])
        assert info is not None and info.last_event_id == ids[-1] and not info.ended
        # Written between the record's read and the subscription's start: not missed.
        (between,) = (await bridge.publish(run_id, TOK, {"i": 5}, producer_token=claim.token)).ids
        batches = subscribe()
        got: list[StreamItem] = []
        try:
            while len(events(got)) < 4:
                got.extend(await anext(batches))
            assert event_ids(got) == [*ids[2:], between]
            (live,) = (await bridge.publish(run_id, TOK, {"i": 6}, producer_token=claim.token)).ids
            await bridge.publish_end(run_id, "success", producer_token=claim.token)
            while not is_terminal(got[-1]):
                got.extend(item for item in await anext(batches) if not is_hb(item))
        finally:
            await batches.aclose()
        assert event_ids(got) == [*ids[2:], between, live]
        assert only_end(got).status == "success"
