"""Unit tests of the Redis fan-out's shared window (`RunFeed`), fed reads and pushes the
way the bridge feeds it, so each rule is checked without timing: the window's rules, the
shared direct reads of a reconnect storm, one refresher at a time, and wake-ups."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from gateway.bridge.rules import Bounds
from gateway.cursor import parse_cursor
from gateway.redis.codec import LogRead
from gateway.redis.fanout import RunFeed
from gateway.redis.keys import run_keys
from gateway.values import StreamEvent


def event(entry_id: str) -> StreamEvent:
    return StreamEvent(entry_id, "e", b"1")


def log(*ids: str, floor: str | None = None) -> LogRead:
    bounds = Bounds(
        floor=parse_cursor(floor) if floor else None, trimmed=False, first=None, last=None
    )
    entries = [event(i) for i in ids]
    return LogRead(True, bounds, entries, None, "", None, None, None)  # type: ignore[arg-type]


GONE = LogRead(False, None, [], None, "running", None, None, parse_cursor("1-2"))


def push(prev: str, *ids: str) -> bytes:
    body = b"".join(b"%s e 1\n1" % i.encode() for i in ids)
    return b"e %s %d\n" % (prev.encode(), len(ids)) + body


def feed() -> RunFeed:
    f = RunFeed(run_keys("p:", "r"), "1-0", 64)
    f.stale = False
    return f


def test_a_log_found_again_after_a_removal_is_no_longer_removed() -> None:
    """A reader that took the rewritten log's events from the window must not then be
    ended as if the log were still gone (found by the chaos run)."""
    f = feed()
    f.take(log("1-1", "1-2"), 512)
    f.take(GONE, 512)
    assert f.removed and f.missing
    f.take(log("1-3", floor="1-2"), 512)
    assert not f.removed and not f.missing
    assert [e.id for e in f.after((1, 2)) or []] == ["1-3"]


def test_a_feed_made_without_a_start_serves_nobody_until_a_read_starts_it() -> None:
    """Its first reader's read tells where the log ends; before that no reader may take
    an (empty) window for the log's contents, and after it the feed reads from there."""
    f = RunFeed(run_keys("p:", "r"), None, 64)
    assert f.after((0, 0)) is None and f.after((9, 9)) is None
    f.start_at("1-5")
    f.start_at("1-9")  # a later reader's read does not move it
    assert f.stale and f.head == "1-5" and f.after((1, 5)) == []
    assert f.after((1, 4)) is None  # older than the window: read Redis


@pytest.mark.anyio
async def test_a_push_that_follows_the_window_is_taken_without_a_read() -> (
    None
):  # (the pacer needs a loop)
    f = feed()
    f.take(log("1-1"), 512)
    f.push(push("1-1", "1-2", "1-3"))
    assert not f.stale and [e.id for e in f.after((1, 1)) or []] == ["1-2", "1-3"]


@pytest.mark.parametrize("message", [b"", b"garbage", push("1-0", "1-5")])
def test_a_push_that_does_not_follow_the_window_makes_it_read(message: bytes) -> None:
    f = feed()
    f.take(log("1-1"), 512)
    f.push(message)
    assert f.stale


@pytest.mark.anyio
async def test_a_read_overlapping_pushed_entries_adds_each_once() -> None:
    f = feed()
    f.take(log("1-1"), 512)
    f.push(push("1-1", "1-2"))
    f.take(log("1-2", "1-3"), 512)
    assert [e.id for e in f.after((1, 0)) or []] == ["1-1", "1-2", "1-3"]


def test_a_feed_behind_the_floor_restarts_its_window_there() -> None:
    f = feed()
    f.take(log("1-1"), 512)
    f.take(log("1-9", floor="1-8"), 512)  # trimmed (or removed) past our head
    assert f.after((1, 1)) is None  # readers at 1-1 must read Redis (and get their gap)


# -- shared direct reads, one refresher at a time, wake-ups ----------------------------


class Reads:
    """A direct read the test releases: counts how often the feed's callers ran it."""

    def __init__(self, result: object = "entries") -> None:
        self.calls = 0
        self.release = asyncio.Event()
        self.result = result

    async def __call__(self) -> object:
        self.calls += 1
        await self.release.wait()
        return self.result


@pytest.mark.anyio
@pytest.mark.timeout(10)
async def test_readers_asking_for_the_same_position_at_once_share_one_read() -> None:
    f, reads = feed(), Reads()
    first = asyncio.ensure_future(f.read_shared("1-1", reads))
    await asyncio.sleep(0)  # the first read is in flight
    joined = asyncio.ensure_future(f.read_shared("1-1", reads))
    other = asyncio.ensure_future(f.read_shared("1-2", reads))  # another position: its own
    await asyncio.sleep(0)
    reads.release.set()
    with anyio.fail_after(2):
        results = await asyncio.gather(first, joined, other)
    assert results == ["entries"] * 3
    assert reads.calls == 2  # one for 1-1 (shared), one for 1-2


@pytest.mark.anyio
@pytest.mark.timeout(10)
async def test_a_change_makes_later_readers_read_afresh() -> None:
    f, reads = feed(), Reads()
    reads.release.set()
    with anyio.fail_after(2):
        await f.read_shared("1-1", reads)
        await f.read_shared("1-1", reads)  # a moment later, nothing changed: shared
        assert reads.calls == 1
        f.mark_stale()  # a notification: what was read may be out of date
        await f.read_shared("1-1", reads)
    assert reads.calls == 2


@pytest.mark.anyio
@pytest.mark.timeout(10)
async def test_readers_who_joined_a_failed_read_read_for_themselves() -> None:
    f = feed()
    started, fail = asyncio.Event(), asyncio.Event()

    async def failing() -> object:
        started.set()
        await fail.wait()
        raise ConnectionError("redis went away")

    first = asyncio.ensure_future(f.read_shared("1-1", failing))
    with anyio.fail_after(2):
        await started.wait()
    reads = Reads("own")
    reads.release.set()
    joined = asyncio.ensure_future(f.read_shared("1-1", reads))
    await asyncio.sleep(0)  # joined the failing read
    fail.set()
    with anyio.fail_after(2):
        with pytest.raises(ConnectionError):
            await first
        assert await joined == "own"
    assert reads.calls == 1


@pytest.mark.anyio
@pytest.mark.timeout(10)
async def test_one_reader_refreshes_and_those_queued_behind_it_take_its_result() -> None:
    f = feed()
    f.mark_stale()
    entered, leave = asyncio.Event(), asyncio.Event()
    seen: list[bool] = []

    async def refresh() -> None:
        async with f.refreshing() as mine:
            seen.append(mine)
            if mine:
                entered.set()
                await leave.wait()

    first = asyncio.ensure_future(refresh())
    with anyio.fail_after(2):
        await entered.wait()
    queued = asyncio.ensure_future(refresh())  # waits for the lock
    await asyncio.sleep(0)
    leave.set()
    with anyio.fail_after(2):
        await asyncio.gather(first, queued)
    assert seen == [True, False]  # the second found the feed fresh: no read of its own
    assert not f.stale


@pytest.mark.anyio
@pytest.mark.timeout(10)
async def test_a_refresh_that_fails_leaves_the_feed_stale() -> None:
    f = feed()
    f.mark_stale()
    with pytest.raises(ConnectionError):
        async with f.refreshing() as mine:
            assert mine
            raise ConnectionError("redis went away")
    assert f.stale  # the next reader reads again


@pytest.mark.anyio
@pytest.mark.timeout(10)
async def test_a_change_wakes_a_waiting_reader() -> None:
    f = feed()
    waiting = asyncio.ensure_future(f.wait(30))
    await asyncio.sleep(0)
    assert not waiting.done()
    f.mark_stale()
    with anyio.fail_after(2):  # far sooner than the 30 s wait: the change woke it
        await waiting
