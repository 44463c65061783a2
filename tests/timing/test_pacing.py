"""The Redis feed's wake-up pacing (`contended_within=2`): readers are woken at
once when appends come more than twice their busy time apart, and batched (the wake-up
put off) when appends come closer than that, for as long as the producer keeps
appending: once it goes quiet the readers run (the loop would otherwise idle)."""

from __future__ import annotations

import time

import anyio
import pytest

from gateway.timing import pacing
from gateway.timing.pacing import WakePacer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

BUSY = 0.04  # seconds the readers take after each wake-up (blocking the loop, as they do)


async def delay_of_second_wake(spacing: float, *, keep_appending: bool = False) -> float:
    """Append, let the readers be busy for BUSY, append again `spacing` after the first
    (and with `keep_appending`, every millisecond after that); how long after that
    second append the readers are woken."""
    woken: list[float] = []
    first_wake = anyio.Event()
    second_wake = anyio.Event()

    def wake() -> None:
        woken.append(time.perf_counter())
        if len(woken) == 1:
            time.sleep(BUSY)  # the readers' work, on the loop
            pacer.parked()
            first_wake.set()
        else:
            second_wake.set()

    pacer = WakePacer(wake, contended_within=2.0)
    first = time.perf_counter()
    pacer.appended_now()
    with anyio.fail_after(5):
        await first_wake.wait()
    await anyio.sleep(max(0.0, first + spacing - time.perf_counter()))
    appended = time.perf_counter()
    pacer.appended_now()

    async def producer() -> None:
        while not second_wake.is_set():
            await anyio.sleep(0.001)
            pacer.appended_now()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            if keep_appending:
                tg.start_soon(producer)
            await second_wake.wait()
    return woken[1] - appended


async def test_appends_far_apart_wake_readers_at_once() -> None:
    # 100 ms apart, readers busy 40 ms: they take well under half the loop. Holding the
    # wake-up to 2 x busy after they parked would put it off by about 20 ms.
    assert await delay_of_second_wake(0.1) < 0.012


async def test_appends_closer_than_twice_the_busy_time_are_batched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 60 ms apart, readers busy 40 ms, and the producer goes on appending: the wake-up
    # waits until 2 x busy after they parked (about 60 ms from the append), so readers
    # take bigger batches. The producer appends every millisecond, but a loaded machine
    # can hold this process off the CPU for longer than QUIET (2 ms), which would rightly
    # count as a producer gone quiet: here only 50 ms without an append does.
    monkeypatch.setattr(pacing, "QUIET", 0.05)
    assert await delay_of_second_wake(0.06, keep_appending=True) > 0.03


async def test_a_producer_that_goes_quiet_is_not_waited_for() -> None:
    # The same spacing, but nothing follows the second append: the readers run about
    # QUIET (2 ms) after it, not 60 ms later.
    assert await delay_of_second_wake(0.06) < 0.012
