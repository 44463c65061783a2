"""Unit tests of `gateway.timing.deadlines`: a `Signal` wakes its waiters, a deadline ends
a wait no earlier than asked and within its bucket, and waits due in the same slot share
one bucket (one timer). A `CallDeadline` stops a call that outlasts it with TimeoutError,
no earlier than asked, leaves a call that ends in time alone, and never turns a
cancellation from elsewhere into a timeout.

The deadline tests wait in real time, briefly and bounded: what they check is when the
loop's timer fires, which no event can stand in for.
"""

from __future__ import annotations

import asyncio

import anyio
import pytest

from gateway.timing.deadlines import (
    DEADLINE_RESOLUTION,
    CallDeadline,
    CallDeadlines,
    Deadlines,
    Signal,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]

FAR = 30.0  # a deadline no test waits for: seconds from now


async def test_a_fired_signal_wakes_every_waiter() -> None:
    loop = asyncio.get_running_loop()
    deadlines, signal = Deadlines(loop), Signal()
    waits = [
        asyncio.ensure_future(signal.wait_until(deadlines, loop.time() + FAR)) for _ in range(3)
    ]
    await asyncio.sleep(0)  # every waiter is parked on its future
    assert not any(w.done() for w in waits)
    signal.fire()
    with anyio.fail_after(1):  # far sooner than FAR: the fire woke them, not a timer
        assert await asyncio.gather(*waits) == [True, True, True]
    deadlines.cancel()


async def test_a_signal_fired_before_the_wait_returns_at_once() -> None:
    loop = asyncio.get_running_loop()
    deadlines, signal = Deadlines(loop), Signal()
    signal.fire()
    deadline = loop.time() + FAR
    with anyio.fail_after(1):
        assert await signal.wait_until(deadlines, deadline) is True
    other = loop.create_future()
    assert deadlines.add(deadline, other) == {other}  # nothing was parked in its bucket
    deadlines.cancel()


async def test_a_deadline_ends_the_wait_within_its_bucket() -> None:
    loop = asyncio.get_running_loop()
    deadlines, signal = Deadlines(loop), Signal()
    deadline = loop.time() + 0.05
    with anyio.fail_after(2):
        fired = await signal.wait_until(deadlines, deadline)
    woke = loop.time()
    assert fired is False
    assert woke >= deadline  # never early: deadlines are rounded up to their slot
    # Late by at most the slot, plus the loop's own lateness on a busy machine.
    assert woke < deadline + DEADLINE_RESOLUTION + 0.5


async def test_waits_due_in_the_same_slot_share_one_bucket() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(loop)
    slot_start = (int((loop.time() + FAR) / DEADLINE_RESOLUTION) + 1) * DEADLINE_RESOLUTION
    a, b, c = (loop.create_future() for _ in range(3))
    bucket = deadlines.add(slot_start + DEADLINE_RESOLUTION * 0.2, a)
    assert deadlines.add(slot_start + DEADLINE_RESOLUTION * 0.8, b) is bucket
    later = deadlines.add(slot_start + DEADLINE_RESOLUTION * 1.5, c)
    assert later is not bucket
    assert bucket == {a, b} and later == {c}
    deadlines.cancel()


async def test_a_waiter_that_leaves_is_dropped_from_its_bucket() -> None:
    loop = asyncio.get_running_loop()
    deadlines, signal = Deadlines(loop), Signal()
    deadline = loop.time() + FAR
    wait = asyncio.ensure_future(signal.wait_until(deadlines, deadline))
    await asyncio.sleep(0)
    wait.cancel()
    with anyio.fail_after(1):
        await asyncio.wait([wait])
    assert wait.cancelled()
    other = loop.create_future()
    assert deadlines.add(deadline, other) == {other}  # the cancelled waiter left it
    signal.fire()  # no waiter left to wake: nothing to trip over
    deadlines.cancel()


async def test_a_wait_woken_by_its_deadline_is_not_woken_again_by_the_signal() -> None:
    loop = asyncio.get_running_loop()
    deadlines, signal = Deadlines(loop), Signal()
    with anyio.fail_after(2):
        assert await signal.wait_until(deadlines, loop.time() + 0.01) is False
    signal.fire()  # the timed-out waiter left the signal: no set_result on a done future
    with anyio.fail_after(1):
        assert await signal.wait_until(deadlines, loop.time() + FAR) is True


async def test_a_call_that_outlasts_its_deadline_gets_a_timeout_no_earlier() -> None:
    loop = asyncio.get_running_loop()
    deadlines = CallDeadlines(0.05)
    started = loop.time()
    with anyio.fail_after(2), pytest.raises(TimeoutError), deadlines.start():
        await asyncio.Event().wait()  # a call that never answers
    stopped = loop.time()
    assert stopped >= started + 0.05
    assert stopped < started + 0.05 + DEADLINE_RESOLUTION + 0.5
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # its cancellation was taken back


async def test_a_call_that_ends_in_time_is_left_alone_when_its_slot_passes() -> None:
    deadlines = CallDeadlines(0.02)
    with deadlines.start() as call:
        await asyncio.sleep(0)
    with anyio.fail_after(2):
        # Past the slot the call's deadline fell in: its timer fired with nobody in it.
        await asyncio.sleep(0.02 + 2 * DEADLINE_RESOLUTION)
    assert deadlines._slots is not None and not deadlines._slots._buckets  # its timer ran
    assert not call.expired
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_a_cancellation_from_elsewhere_is_never_made_a_timeout() -> None:
    deadlines = CallDeadlines(FAR)
    calls: list[CallDeadline] = []
    inside = asyncio.Event()

    async def call() -> None:
        with deadlines.start() as deadline:
            calls.append(deadline)
            inside.set()
            await asyncio.Event().wait()

    for expired_too in (False, True):
        inside.clear()
        task = asyncio.ensure_future(call())
        await inside.wait()
        if expired_too:
            calls[-1].expire()  # its deadline passes as the caller cancels it
        task.cancel()
        with anyio.fail_after(1):
            await asyncio.wait([task])
        assert task.cancelled(), expired_too  # CancelledError, not TimeoutError
