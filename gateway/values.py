"""Value types shared by every layer: what a subscription yields and what writes return.

This is a leaf module: it imports nothing from the package, and everything may import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias, get_args

import orjson

EndStatus: TypeAlias = Literal["success", "error", "cancelled", "interrupted", "producer_lost"]
END_STATUSES: Final[frozenset[str]] = frozenset(get_args(EndStatus))

# `unknown_position`: the cursor is not an id this log handed out (it was lost in a
# failover or a restart, or belongs to an earlier life of the run id): see bridge/rules.py.
GapReason: TypeAlias = Literal["trimmed", "stream_removed", "unknown_position", "bridge_closed"]


class RawJSON(bytes):
    """Payload bytes the caller already encoded as compact JSON: published as they are."""


# U+2028, U+2029 and U+0085 in UTF-8. Line splitters such as `str.splitlines()` break
# lines at them, so written raw inside a `data:` line they would let a payload forge an
# `id:` or `event:` line. Their lead bytes never occur inside another character.
_LINE_BREAKS: Final = (
    (b"\xe2\x80\xa8", b"\\u2028"),
    (b"\xe2\x80\xa9", b"\\u2029"),
    (b"\xc2\x85", b"\\u0085"),
)


def escape_line_breaks(encoded: bytes) -> bytes:
    """`encoded` JSON with U+2028, U+2029 and U+0085 written as `\\uXXXX` (same value)."""
    if b"\xe2\x80" not in encoded and b"\xc2\x85" not in encoded:
        return encoded
    for raw, escaped in _LINE_BREAKS:
        encoded = encoded.replace(raw, escaped)
    return encoded


def encode_json(value: Any) -> bytes:
    """Compact JSON, the one encoding used for payloads on the wire and in Redis.

    Never holds a raw U+2028, U+2029 or U+0085 (see `escape_line_breaks`).
    """
    if isinstance(value, RawJSON):
        return escape_line_breaks(bytes(value))
    return escape_line_breaks(orjson.dumps(value))


def encode_nested(value: Any, depth: int) -> bytes:
    """`encode_json(value)`, raising TypeError unless `value` also encodes `depth`
    containers deep inside another document (the encoder refuses nesting beyond a fixed
    limit, so a value that encodes alone may not once stored inside a record)."""
    wrapped = value
    for _ in range(depth):
        wrapped = [wrapped]
    return encode_json(wrapped)[depth : -depth or None]


@dataclass(slots=True)
class StreamEvent:
    """One event of a run log. `data` is the compact JSON encoded once at publish.

    `id`, `event` and `data` never change once made (equality and hash are theirs).
    `wire` is a memo, not part of the value: the SSE layer stores the event's frame there
    the first time it writes it, so an event fanned out to many subscribers is framed
    once, not once per subscriber.
    """

    id: str
    event: str
    data: bytes
    wire: bytes | None = field(default=None, init=False, compare=False, repr=False)

    def __hash__(self) -> int:
        return hash((self.id, self.event, self.data))

    def value(self) -> Any:
        """The decoded JSON payload (a fresh object on every call)."""
        return orjson.loads(self.data)


@dataclass(frozen=True, slots=True)
class StreamGap:
    """The reader's position is no longer retained; the subscription ends after this.

    Bounds are the retained ids when the gap was detected, both None when nothing is.
    """

    requested_event_id: str | None
    earliest_available_event_id: str | None
    latest_available_event_id: str | None
    reason: GapReason


@dataclass(frozen=True, slots=True)
class End:
    """The terminal entry of a run log; the subscription ends after this."""

    status: EndStatus
    error: Any = None
    id: str | None = None


class Heartbeat:
    """Yielded after `heartbeat_interval` idle seconds; carries nothing."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "HEARTBEAT"


HEARTBEAT: Final = Heartbeat()

StreamItem: TypeAlias = StreamEvent | StreamGap | Heartbeat | End


@dataclass(frozen=True, slots=True)
class Claim:
    """A producer lease: present `token` on every write; `epoch` grows with each takeover."""

    run_id: str
    session_id: str | None
    token: str
    epoch: int
    lease_expires_at: float  # unix seconds


@dataclass(frozen=True, slots=True)
class PublishResult:
    ids: tuple[str, ...]
    cancel_requested: bool
    session_id: str | None = None  # the run's session, so callers can update its turn
    # A numbered batch's leading events that had been applied before (a retry, a resent
    # streaming append): `ids` starts with the ids first assigned to them, and they were
    # not appended again, so callers must not count or record them again.
    already_applied: int = 0

    @property
    def duplicate(self) -> bool:
        """Nothing was appended: the whole batch had been applied before."""
        return self.already_applied == len(self.ids)

    @property
    def appended(self) -> int:
        return len(self.ids) - self.already_applied


@dataclass(frozen=True, slots=True)
class EndResult:
    # None for a recovery END that wrote no log entry: either the run had no log (its
    # record alone is marked ended, `applied`) or nothing is known of it (a no-op).
    id: str | None
    deduplicated: bool
    session_id: str | None = None
    applied: bool = True
    # True when this call ran the legacy END scan of the retained window (Redis only,
    # `legacy_end_scan_enabled` and a non-END tail); it cost O(retained bytes) in Redis.
    legacy_scanned: bool = False


@dataclass(frozen=True, slots=True)
class LeaseState:
    lease_expires_at: float
    cancel_requested: bool


RunStatus: TypeAlias = Literal["running"] | EndStatus


@dataclass(frozen=True, slots=True)
class RunInfo:
    """The run record: what `GET /v1/runs/{id}` reports. Times are unix seconds."""

    run_id: str
    session_id: str | None
    status: RunStatus
    created_at: float
    updated_at: float
    first_event_id: str | None
    last_event_id: str | None
    retained_events: int
    cancel_requested: bool
    epoch: int
    lease_expires_at: float
    log_exists: bool
    error: Any = None

    @property
    def ended(self) -> bool:
        return self.status != "running"
