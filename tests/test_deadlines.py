"""Unit tests of the memory bridge's timed waits (`gateway.bridge.deadlines`): a `Signal`
wakes its waiters, a deadline ends a wait no earlier than asked and within its bucket,
and waits due in the same slot share one bucket (one timer).

The deadline tests wait in real time, briefly and bounded: what they check is when the
loop's timer fires, which no event can stand in for.
"""

from __future__ import annotations

import asyncio

import anyio
import pytest

from gateway.bridge.deadlines import DEADLINE_RESOLUTION, Deadlines, Signal

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
