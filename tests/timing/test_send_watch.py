"""Unit tests of the SSE send timeout (`gateway.timing.send_watch.SendWatch`): a send left
pending for its writer's timeout is noticed within about 1.25x that timeout, a send that
ends in time never is, and writers with different timeouts are each held to their own.

Timeouts here are a fraction of a second and every wait is bounded: what is checked is
when the watch's timer notices, which no event can stand in for. Each test makes its own
watch (not `SendWatch.of`), so no test sees another's writers.
"""

from __future__ import annotations

import asyncio

import anyio
import pytest

from gateway.timing.send_watch import SendWatch

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(10)]


class Writer:
    """A response as the watch sees it: records when it was told its send stalled."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.timed_out = asyncio.Event()
        self.told_at: float | None = None

    def send_timed_out(self) -> None:
        if self.told_at is None:
            self.told_at = asyncio.get_running_loop().time()
        self.timed_out.set()


async def test_a_stalled_send_is_noticed_after_its_timeout() -> None:
    loop = asyncio.get_running_loop()
    watch, writer = SendWatch(loop), Writer(0.2)
    began = loop.time()
    watch.begin(writer)
    assert watch.sending(writer)
    with anyio.fail_after(2):
        await writer.timed_out.wait()
    assert writer.told_at is not None
    waited = writer.told_at - began
    assert waited >= 0.2  # never before the timeout
    assert waited < 0.2 * 1.25 + 0.5  # a tick after it (plus a busy loop's lateness)
    watch.end(writer)
    assert not watch.sending(writer)


async def test_a_send_that_ends_in_time_is_never_noticed() -> None:
    loop = asyncio.get_running_loop()
    watch = SendWatch(loop)
    stalled, prompt = Writer(0.2), Writer(0.2)
    watch.begin(stalled)  # the clock of this test: it will be noticed
    watch.begin(prompt)
    watch.end(prompt)  # its send completed at once
    assert not watch.sending(prompt)
    with anyio.fail_after(2):
        await stalled.timed_out.wait()
    assert not prompt.timed_out.is_set()


async def test_each_writer_is_held_to_its_own_timeout() -> None:
    loop = asyncio.get_running_loop()
    watch = SendWatch(loop)
    slow, quick = Writer(0.6), Writer(0.1)
    began = loop.time()
    watch.begin(slow)  # the first begin arms the tick, for the slow writer's timeout...
    watch.begin(quick)  # ...and the quick one is still noticed at that tick, alone
    with anyio.fail_after(2):
        await quick.timed_out.wait()
    assert not slow.timed_out.is_set()
    with anyio.fail_after(2):
        await slow.timed_out.wait()
    assert quick.told_at is not None and slow.told_at is not None
    assert quick.told_at - began >= 0.1 and slow.told_at - began >= 0.6


async def test_one_watch_serves_every_response_on_a_loop() -> None:
    loop = asyncio.get_running_loop()
    assert SendWatch.of(loop) is SendWatch.of(loop)
