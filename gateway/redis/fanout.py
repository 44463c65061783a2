"""Per-process fan-out for the Redis bridge: a run's log is read from Redis once per change
and shared by every local subscriber of that run.

- Every write script SPUBLISHes on the run's shard channel (the log key's name). The
  process's notifier (`notifier.py`: one pub/sub connection per node that owns a
  followed run's slot) hears it and pushes it to the run's feed (`RunFeed.push`).
- A `RunFeed` per run with local subscribers keeps a bounded window of its newest
  entries (it is the window of the subscribers' `bridge.reader.LogView`). Whichever
  subscriber wakes first reads the new entries (under the feed's lock); the others
  take them from the window.
- A subscriber whose position is older than the window (replaying, or lagging behind a
  fast producer) reads Redis directly from its own cursor, with exact gap detection,
  until it reaches the window. A slow client therefore never holds up the feed or the
  other subscribers. Subscribers asking for the same position at once (clients of a
  run reconnecting together after a deploy or a network blip) share that read and its
  decoded entries (`RunFeed.read_shared`).

Redis connections held by a process: the bounded command pool plus one pub/sub
connection per Redis node (shard) with followed runs, whatever the number of subscribers
or runs. A resubscription marks the feeds stale (they read once), and a notification
lost anyway costs at most one heartbeat interval: idle subscribers re-read the feed then.
"""

from __future__ import annotations

import asyncio
import time
from bisect import bisect_right
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from ..bridge.rules import Entry, LogRead, missed_events, unvouched
from ..cursor import EventKey, format_key, key_of, parse_cursor
from ..timing.deadlines import Changes, Deadlines
from ..timing.pacing import WakePacer
from ..values import End
from .codec import decode_push
from .keys import RunKeys

T = TypeVar("T")
SHARED_READS = 8  # direct-read results a feed keeps (by position) until its next change
# ... and for no longer than this (seconds): a log can also vanish without a notification
# (its TTL expired), and a storm of reconnects is over well within it.
SHARED_READ_SECONDS = 1.0


class RunFeed:
    """The shared window of one run's newest entries, contiguous after `base`."""

    def __init__(
        self, keys: RunKeys, start: str | None, window: int, deadlines: Deadlines | None = None
    ) -> None:
        self.keys = keys
        # `start` None: the log's tail is not known yet; the first read of one of its
        # readers tells it (`start_at`), and until then the window serves nobody.
        self.started = start is not None
        start = start or "0-0"
        self.base = start  # every entry after `base` up to `head` is in `items`
        self.head = start  # the next read starts after this id
        self._base_key = parse_cursor(start)
        self._head_key = self._base_key
        self._keys_window: list[EventKey] = []
        self.items: list[Entry] = []
        self._window = window
        self.stale = True  # a change may be waiting in Redis
        self.removed = False  # the log was seen and is missing now
        self.missing = False  # the last read found no log (readers ask Redis themselves)
        self.closed = False
        self.changes = 0  # notifications seen: a reader compares it before and after a read
        self.restarts = 0  # times a refresh found the log not what the window followed
        self.last_read = 0.0
        self.users = 0
        self._seen = False
        self._lock = asyncio.Lock()
        # Readers wait on a one-shot signal with their heartbeat deadline in a bucket of
        # `deadlines` (the notifier's, shared by every feed of the process): no timer per
        # wait, whereas a reader woken for each event went back to wait with a timer of
        # its own (a tenth of the cost of a delivery to a run's several readers).
        self._deadlines = deadlines
        self._changes = Changes()
        self._pacer = WakePacer(self._changes.fire, contended_within=2.0)
        # Direct reads by start position (with the time each began), in flight or done
        # since the last change; a result of None means "read it yourself".
        self._reads: dict[str, tuple[asyncio.Future[Any], float]] = {}

    # -- what subscribers see ----------------------------------------------------

    def after(self, position: EventKey) -> list[Entry] | None:
        """Entries after `position`, or None when the window cannot vouch for it: older
        than the window, or not one of its ids (nor its base). Such a reader reads Redis,
        which tells a position the log no longer holds (lost in a failover) from one it
        merely has not read yet."""
        if not self.started:
            return None
        keys = self._keys_window
        if keys and position == keys[-1]:
            # A live reader asking again once it has the newest entry: no search.
            entries: list[Entry] = []
        elif len(keys) > 1 and position == keys[-2]:
            entries = self.items[-1:]  # one behind: a live reader's usual step
        elif position == self._base_key:
            entries = self.items[:]
        else:
            index = bisect_right(keys, position)
            if index == 0 or keys[index - 1] != position:
                return None
            entries = self.items[index:]
        if not entries and self.items and isinstance(self.items[-1], End):
            return self.items[-1:]  # a cursor past the END entry still learns the run ended
        return entries

    def key_of(self, entry: Entry) -> EventKey:
        """The key of `entry`: the window's newest one without parsing its id (what a
        live reader hands out last, once per delivery), or parsed."""
        items = self.items
        if items and items[-1] is entry:
            return self._keys_window[-1]
        assert entry.id is not None
        return key_of(entry.id)

    async def wait(self, seconds: float) -> None:
        """Until the next change, or about `seconds` (to `DEADLINE_RESOLUTION`) pass."""
        await self.wait_until(asyncio.get_running_loop().time() + seconds)

    def wait_until(self, deadline: float) -> Coroutine[Any, Any, bool]:
        """Until the next change (True), or about the loop time `deadline` (False).

        A plain function returning the signal's wait, awaited at once by the caller: one
        coroutine less per wait of every live reader, which waits once per event."""
        # asyncio-native on purpose: subscribers run in bare asyncio tasks that are
        # cancelled with `Task.cancel()` (http/streaming/sse.py), and an anyio cancel scope whose
        # deadline fires as that cancel arrives can swallow it (seen: a drained stream
        # that kept reading). A `Signal`'s wait is a plain future.
        self._pacer.parked()
        deadlines = self._deadlines
        if deadlines is None:
            # (Once: asyncio's get_running_loop() is a getpid() system call, which on
            # every wait was one per delivered event.)
            deadlines = self._deadlines = Deadlines(asyncio.get_running_loop())
        return self._changes.current.wait_until(deadlines, deadline)

    def wake(self) -> None:
        self._changes.fire()

    def mark_stale(self) -> None:
        self.stale = True
        self.changes += 1
        self._reads.clear()  # later readers read afresh
        self.wake()

    @property
    def newest(self) -> EventKey | None:
        """The newest id the window holds (None: not started): a read that began after
        it and finds the log's newest id below it saw a log that went backwards."""
        return self._head_key if self.started else None

    def check_tail(
        self, tail: EventKey, newest: EventKey | None, stopped: EventKey | None = None
    ) -> None:
        """A reader's read, begun when the window's newest id was `newest`, found the
        log's newest id at `tail`: below it, the log lost entries the window still holds
        (a failover to a replica that missed them, a restart that lost them), which
        must not be served after a position the log does hold. The window is refreshed
        before anyone uses it again, which restarts it at the log's tail (`take`).

        The window may also have taken entries while the read was in flight (the read
        waited at the pool, or was retried on the promoted server, as notifications
        from the old master came in; or no window had begun when it was sent): newer
        than the tail the read found, they are checked the same way, by the refresh.

        `stopped`: the read stopped at its batch there, short of the tail. Inside the
        window, the reader goes on from the window, whose entries after it the read
        did not see; the refresh made before that checks that the window's newest id is
        still in the log (one read per such reader, which was far behind anyway; the
        readers of one shared read share it while none has refreshed yet)."""
        current = self.newest
        if newest is not None and tail < newest:
            self.mark_stale()
        elif current is not None and tail < current:
            self.stale = True  # grown during the read: its head is checked first
        elif stopped is not None and current is not None and self._base_key <= stopped < current:
            self.stale = True  # (a refresh already due covers every reader stopped here)

    def forget_reads(self) -> None:
        """The log is gone (a read found it missing, or this process removed it): shared
        results read before that would replay it."""
        self._reads.clear()

    def push(self, message: bytes) -> None:
        """A change notification: take the entries it carries when they follow our copy
        of the log exactly; otherwise (or if it carries none) read Redis."""
        pushed = decode_push(message) if not self.stale and not self.missing else None
        if pushed is None or pushed.prev != self.head:
            self.mark_stale()
            return
        for entry in pushed.entries:
            self._append(entry)
        self._reads.clear()
        self.last_read = time.monotonic()
        self._pacer.appended_now()  # paced: a burst of notifications, one wake-up

    def start_at(self, tail: str) -> None:
        """Begin the window of a feed made without a start at `tail`, the log's newest
        id as one of its readers found it ("0-0": no log). The feed is stale, so its
        first refresh reads whatever was appended since."""
        if not self.started:
            self.started = True
            self.stale = True
            self._reset(tail)

    # -- reading Redis ----------------------------------------------------------

    async def read_shared(self, position: str, read: Callable[[], Awaitable[T]]) -> T:
        """`read()` from `position`, or the result of the same read begun less than
        `SHARED_READ_SECONDS` ago and since the last change notification.

        Taking a result read a moment before we asked is safe: the subscriber goes on
        reading from where that result ends, and any change since has cleared these
        results and marked the feed stale. (A feed nobody has subscribed hears of no
        change: its first reader is between its read and its subscription, which then
        clears these results, or its readers all found the log ending with its END. The
        latter's results stand for `SHARED_READ_SECONDS`, during which an ended log can
        change only by vanishing or by being removed and written anew: the first read of
        this process that finds it missing, or a removal through this process, drops
        them (`forget_reads`); until then such a reader may still be handed the old log,
        as if it had read a moment earlier.) If the read fails or its reader is
        cancelled, those who joined it read for themselves.
        """
        now = time.monotonic()
        earlier = self._reads.get(position)
        if earlier is not None and now - earlier[1] < SHARED_READ_SECONDS:
            shared: T | None = await asyncio.shield(earlier[0])
            if shared is not None:
                return shared
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._reads.pop(position, None)  # re-inserted last: the newest
        self._reads[position] = (future, now)
        while len(self._reads) > SHARED_READS:
            del self._reads[next(iter(self._reads))]  # the oldest position
        result: T | None = None
        try:
            result = await read()
            return result
        finally:
            future.set_result(result)
            mine = self._reads.get(position)
            if result is None and mine is not None and mine[0] is future:
                del self._reads[position]

    @asynccontextmanager
    async def refreshing(self) -> AsyncIterator[bool]:
        """One reader at a time pulls what is new since `head` (`take` each read).

        Yields False when another subscriber read it while we queued for the lock.
        """
        async with self._lock:
            if not self.stale:
                yield False
                return
            self.stale = False
            try:
                yield True
            except BaseException:
                self.stale = True
                raise
            finally:
                self.last_read = time.monotonic()
                self.wake()

    def take(self, read: LogRead, batch: int) -> bool:
        """Add one read (made after `head`) to the window; True when more may follow."""
        if not read.exists:
            self.removed = self._seen
            self.missing = True
            self._reads.clear()
            return False
        self._seen = True
        # A log written again after a removal: readers that had not yet seen the removal
        # go on from the window (the floor check below keeps them exact).
        self.removed = self.missing = False
        assert read.bounds is not None
        if missed_events(self._head_key, read.bounds):
            # The feed itself is behind the log's floor (a burst larger than the retained
            # window between two reads, or a log removed and written again): restart the
            # window at the floor; subscribers behind it find their gap in Redis.
            assert read.bounds.floor is not None
            self._restart(format_key(read.bounds.floor))
            return True
        if unvouched(self._head_key, read.bounds, read.found):
            # The log no longer holds the feed's head: it went backwards (a failover to a
            # replica that missed the newest entries, a restart that lost them). Restart
            # the window at the log's newest entry; each reader whose position the log no
            # longer holds finds its gap in Redis (`after` sends it there).
            self._restart(read.tail.id if read.tail is not None and read.tail.id else "0-0")
            return True
        for entry in read.entries:
            self._append(entry)
        return len(read.entries) >= batch

    def _append(self, entry: Entry) -> None:
        assert entry.id is not None
        key = key_of(entry.id)
        if key <= self._head_key:
            return  # pushed while a read was in flight: we have it already
        self._head_key = key
        if self.items and isinstance(self.items[-1], End):
            self.head = entry.id  # a legacy log's entries after its END: never delivered
            return
        self.items.append(entry)
        self._keys_window.append(key)
        self.head = entry.id
        excess = len(self.items) - self._window
        if excess > self._window // 4:  # drop in chunks: amortised O(1) per entry
            dropped = self.items[excess - 1].id
            assert dropped is not None
            del self.items[:excess]
            del self._keys_window[:excess]
            self.base = dropped
            self._base_key = parse_cursor(dropped)

    def _restart(self, start: str) -> None:
        """The log is not what the window followed (it went backwards, or on past the
        window's head): begin again at `start`, as after a change. Reads shared from
        before would serve what the log no longer holds (`restarts` tells the process's
        other shared reads, `Reads.refresh`)."""
        self._reset(start)
        self._reads.clear()
        self.changes += 1
        self.restarts += 1

    def _reset(self, start: str) -> None:
        self.items.clear()
        self._keys_window.clear()
        self.base = self.head = start
        self._base_key = self._head_key = parse_cursor(start)
