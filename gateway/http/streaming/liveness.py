"""Producer liveness (docs/protocol.md §5): runs whose producer vanished get an END.

One background task per app (in the lifespan task group) looks, every heartbeat
interval, at the runs this process has subscribers or waiters on. A run still
`running` whose lease has expired gets the unowned recovery END (`producer_lost`,
`producer_token=None`); the bridge re-checks the lease atomically, so a producer that
renewed in between keeps its run and a concurrent gateway's END is deduplicated.
Failures are logged and retried at the next tick; they never end a subscription.

A streamed append whose connection drops is faster (`DropWatch`): the lease is cut in
the backend to end `producer_lost_grace_seconds` later (`bridge.cut_lease`), and this
process checks the run once then, through the same recovery END. The grace lives in the
backend, not in this process: a producer that reconnects to any gateway and writes
renews the whole lease, and the check here then finds it renewed and does nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from anyio.abc import TaskGroup

from ...bridge.base import StreamBridge
from ...errors import GatewayError, ProducerFenced
from ...sessions.base import SessionStore
from ..edge.observe import lifecycle
from ..metrics import Metrics
from .subscriptions import SubscriptionRegistry

log = logging.getLogger(__name__)


async def check_run(
    bridge: StreamBridge,
    run_id: str,
    metrics: Metrics | None = None,
    sessions: SessionStore | None = None,
) -> bool:
    """Append the recovery END if the run's lease has expired; True when one was added."""
    info = await bridge.get_run(run_id)
    if info is None or info.ended or info.lease_expires_at > time.time():
        return False
    return await _recover(bridge, run_id, metrics)


async def _recover(bridge: StreamBridge, run_id: str, metrics: Metrics | None) -> bool:
    """The unowned recovery END (the bridge re-checks that the lease has expired)."""
    started = time.perf_counter()
    result = await bridge.publish_end(run_id, "producer_lost", producer_token=None)
    if metrics is not None:
        metrics.end_published(result, started)
    # `id` is None when the run had no log: its record alone was marked ended.
    if result.applied and not result.deduplicated:
        lifecycle(
            "recovery_end",
            "producer lease expired without END; appended producer_lost",
            level=logging.WARNING,
            run_id=run_id,
            end_id=result.id,
        )
        if metrics is not None:
            metrics.recovery_ends.inc()
        return True
    return False


async def monitor(
    bridge: StreamBridge,
    subscriptions: SubscriptionRegistry,
    interval: float,
    metrics: Metrics | None = None,
    sessions: SessionStore | None = None,
) -> None:
    """Run until cancelled, checking watched runs every `interval` seconds."""
    while True:
        await anyio.sleep(interval)
        for run_id in subscriptions.watched_runs():
            try:
                await check_run(bridge, run_id, metrics, sessions)
            except GatewayError as exc:  # fenced (renewed meanwhile), closed, unavailable
                log.debug("liveness check of run %s: %r", run_id, exc)
            except OSError as exc:
                log.warning("liveness check of run %s failed: %r", run_id, exc)


# After the cut lease's end, the check waits this much more: the backend's clock and this
# process's may differ by a few milliseconds (and Redis rounds to them). If the backend
# still counts the lease live, the check is tried again, later each time (about 3 s in
# all); then the periodic monitor, and every gateway with readers of the run, remain.
_CHECK_SLACK = 0.05
_CHECK_ATTEMPTS = 6
# A renewal this much before this process saw the drop counts as after it: the producer
# may learn of the broken connection (and renew elsewhere) a moment before we do.
_DROP_TOLERANCE = 0.05


class DropWatch:
    """Runs whose streamed append dropped, each checked once its cut lease ends.

    `dropped` is called from the request's task and returns at once; the work (the cut,
    the wait, the check) runs in the watch's own task group, which `open_drop_watch`
    owns: leaving it cancels whatever is still waiting (the monitor, and other gateways,
    still end such a run when its lease lapses).
    """

    def __init__(
        self, bridge: StreamBridge, grace: float, tg: TaskGroup, metrics: Metrics | None
    ) -> None:
        self._bridge = bridge
        self._grace = grace
        self._tg = tg
        self._metrics = metrics

    def dropped(self, run_id: str, token: str, stream: str, last_id: str | None) -> None:
        """The connection of streamed append `stream` (of `token`) broke mid-body;
        `last_id`: the last event it appended (a write since keeps the lease)."""
        self._tg.start_soon(self._follow, run_id, token, stream, last_id, time.monotonic())

    async def _follow(
        self, run_id: str, token: str, stream: str, last_id: str | None, seen: float
    ) -> None:
        try:
            ends = await self._bridge.cut_lease(
                run_id,
                producer_token=token,
                stream=stream,
                grace=self._grace,
                last_id=last_id,
                # a renewal after the drop keeps the lease (only a duration crosses over)
                dropped_ago=time.monotonic() - seen + _DROP_TOLERANCE,
            )
            if ends is None:  # already ended, or the producer is back with a new stream
                return
            lifecycle(
                "producer_dropped",
                "a streamed append's connection dropped; the lease now ends after the grace",
                run_id=run_id,
                grace_seconds=self._grace,
            )
            await anyio.sleep(max(0.0, ends - time.time()) + _CHECK_SLACK)
            for attempt in range(_CHECK_ATTEMPTS):
                info = await self._bridge.get_run(run_id)
                # (Both in this process's clock, each from what Redis said was left: a
                # renewal moves the end by a whole lease, far more than the slack.)
                if info is None or info.ended or info.lease_expires_at > ends + _CHECK_SLACK:
                    return  # ended, or renewed by a write (here or on another gateway)
                try:
                    await _recover(self._bridge, run_id, self._metrics)
                    return
                except ProducerFenced:
                    # The backend still counts the lease live (what was left of it was
                    # measured a round trip ago). A little later: it decides by its clock.
                    await anyio.sleep(_CHECK_SLACK * 2**attempt)
        except GatewayError as exc:  # closed, unavailable
            log.debug("dropped stream of run %s: %r", run_id, exc)
        except OSError as exc:
            log.warning("dropped stream of run %s: check failed: %r", run_id, exc)


@asynccontextmanager
async def open_drop_watch(
    bridge: StreamBridge, grace: float, metrics: Metrics | None = None
) -> AsyncIterator[DropWatch]:
    """A `DropWatch` whose checks run in a task group of its own, cancelled on exit."""
    async with anyio.create_task_group() as tg:
        try:
            yield DropWatch(bridge, grace, tg, metrics)
        finally:
            tg.cancel_scope.cancel()
