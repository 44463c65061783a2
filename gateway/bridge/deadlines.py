"""Cheap deadlines: timed waits for both bridges' readers (the memory bridge's generations
and the Redis bridge's run feeds), and the Redis bridge's bound on each command.

- `Signal`, a one-shot wake-up waited with a deadline, and `Deadlines`, which serves
  every deadline that falls in the same short slot with one loop timer. An idle
  subscription is what a process holds thousands of, and a reader that takes an event
  goes back to wait at once: per wait, these cost one future and a place in a set, no
  timer and no timeout context of its own.
- `CallDeadlines`: what `asyncio.timeout` does for one call, with one loop timer per
  slot however many calls start in it. A timeout context creates and cancels a loop
  timer per call, which was about a tenth of the CPU of an awaited publish.
"""

from __future__ import annotations

import asyncio
import math
from types import TracebackType

# Deadlines are kept to this resolution (seconds): a heartbeat may come this much later
# than the interval (a command's timeout fires this much later), and one timer serves
# every reader (every call) due in the same slot.
DEADLINE_RESOLUTION = 0.025


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


class Deadlines:
    """Waiters' deadlines rounded up to `DEADLINE_RESOLUTION`: one loop timer per bucket.

    Readers woken together by a publish go back to wait together, so their heartbeat
    deadlines fall in the same bucket; a timer per wait (created and cancelled for every
    event a reader takes) was a tenth of the cost of delivering one.
    """

    __slots__ = ("_buckets", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._buckets: dict[int, tuple[set[asyncio.Future[bool]], asyncio.TimerHandle]] = {}

    def add(self, deadline: float, waiter: asyncio.Future[bool]) -> set[asyncio.Future[bool]]:
        slot = math.ceil(deadline / DEADLINE_RESOLUTION)
        entry = self._buckets.get(slot)
        if entry is None:
            timer = self.loop.call_at(slot * DEADLINE_RESOLUTION, self._expire, slot)
            entry = self._buckets[slot] = (set(), timer)
        entry[0].add(waiter)
        return entry[0]

    def _expire(self, slot: int) -> None:
        waiters, _timer = self._buckets.pop(slot)
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(False)

    def cancel(self) -> None:
        for _waiters, timer in self._buckets.values():
            timer.cancel()
        self._buckets.clear()


class CallDeadline:
    """One call's deadline, entered around the call (`CallDeadlines.start`).

    When it passes, the call's task is cancelled; leaving with that cancellation raises
    TimeoutError instead, as `asyncio.timeout` does. A cancellation that came from
    elsewhere (also one that came as well) goes on as it came.
    """

    __slots__ = ("_bucket", "_cancelling", "_task", "expired")

    def __init__(self, task: asyncio.Task[object], bucket: set[CallDeadline]) -> None:
        self._task = task
        self._cancelling = task.cancelling()
        self._bucket = bucket
        self.expired = False

    def __enter__(self) -> CallDeadline:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._bucket.discard(self)
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
    """Deadlines `seconds` after each call starts, rounded up to `DEADLINE_RESOLUTION`
    (a call is never stopped early, and at most that much late): one loop timer per
    slot, however many calls start in it."""

    __slots__ = ("_buckets", "_seconds")

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._buckets: dict[int, set[CallDeadline]] = {}

    def start(self) -> CallDeadline:
        """The deadline of a call the current task makes now; use it as a `with` block."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a call deadline needs a task")
        loop = task.get_loop()
        slot = math.ceil((loop.time() + self._seconds) / DEADLINE_RESOLUTION)
        bucket = self._buckets.get(slot)
        if bucket is None:
            bucket = self._buckets[slot] = set()
            loop.call_at(slot * DEADLINE_RESOLUTION, self._expire, slot)
        call = CallDeadline(task, bucket)
        bucket.add(call)
        return call

    def _expire(self, slot: int) -> None:
        for call in self._buckets.pop(slot):
            call.expire()
