"""Cheap timed waits for both bridges' readers (the memory bridge's generations and the
Redis bridge's run feeds): a one-shot `Signal` waited with a deadline, and `Deadlines`,
which serves every deadline that falls in the same short slot with one loop timer.

An idle subscription is what a process holds thousands of, and a reader that takes an
event goes back to wait at once: per wait, these cost one future and a place in a set,
no timer and no timeout context of its own.
"""

from __future__ import annotations

import asyncio
import math

# Heartbeat deadlines are kept to this resolution (seconds): a heartbeat may come this
# much later than the interval, and one timer serves every reader due in the same slot.
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
