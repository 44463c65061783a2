"""Unit tests of the Redis fan-out's shared window (`RunFeed`), fed reads and pushes the
way the bridge feeds it, so each rule is checked without timing."""

from __future__ import annotations

import pytest

from gateway.bridge.keys import run_keys
from gateway.bridge.redis_codec import LogRead
from gateway.bridge.redis_fanout import RunFeed
from gateway.bridge.rules import Bounds
from gateway.cursor import parse_cursor
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
