"""Prometheus metrics of one app instance (its own registry, so several apps can coexist).

Basic set for now: open SSE subscribers, open `/wait` calls, events published, events
delivered to SSE clients, recovery ENDs appended. The operations work adds more here.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from .subscriptions import SubscriptionRegistry

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self, subscriptions: SubscriptionRegistry) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.open_subscribers = Gauge(
            "gateway_sse_open_subscribers",
            "Open SSE responses in this process.",
            registry=self.registry,
        )
        self.open_subscribers.set_function(lambda: subscriptions.open_sse)
        self.open_waits = Gauge(
            "gateway_wait_open_requests",
            "Open /wait requests in this process.",
            registry=self.registry,
        )
        self.open_waits.set_function(lambda: subscriptions.open_waits)
        self.events_published = Counter(
            "gateway_events_published",
            "Events appended through the producer API of this process.",
            registry=self.registry,
        )
        self.events_delivered = Counter(
            "gateway_events_delivered",
            "Data events written to SSE clients by this process.",
            registry=self.registry,
        )
        self.recovery_ends = Counter(
            "gateway_recovery_ends",
            "producer_lost ENDs appended for runs whose lease expired.",
            registry=self.registry,
        )

    def delivered(self, count: int) -> None:
        self.events_delivered.inc(count)

    def render(self) -> bytes:
        return generate_latest(self.registry)
