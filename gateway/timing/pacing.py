"""Wake-up pacing for the readers of one log (a memory generation, a Redis feed).

A publish only asks for a wake-up; the pacer decides when the readers run. One wake-up is
scheduled at a time, so a burst of appends coalesces into one, after which each reader
takes everything new as one batch. A producer that appends now and then is never held
back: its readers wake on the next tick. Under a steady stream readers wake at most every
`WAKE_INTERVAL`. And when the producer appends again sooner than its readers took to
catch up after the last wake-up (many readers, or slow writes), the next wake-up waits
until twice that busy time has passed: the producer keeps about two thirds of the loop and
readers take bigger batches (a slow reader falls behind within retention, never stalls
writes). That holds only while the producer keeps appending: a wake-up is put off no
more than `QUIET` past the latest append (or the readers' last park), since once the
producer has stopped the loop would otherwise idle while the readers wait.

Times are `time.perf_counter()` seconds: the loop's clock may only advance once per loop
iteration (uvloop's does, in whole milliseconds), which would make the busy time read 0.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Final

# Under a steady stream, readers are woken at most this often (seconds).
WAKE_INTERVAL: Final = 0.0005
# A wake-up is never put off by more than this for the producer's sake (bounds latency).
MAX_WAKE_DEFERRAL: Final = 0.5
# A producer that has not appended for this long (seconds) is not waited for.
QUIET: Final = 0.002


class WakePacer:
    """Calls `wake()` (on the running loop) when the readers of one log should run.

    A wake-up is put off when the latest two appends came less than `contended_within`
    times the readers' last busy time apart. 1 (the memory bridge): the producer outpaces
    its readers. 2 (a Redis feed): readers would take more than half of the loop. Those
    readers are fed by notifications that arrive a network round trip after each append,
    so a producer sharing the loop with them can never append within their busy time;
    below twice it, a steady stream to many readers (100 events/s to 100 followers) is
    woken at once instead of being held back for batching it does not need. An append
    after a quiet spell is never deferred.
    """

    __slots__ = (
        "_contended_within",
        "_loop",
        "_wake",
        "appended",
        "appended_before",
        "last_wake",
        "readers_parked",
        "scheduled",
    )

    def __init__(self, wake: Callable[[], None], *, contended_within: float = 1.0) -> None:
        self._wake = wake
        self._contended_within = contended_within
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of the first wake-up
        self.scheduled = False
        self.last_wake = float("-inf")  # the last wake-up
        self.readers_parked = float("-inf")  # a caught-up reader last went to wait
        # The two latest appends: their spacing tells a producer that outpaces its
        # readers' wake-ups from one that publishes now and then.
        self.appended = float("-inf")
        self.appended_before = float("-inf")

    def parked(self) -> None:
        """A reader has caught up and goes to wait."""
        self.readers_parked = time.perf_counter()

    def appended_now(self) -> None:
        """Something was appended: wake the readers soon (once, however many appends)."""
        now = time.perf_counter()
        self.appended_before, self.appended = self.appended, now
        if self.scheduled:
            return
        self.scheduled = True
        self._at(self.last_wake + WAKE_INTERVAL, now)

    def _due(self) -> None:
        now = time.perf_counter()
        busy = self.readers_parked - self.last_wake  # nan or inf until both have happened
        resume = self.readers_parked + 2 * busy
        contended = self.appended - self.appended_before < self._contended_within * busy
        if 0 < busy < MAX_WAKE_DEFERRAL and contended and resume > now:
            # Put off only while the producer keeps appending (or the readers have just
            # parked, when its next append is a round trip away).
            quiet_at = max(self.appended, self.readers_parked) + QUIET
            if quiet_at > now:
                self._at(min(resume, quiet_at), now)
                return
        self.scheduled = False
        self.last_wake = now
        self._wake()

    def _at(self, when: float, now: float) -> None:
        """Run `_due` at perf-counter time `when` (next tick if that has passed)."""
        loop = self._loop
        if loop is None:  # (looked up once: get_running_loop() is a getpid() system call)
            loop = self._loop = asyncio.get_running_loop()
        if when <= now:
            loop.call_soon(self._due)
        else:
            loop.call_later(when - now, self._due)
