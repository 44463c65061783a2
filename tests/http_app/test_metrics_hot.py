"""The hot path's plain metrics (`Tally`, `LagBuckets`) scrape exactly as
prometheus_client's own `Counter` and `Histogram` would, fed the same values."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.http.metrics import LAG_BUCKETS, LagBuckets, Metrics, Tally
from gateway.http.streaming.subscriptions import SubscriptionRegistry

pytestmark = pytest.mark.timeout(30)

# On a bound, between bounds, below the first, above the last, and zero.
LAGS = (0.0, 0.005, 0.0051, 0.01, 0.3, 1.0, 59.9, 60.0, 61.0, 0.001)


def scrape(text: bytes) -> dict[str, tuple[str, str, dict[Any, float]]]:
    """Each family's type, help and samples; `_created` samples only as present (their
    values are construction times)."""
    families = {}
    for family in text_string_to_metric_families(text.decode()):
        samples = {
            (s.name, frozenset(s.labels.items())): 1.0 if s.name.endswith("_created") else s.value
            for s in family.samples
        }
        families[family.name] = (family.type, family.documentation, samples)
    return families


def test_hot_metrics_scrape_as_prometheus_client_metrics() -> None:
    metrics = Metrics(SubscriptionRegistry())
    reference = CollectorRegistry()
    counters = {
        tally: Counter(tally.name, tally.doc, registry=reference)
        for tally in (metrics.events_published, metrics.events_delivered, metrics.bytes_out)
    }
    lag = Histogram(metrics.lag.name, metrics.lag.doc, buckets=LAG_BUCKETS, registry=reference)
    for count in (1, 3, 7):
        for tally, counter in counters.items():
            tally.inc(count)
            counter.inc(count)
    for value in LAGS:
        metrics.lag.observe(value)
        lag.observe(value)
    ours = scrape(metrics.render())
    theirs = scrape(generate_latest(reference))
    assert len(theirs) == 8  # three counters, the histogram, and their `_created` gauges
    assert {name: ours.get(name) for name in theirs} == theirs
    count = ours["gateway_sse_delivery_lag_seconds"][2]
    assert count[("gateway_sse_delivery_lag_seconds_count", frozenset())] == len(LAGS)


def test_counter_created_is_when_the_tally_was_made() -> None:
    tally = Tally("things", "t")
    samples = {s.name: s.value for s in tally.family().samples}
    assert samples == {"things_total": 0, "things_created": tally.created}


def test_lag_buckets_count_a_value_on_a_bound_in_that_bucket() -> None:
    buckets = LagBuckets("lag", "l", (1.0, 2.0))
    for value in (1.0, 2.0, 2.5):
        buckets.observe(value)
    family = buckets.family()
    counts = {s.labels["le"]: s.value for s in family.samples if s.name == "lag_bucket"}
    assert counts == {"1.0": 1, "2.0": 2, "+Inf": 3}
    created = [s for s in family.samples if s.name == "lag_created"]
    assert [s.value for s in created] == [buckets.created]
