"""gateway: a resumable streaming gateway for AI-agent runs (Redis-backed SSE).

The public library surface: the two stream bridges, the provider that builds one from
settings, the value types a subscription yields, the cursor parser and the error tree.
"""

from .bridge.base import StreamBridge
from .bridge.memory import MemoryStreamBridge
from .bridge.provider import open_bridge
from .cursor import MalformedCursor, parse_cursor, try_parse_cursor
from .errors import (
    BackendUnavailable,
    BridgeClosed,
    GatewayError,
    InvalidInput,
    PayloadTooLarge,
    ProducerFenced,
    RunNotFound,
    RunOwned,
    SequenceConflict,
    SequenceGap,
    SequenceRefused,
    StreamEnded,
)
from .redis.bridge import RedisStreamBridge
from .settings import Settings
from .values import (
    END_STATUSES,
    HEARTBEAT,
    Claim,
    End,
    EndResult,
    EndStatus,
    GapReason,
    Heartbeat,
    LeaseState,
    PublishResult,
    RunInfo,
    StreamEvent,
    StreamGap,
    StreamItem,
)

__all__ = [
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
]
