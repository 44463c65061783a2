"""The subscription registry's per-reader share of open streams (offline)."""

from __future__ import annotations

import pytest

from gateway.errors import TooManyStreams
from gateway.http.serve.connections import subject_stream_limit
from gateway.http.streaming.subscriptions import SubscriptionRegistry
from gateway.settings import Settings

pytestmark = pytest.mark.timeout(10)


def test_a_reader_is_admitted_up_to_its_share_and_again_once_one_closes() -> None:
    registry = SubscriptionRegistry(subject_limit=2)
    first, second = registry.track("r1", "sse", "sub:a"), registry.track("r2", "wait", "sub:a")
    first.__enter__()
    registry.admit("sub:a")
    second.__enter__()
    with pytest.raises(TooManyStreams):
        registry.admit("sub:a")
    registry.admit("sub:b")  # another reader is not held up
    registry.admit(None)  # open mode: no share
    assert registry.open_of("sub:a") == 2 and registry.total == 2
    first.__exit__(None, None, None)
    registry.admit("sub:a")
    second.__exit__(None, None, None)
    assert registry.open_of("sub:a") == 0 and registry.total == 0


def test_without_a_limit_nobody_is_refused() -> None:
    registry = SubscriptionRegistry()
    for _ in range(100):
        registry.admit("sub:a")
        registry.track("r1", "sse", "sub:a").__enter__()


@pytest.mark.parametrize(
    ("cap", "share", "limit"), [(1000, 0.1, 100), (10, 0.4, 4), (5, 0.1, 1), (7, 1.0, 7)]
)
def test_the_limit_is_the_share_of_the_connection_cap(cap: int, share: float, limit: int) -> None:
    settings = Settings(max_connections=cap, subject_stream_share=share)
    assert subject_stream_limit(settings) == limit
