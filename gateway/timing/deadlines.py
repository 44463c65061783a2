"""Cheap deadlines: timed waits for both bridges' readers (the memory bridge's generations
and the Redis bridge's run feeds), and the Redis bridge's bound on each command.

- `Slots`: items due at deadlines, every deadline that falls in the same short slot
  served by one loop timer; both kinds below keep theirs there.
- `Signal`, a one-shot wake-up waited with a deadline in `Deadlines`. An idle
  subscription is what a process holds thousands of, and a reader that takes an event
  goes back to wait at once: per wait, these cost one future and a place in a set, no
  timer and no timeout context of its own. `Changes` hands out a fresh one after each
  wake-up: a log's "something changed".
- `CallDeadlines`: what `asyncio.timeout` does for one call, in `Slots` (one loop timer
  however many calls start in the same slot). A timeout context creates and cancels a loop
  timer per call, which was about a tenth of the CPU of an awaited publish.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from types import TracebackType
from typing import Generic, TypeVar

# Deadlines are kept to this resolution (seconds): a heartbeat may come this much later
# than the interval (a command's timeout fires this much later), and one timer serves
# every reader (every call) due in the same slot.
DEADLINE_RESOLUTION = 0.025

T = TypeVar("T")


class Signal:
    """A one-shot wake-up (what `asyncio.Event` is used for here), waited with a deadline.

    Lighter per waiting reader than `Event.wait()` under `asyncio.timeout_at`: one future
    and a place in a shared deadline bucket, no timer of its own, no timeout context (an
    idle subscription is what a process holds thousands of).
    """

    __slots__ = ("_waiters", "fired")

    def __init__(self) -> None:
        self.fired = False
        self._waiters: set[asyncio.Future[bool]] = set()

    def fire(self) -> None:
        self.fired = True
        waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(True)

    async def wait_until(self, deadlines: Deadlines, deadline: float) -> bool:
        """True once fired, False when `deadline` (loop time) passes first."""
        if self.fired:
            return True
        waiter: asyncio.Future[bool] = deadlines.loop.create_future()
        self._waiters.add(waiter)
        bucket = deadlines.add(deadline, waiter)
        try:
            return await waiter
        finally:
            bucket.discard(waiter)
            self._waiters.discard(waiter)


class Changes:
    """A log's change signal: `current` is the `Signal` the next `fire` fires, and each
    `fire` starts a new one (a reader takes `current` before it checks the log, so a change
    after that check is never missed).

    An object of its own so that the log's `WakePacer` can hold `fire` without holding
    the log: a log that held a pacer holding the log's own bound method was a reference
    cycle, so a released log (a feed nobody follows, a removed generation) kept its
    entries until the cyclic collector's next full pass instead of freeing them at once.
    """

    __slots__ = ("current",)

    def __init__(self) -> None:
        self.current = Signal()

    def fire(self) -> None:
        signal, self.current = self.current, Signal()
        signal.fire()


class Slots(Generic[T]):
    """Items due at deadlines rounded up to `DEADLINE_RESOLUTION`: one loop timer per
    slot, however many items fall in it; `expire(item)` for each item still in its slot
    when the slot is due (an item leaves by being discarded from the set `add` returns).
    """

    __slots__ = ("_buckets", "_expire_item", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, expire: Callable[[T], object]) -> None:
        self.loop = loop
        self._expire_item = expire
        self._buckets: dict[int, tuple[set[T], asyncio.TimerHandle]] = {}

    def add(self, deadline: float, item: T) -> set[T]:
        slot = math.ceil(deadline / DEADLINE_RESOLUTION)
        entry = self._buckets.get(slot)
        if entry is None:
            timer = self.loop.call_at(slot * DEADLINE_RESOLUTION, self._due, slot)
            entry = self._buckets[slot] = (set(), timer)
        entry[0].add(item)
        return entry[0]

    def _due(self, slot: int) -> None:
        items, _timer = self._buckets.pop(slot)
        for item in items:
            self._expire_item(item)

    def cancel(self) -> None:
        for _items, timer in self._buckets.values():
            timer.cancel()
        self._buckets.clear()


def _time_out(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)


class Deadlines(Slots["asyncio.Future[bool]"]):
    """Waiters' deadlines: a waiter still waiting when its slot is due gets False.

    Readers woken together by a publish go back to wait together, so their heartbeat
    deadlines fall in the same slot; a timer per wait (created and cancelled for every
    event a reader takes) was a tenth of the cost of delivering one.
    """

    __slots__ = ()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop, _time_out)


class CallDeadline:
    """One call's deadline, entered around the call (`CallDeadlines.start`).

    When it passes, the call's task is cancelled; leaving with that cancellation raises
    TimeoutError instead, as `asyncio.timeout` does. A cancellation that came from
    elsewhere (also one that came as well) goes on as it came.
    """

    __slots__ = ("_cancelling", "_task", "bucket", "expired")

    bucket: set[CallDeadline]  # the slot it is due in, set by `CallDeadlines.start`

    def __init__(self, task: asyncio.Task[object]) -> None:
        self._task = task
        self._cancelling = task.cancelling()
        self.expired = False

    def __enter__(self) -> CallDeadline:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.bucket.discard(self)
        if self.expired:
            # Our cancellation is taken back however the call ended; it is the call's
            # outcome only if no other came meanwhile.
            only_ours = self._task.uncancel() <= self._cancelling
            if only_ours and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc

    def expire(self) -> None:
        self.expired = True
        self._task.cancel()


class CallDeadlines:
    """Deadlines `seconds` after each call starts (a call is never stopped early, and at
    most `DEADLINE_RESOLUTION` late), in `Slots` made on the loop of the first call."""

    __slots__ = ("_seconds", "_slots")

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._slots: Slots[CallDeadline] | None = None

    def start(self) -> CallDeadline:
        """The deadline of a call the current task makes now; use it as a `with` block."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a call deadline needs a task")
        loop = task.get_loop()
        slots = self._slots
        if slots is None or slots.loop is not loop:
            slots = self._slots = Slots(loop, CallDeadline.expire)
        call = CallDeadline(task)
        call.bucket = slots.add(loop.time() + self._seconds, call)
        return call
