"""Prometheus metrics of one app instance (its own registry, so several apps can coexist).

Every metric is documented in docs/operations.md ("Metrics"). The hot path (SSE
writes, appends) touches only plain numbers: `Tally` and `LagBuckets` are bumped
without prometheus_client's per-call lock (one event loop writes them) and exported at
scrape time by `_HotCollector`, as the same counter and histogram families. Labelled
counters are resolved once here, never per event. Backend counters that the bridge
keeps as plain integers (it imports no metrics code) are read at scrape time by
`_BridgeCollector`.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from itertools import accumulate
from typing import Final, Literal, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ..values import EndResult, GapReason
from .streaming.subscriptions import SubscriptionRegistry

CONTENT_TYPE = CONTENT_TYPE_LATEST

ResumeOutcome = Literal[
    "exact",
    "gap_trimmed",
    "gap_stream_removed",
    "gap_unknown_position",
    "malformed_cursor",
    "from_start",
]
RESUME_OUTCOMES: Final[tuple[ResumeOutcome, ...]] = get_args(ResumeOutcome)
GAP_REASONS: Final[tuple[GapReason, ...]] = get_args(GapReason)
ROUTE_KINDS: Final = ("producer", "subscriber", "sse", "sessions", "operator", "ops", "other")
LAG_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
SCAN_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class _BridgeCollector(Collector):
    """Reads the bridge's plain counters at scrape time (0 while no bridge is open)."""

    def __init__(self, bridge: Callable[[], object | None]) -> None:
        self._bridge = bridge

    def collect(self) -> Iterator[Metric]:
        bridge = self._bridge()
        reconnects = getattr(bridge, "notifier_reconnects", 0)
        unreplicated = getattr(bridge, "replica_ack_failures", 0)
        yield self._family(reconnects if isinstance(reconnects, int) else 0)
        yield self._unreplicated(unreplicated if isinstance(unreplicated, int) else 0)

    def describe(self) -> Iterator[Metric]:
        # names only: called at registration, before any bridge
        yield self._family(0)
        yield self._unreplicated(0)

    @staticmethod
    def _family(reconnects: int) -> Metric:
        return CounterMetricFamily(
            "gateway_redis_notifier_reconnects",
            "Times the Redis bridge's pub/sub (change notification) connection was "
            "re-established after it failed.",
            value=reconnects,
        )

    @staticmethod
    def _unreplicated(failures: int) -> Metric:
        return CounterMetricFamily(
            "gateway_redis_unreplicated_writes",
            "Writes answered 503 because fewer than min_replicas_acked Redis replicas "
            "confirmed them within replica_ack_timeout_seconds.",
            value=failures,
        )


class Tally:
    """A counter of the hot path: a plain number, exported by `_HotCollector`."""

    __slots__ = ("created", "doc", "name", "value")

    def __init__(self, name: str, doc: str) -> None:
        self.name, self.doc = name, doc
        self.value = 0
        self.created = time.time()

    def inc(self, amount: int = 1) -> None:
        self.value += amount

    def family(self) -> Metric:
        return CounterMetricFamily(self.name, self.doc, value=self.value, created=self.created)


class LagBuckets:
    """A histogram of the hot path: one count per bucket and a sum, exported by
    `_HotCollector` with cumulative buckets, as prometheus_client's `Histogram` is."""

    __slots__ = ("_bounds", "_counts", "_les", "_sum", "created", "doc", "name")

    def __init__(self, name: str, doc: str, bounds: Sequence[float]) -> None:
        self.name, self.doc = name, doc
        self._bounds = tuple(bounds)
        self._les = [*map(floatToGoString, self._bounds), "+Inf"]  # the buckets' labels
        self._counts = [0] * (len(self._bounds) + 1)  # the last: above every bound
        self._sum = 0.0
        self.created = time.time()

    def observe(self, value: float) -> None:
        self._counts[bisect_left(self._bounds, value)] += 1  # a bucket holds values <= le
        self._sum += value

    def family(self) -> Metric:
        family = HistogramMetricFamily(
            self.name,
            self.doc,
            buckets=list(zip(self._les, accumulate(self._counts), strict=True)),
            sum_value=self._sum,
        )
        family.add_sample(self.name + "_created", {}, self.created)
        return family


class _HotCollector(Collector):
    def __init__(self, metrics: Sequence[Tally | LagBuckets]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        for metric in self._metrics:
            yield metric.family()


class Metrics:
    def __init__(
        self,
        subscriptions: SubscriptionRegistry,
        bridge: Callable[[], object | None] = lambda: None,
    ) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self.open_subscribers = Gauge(
            "gateway_sse_open_subscribers",
            "Open SSE responses in this process.",
            registry=registry,
        )
        self.open_subscribers.set_function(lambda: subscriptions.open_sse)
        self.open_waits = Gauge(
            "gateway_wait_open_requests",
            "Open /wait requests in this process.",
            registry=registry,
        )
        self.open_waits.set_function(lambda: subscriptions.open_waits)
        self.events_published = Tally(
            "gateway_events_published",
            "Events appended through the producer API of this process.",
        )
        self.events_delivered = Tally(
            "gateway_events_delivered",
            "Data events written to SSE clients by this process.",
        )
        self.bytes_out = Tally(
            "gateway_sse_bytes_out",
            "Bytes of SSE body written to clients (every frame: retry, events, "
            "heartbeats, terminal frames).",
        )
        resumes = Counter(
            "gateway_sse_resumes",
            "SSE subscriptions started, by how their cursor was served (one per response).",
            ["outcome"],
            registry=registry,
        )
        self.resumes = {outcome: resumes.labels(outcome) for outcome in RESUME_OUTCOMES}
        gaps = Counter(
            "gateway_sse_gaps",
            "Gap frames served (the response ends after one), by reason.",
            ["reason"],
            registry=registry,
        )
        self.gaps = {reason: gaps.labels(reason) for reason in GAP_REASONS}
        self.drained = Counter(
            "gateway_sse_drained",
            "SSE responses ended by a graceful shutdown (drain).",
            registry=registry,
        )
        self.lag = LagBuckets(
            "gateway_sse_delivery_lag_seconds",
            "Per SSE write carrying events: write time minus the later of the newest "
            "event's publish time (its id's ms part) and the response's start.",
            LAG_BUCKETS,
        )
        registry.register(
            _HotCollector([self.events_published, self.events_delivered, self.bytes_out, self.lag])
        )
        self.fenced_writes = Counter(
            "gateway_fenced_writes",
            "Producer writes refused as fenced (stale or wrong producer token).",
            registry=registry,
        )
        self.writes_after_end = Counter(
            "gateway_writes_after_end",
            "Producer writes refused because the run log already ends (409 ended).",
            registry=registry,
        )
        self.recovery_ends = Counter(
            "gateway_recovery_ends",
            "producer_lost ENDs appended for runs whose lease expired.",
            registry=registry,
        )
        self.legacy_scans = Counter(
            "gateway_legacy_end_scans",
            "publish_end calls that ran the legacy END scan of the retained window.",
            registry=registry,
        )
        self.legacy_scan_seconds = Histogram(
            "gateway_legacy_end_scan_seconds",
            "Duration of publish_end calls that ran the legacy END scan (round trip).",
            buckets=SCAN_BUCKETS,
            registry=registry,
        )
        unavailable = Counter(
            "gateway_backend_unavailable",
            "Requests and SSE streams that failed because the backend was unreachable "
            "or erred (503 backend_unavailable, SSE unavailable frame), by route kind.",
            ["route_kind"],
            registry=registry,
        )
        self.backend_unavailable = {kind: unavailable.labels(kind) for kind in ROUTE_KINDS}
        registry.register(_BridgeCollector(bridge))

    def delivered(self, count: int) -> None:
        self.events_delivered.inc(count)

    def end_published(self, result: EndResult, started: float) -> None:
        """Account one `publish_end` call that began at `started` (`time.perf_counter()`)."""
        if result.legacy_scanned:
            self.legacy_scans.inc()
            self.legacy_scan_seconds.observe(time.perf_counter() - started)

    def unavailable(self, route_kind: str) -> None:
        self.backend_unavailable.get(route_kind, self.backend_unavailable["other"]).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
