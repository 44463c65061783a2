"""A Redis subscription's view of a run's log (`bridge.reader.LogView`), for the
shared subscriber loop (`bridge/reader.py`): direct reads (`reads.py`), shared with this
process's readers at the same position, and the run's feed (`fanout.RunFeed`, one per
run per process, fed by `notifier.py`) as the window."""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Coroutine, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from ..bridge import rules
from ..bridge.reader import Placement
from ..bridge.rules import LogRead
from ..cursor import EventKey, format_key, parse_cursor
from ..values import End, StreamEvent, StreamItem
from .calls import Calls
from .fanout import RunFeed
from .keys import RunKeys
from .notifier import Notifier
from .reads import Reads


class FirstRead:
    """A reader's first read, made already (`open_stream`), handed over once.

    The route keeps the subscription's factory, which holds this, for as long as the
    response is open: taken, the read is held by nobody, rather than its events (decoded
    for this reader alone) for the stream's lifetime."""

    __slots__ = ("_read", "after", "newest")

    def __init__(self, after: str, read: LogRead, newest: EventKey | None) -> None:
        self.after = after
        self._read: LogRead | None = read
        self.newest = newest  # the run's window's newest id as the read began (`check_tail`)

    def take(self, position: str) -> LogRead | None:
        """The read, if it was made from `position` (and not taken before)."""
        read, self._read = self._read, None
        return read if position == self.after else None


class RunView:
    """One Redis subscription's view of a run's log (`reader.LogView`): direct reads of
    Redis, shared with this process's readers at the same position, and the run's feed
    (`fanout.RunFeed`, shared by every local reader of the run) as the window."""

    __slots__ = ("_calls", "_keys", "_notifier", "_prefetched", "_reads", "feed")

    def __init__(
        self,
        calls: Calls,
        reads: Reads,
        notifier: Notifier,
        keys: RunKeys,
        prefetched: FirstRead | None,
    ) -> None:
        self._calls = calls
        self._reads = reads
        self._notifier = notifier
        self._keys = keys
        self._prefetched = prefetched
        self.feed: RunFeed  # set by `attached` (the loop's steps all run inside it)

    @property
    def closed(self) -> bool:
        return self._calls.closed or self.feed.closed

    @property
    def stale(self) -> bool:
        return self.feed.stale

    @asynccontextmanager
    async def attached(self, start: rules.Start) -> AsyncIterator[Placement]:
        # A malformed cursor needs the log's tail first: an active log is followed from
        # there (a position the reader holds from now on: a trim past it before the
        # first read is a gap), an ended one replayed through its END. Any other
        # reader's first read tells what the tail would, in the same round trip: where
        # a new feed starts, and whether the log ends with its END, after which nothing
        # can follow (such a reader, a resume's common case, never subscribes).
        tail_id = None
        phase, position = rules.Phase.NEW, start.key
        if start.kind == "malformed":
            newest = await self._reads.tail(self._keys)
            tail_id = newest.id if newest is not None and newest.id else "0-0"
            if newest is not None:
                phase = rules.Phase.SEEN
                if not isinstance(newest, End):
                    assert newest.id is not None
                    position = parse_cursor(newest.id)
        async with self._notifier.attach(self._keys, tail_id, subscribe=False) as feed:
            self.feed = feed
            yield phase, position

    async def read(self, after: EventKey | None, *, seen: bool) -> LogRead:
        position = "-" if after is None else format_key(after)
        feed = self.feed
        prefetched = self._prefetched
        first = None if prefetched is None else prefetched.take(position)
        if first is not None:
            assert prefetched is not None
            read, newest = first, prefetched.newest
        else:
            read, newest = await feed.read_shared(
                position, functools.partial(self._read_noting, feed, position)
            )
        if not read.exists and seen:
            # A removal is decided on a read of our own: a shared one may have begun
            # before our first look found the log (its notification not yet heard).
            read, newest = await self._read_noting(feed, position)
        if not read.exists:
            # This process's reads shared from before the removal would replay the log.
            feed.forget_reads()
            self._reads.forget(self._keys)
        tail = read.tail.id if read.tail is not None and read.tail.id else "0-0"
        last = read.entries[-1].id if read.entries else None
        stopped = None if last is None or last == tail else parse_cursor(last)
        feed.check_tail(parse_cursor(tail), newest, stopped)
        feed.start_at(tail)
        return read

    async def _read_noting(self, feed: RunFeed, position: str) -> tuple[LogRead, EventKey | None]:
        """A read, with the window's newest id as it began (`RunFeed.check_tail`)."""
        newest = feed.newest
        return await self._reads.read(self._keys, position), newest

    def window(self, after: EventKey) -> Sequence[StreamItem] | None:
        feed = self.feed
        if feed.missing:
            return None  # (a removed log is found by the reader's own read)
        return feed.after(after)

    async def refresh(self) -> None:
        await self._reads.refresh(self.feed)

    async def follow(self) -> None:
        await self._notifier.follow(self.feed)

    def wait(self, deadline: float) -> Coroutine[Any, Any, bool]:
        return self.feed.wait_until(deadline)  # (no coroutine of its own: see there)

    def key_of(self, event: StreamEvent) -> EventKey:
        return self.feed.key_of(event)

    def idle(self, interval: float) -> None:
        if time.monotonic() - self.feed.last_read >= interval:
            self.feed.mark_stale()  # a lost notification costs one interval at most

    async def gap_bounds(self, bounds: rules.Bounds) -> rules.Bounds:
        first, last = await self._reads.event_bounds(self._keys)
        return replace(bounds, first=first, last=last)

    def final(self, position: EventKey | None) -> End | None:
        window = self.feed.after(position or (0, 0))
        if window is not None and len(window) == 1 and isinstance(window[0], End):
            return window[0]
        return None
