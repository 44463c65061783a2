"""Producer liveness (docs/protocol.md §5): runs whose producer vanished get an END.

One background task per app (in the lifespan task group) looks, every heartbeat
interval, at the runs this process has subscribers or waiters on. A run still
`running` whose lease has expired gets the unowned recovery END (`producer_lost`,
`producer_token=None`); the bridge re-checks the lease atomically, so a producer that
renewed in between keeps its run and a concurrent gateway's END is deduplicated.
Failures are logged and retried at the next tick; they never end a subscription.
"""

from __future__ import annotations

import logging
import time

import anyio

from ...bridge.base import StreamBridge
from ...errors import GatewayError
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
