"""The public library surface (`gateway.__all__`) is pinned: a name added to it or taken
out of it is a decision this test makes visible, not a side effect of an import."""

from __future__ import annotations

import pytest

import gateway

pytestmark = pytest.mark.timeout(10)

PUBLIC = {
    "END_STATUSES",
    "HEARTBEAT",
    "BackendUnavailable",
    "BridgeClosed",
    "Claim",
    "End",
    "EndResult",
    "EndStatus",
    "GapReason",
    "GatewayError",
    "Heartbeat",
    "InvalidInput",
    "LeaseState",
    "MalformedCursor",
    "MemoryStreamBridge",
    "PayloadTooLarge",
    "ProducerFenced",
    "PublishResult",
    "RedisStreamBridge",
    "RunInfo",
    "RunNotFound",
    "RunOwned",
    "SequenceConflict",
    "SequenceGap",
    "SequenceRefused",
    "Settings",
    "StreamBridge",
    "StreamEnded",
    "StreamEvent",
    "StreamGap",
    "StreamItem",
    "open_bridge",
    "parse_cursor",
    "try_parse_cursor",
}


def test_the_public_names_are_the_pinned_ones() -> None:
    assert set(gateway.__all__) == PUBLIC
    assert len(gateway.__all__) == len(PUBLIC)  # no name listed twice


def test_every_public_name_resolves() -> None:
    for name in gateway.__all__:
        assert getattr(gateway, name) is not None
