"""The subscriber loop, one for both backends: replay from a cursor, follow live, end with
END or a gap, heartbeat while idle.

A backend gives each subscription a `LogView` of the run's log; the view only stores and
reads (a direct read after a position, with the log's bounds; the shared window of its
newest entries; a change signal; following the run's changes). What the reader does with
each read (deliver, wait, end, or report a gap) is `rules.decide`, and where it stands is
a `rules.Phase`:

    NEW ──read──▶ NO_RUN ─▶ CLAIMED ─▶ LIVE ──▶ DONE
      └─(malformed cursor on Redis: the tail seen)─▶ SEEN ─▶ LIVE

A reader in `LIVE` takes what is new from the view's window (shared by every local
reader of the run) and reads the backend directly only when its position is not in the
window: behind it (replaying, or lagging a fast producer: the read finds a gap exactly)
or when the window cannot tell (the log vanished, the feed is rebuilding).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol, TypeAlias

from ..cursor import EventKey
from ..errors import BackendUnavailable, BridgeClosed
from ..values import HEARTBEAT, End, StreamEvent, StreamItem
from . import rules
from .rules import Phase

Placement: TypeAlias = tuple[Phase, EventKey | None]


class LogView(Protocol):
    """One subscription's view of a run's log, as a backend provides it."""

    @property
    def closed(self) -> bool:
        """The bridge is closing: the reader ends (`final`)."""
        ...

    @property
    def stale(self) -> bool:
        """A change may be waiting that the window does not have yet (`refresh`)."""
        ...

    def attached(self, start: rules.Start) -> AbstractAsyncContextManager[Placement]:
        """Hold the view's shared resources for the subscription's lifetime, and place a
        reader with cursor `start`: its first phase and position (a valid cursor's key;
        a backend may place a malformed cursor, or a reader of a log it holds, itself)."""
        ...

    async def read(self, after: EventKey | None, *, seen: bool) -> rules.LogRead:
        """The log's entries after `after` (None: from its start) with its bounds, or
        the run record when there is no log. `seen`: the reader saw the log, so a read
        that finds none must be the reader's own, not one shared a moment earlier."""
        ...

    def window(self, after: EventKey) -> Sequence[StreamItem] | None:
        """The shared window's items after `after` (an END last), or None when `after`
        is not inside it and the reader must read directly."""
        ...

    async def refresh(self) -> None:
        """Bring the window up to date after a change (`stale`)."""
        ...

    async def follow(self) -> None:
        """Start hearing the run's changes (`wait` wakes on them)."""
        ...

    async def wait(self, deadline: float) -> bool:
        """Until the next change (True), or the loop time `deadline` (False)."""
        ...

    def key_of(self, event: StreamEvent) -> EventKey:
        """The key of `event`, the newest one the view handed out."""
        ...

    def idle(self, interval: float) -> None:
        """A heartbeat is due: the reader sat `interval` seconds without an event."""
        ...

    async def gap_bounds(self, bounds: rules.Bounds) -> rules.Bounds:
        """`bounds` with the retained first and last event ids, for a gap."""
        ...

    def final(self, position: EventKey | None) -> End | None:
        """The run's END when a reader at `position` had every event before it."""
        ...


async def follow_log(
    view: LogView, start: rules.Start, interval: float
) -> AsyncGenerator[Sequence[StreamItem], None]:
    """A subscription from cursor `start`: batches of items in order, one per step of the
    reader, heartbeats after `interval` idle seconds."""
    now = asyncio.get_running_loop().time
    deadline = now() + interval
    window, key_of = view.window, view.key_of  # (bound once: the per-step path)
    following = False
    first = True
    ended_log = False  # the latest direct read found the log ending with its END
    due = False  # the last wait reached the deadline: a heartbeat is due
    async with view.attached(start) as (phase, position):
        # `position`: what the reader holds (a valid cursor, or the last event delivered),
        # which is what can fall behind the log's floor; None: nothing yet.
        while True:
            if view.closed:
                yield [view.final(position) or rules.removed(position, "bridge_closed")]
                return
            items: Sequence[StreamItem] | None = None
            try:
                if not (following or first or ended_log):
                    # After the first read, before the refresh below (which then reads
                    # what was appended since that read).
                    await view.follow()
                    following = True
                # A reader's first read is its own (a resume that ends there costs no
                # window refresh); from then on a stale window is refreshed first.
                if view.stale and (phase is Phase.LIVE or not first):
                    await view.refresh()
                if phase is Phase.LIVE:
                    items = window(position or (0, 0))
                if items is None:
                    read = await view.read(position, seen=phase in (Phase.SEEN, Phase.LIVE))
                    ended_log = read.tail_end() is not None
                    phase, decided = rules.decide(phase, position, read)
                    # Nothing of a read outlives its step (nor does a delivered batch,
                    # below): a live reader may never read again, and its last read
                    # would hold a batch of events decoded for it alone for good.
                    del read
                    if isinstance(decided, rules.Missed):  # a gap: fill in its bounds
                        bounds = await view.gap_bounds(decided.bounds)
                        items = [rules.gap(position, bounds, decided.reason)]
                    else:
                        items = decided
                    del decided
                first = False
            except (BridgeClosed, BackendUnavailable):
                if view.closed:
                    continue
                raise
            if items:
                yield items
                if type(items[-1]) is not StreamEvent:
                    return  # an END or a gap: the subscription is over
                position = key_of(items[-1])
                deadline = now() + interval
                due = False
                continue
            if not following:  # nothing (yet) after the first read: wait following
                await view.follow()
                following = True
                continue
            if due:
                due = False
                view.idle(interval)
                yield [HEARTBEAT]
                deadline = now() + interval
            elif not view.stale:
                due = not await view.wait(deadline)
