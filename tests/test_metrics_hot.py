"""The hot path's plain metrics (`Tally`, `LagBuckets`) scrape exactly as
prometheus_client's own `Counter` and `Histogram` would, fed the same values."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.http.metrics import LAG_BUCKETS, LagBuckets, Metrics
from gateway.http.subscriptions import SubscriptionRegistry

pytestmark = pytest.mark.timeout(30)

# On a bound, between bounds, below the first, above the last, and zero.
LAGS = (0.0, 0.005, 0.0051, 0.01, 0.3, 1.0, 59.9, 60.0, 61.0, 0.001)


def samples(text: bytes) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample but the `_created` timestamps, which differ by construction time."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


def test_hot_metrics_scrape_as_prometheus_client_metrics() -> None:
    metrics = Metrics(SubscriptionRegistry())
    reference = CollectorRegistry()
    delivered = Counter("gateway_events_delivered", "d", registry=reference)
    lag = Histogram(
        "gateway_sse_delivery_lag_seconds", "l", buckets=LAG_BUCKETS, registry=reference
    )
    for count in (1, 3, 7):
        metrics.delivered(count)
        delivered.inc(count)
    for value in LAGS:
        metrics.lag.observe(value)
        lag.observe(value)
    ours = samples(metrics.render())
    theirs = samples(generate_latest(reference))
    assert theirs.items() <= ours.items()
    assert ours[("gateway_sse_delivery_lag_seconds_count", frozenset())] == len(LAGS)


def test_lag_buckets_count_a_value_on_a_bound_in_that_bucket() -> None:
    buckets = LagBuckets("lag", "l", (1.0, 2.0))
    for value in (1.0, 2.0, 2.5):
        buckets.observe(value)
    family = buckets.family()
    counts = {s.labels["le"]: s.value for s in family.samples if s.name == "lag_bucket"}
    assert counts == {"1.0": 1, "2.0": 2, "+Inf": 3}
    created = [s for s in family.samples if s.name == "lag_created"]
    assert [s.value for s in created] == [buckets.created]
