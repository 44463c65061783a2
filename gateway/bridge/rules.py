"""The cursor, gap and input rules of the bridge contract, decided once for both backends.

Backends store, append, read a range and report the boundaries of a run's log
(`Bounds`); what a cursor means, whether a reader missed something and what a write may
carry is decided here, so memory and Redis give the same answer to the same input.

The boundary that gap detection rests on is the log's *floor*: an id such that every
event ever appended to the run with a larger id is still retained. Trimming raises the
floor to the newest trimmed id; removing a log (operator `DELETE`, session retirement,
expiry, eviction) and writing again starts a new log whose floor is the last id the run
had handed out, so ids never repeat and every reader positioned before the removal point
gets a gap. A reader positioned at or after the floor has missed nothing; one before it
has, and gets a gap (never a silent partial replay).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from ..cursor import UINT64_MAX, EventKey, MalformedCursor, format_key, parse_cursor
from ..errors import InvalidInput
from ..names import check_event_name
from ..values import GapReason, StreamGap, encode_json


@dataclass(frozen=True, slots=True)
class Bounds:
    """What a backend knows about one run log when a reader looks at it.

    `floor`: every event of the run with a larger id is retained; None when nothing was
    ever removed. `trimmed`: this log itself dropped events (the floor is a trim point),
    as opposed to a floor inherited from an earlier, removed log. `first`/`last`: the
    retained event ids (None when no event is retained).
    """

    floor: EventKey | None
    trimmed: bool
    first: str | None
    last: str | None


def predecessor(key: EventKey) -> EventKey:
    """The largest id smaller than `key` (ids are (ms, seq) pairs of uint64s)."""
    ms, seq = key
    if seq > 0:
        return ms, seq - 1
    return (ms - 1, UINT64_MAX) if ms > 0 else (0, 0)


# -- where a reader starts ----------------------------------------------------------

StartKind: TypeAlias = Literal["none", "malformed", "valid"]


@dataclass(frozen=True, slots=True)
class Start:
    """A reader's cursor, parsed once: no cursor, a malformed one, or a valid position."""

    kind: StartKind
    key: EventKey | None = None

    @property
    def id(self) -> str | None:
        """The normalised cursor (`0001-2` is `1-2`), None unless valid."""
        return None if self.key is None else format_key(self.key)


def parse_start(cursor: str | None) -> Start:
    if cursor is None:
        return Start("none")
    try:
        return Start("valid", parse_cursor(cursor))
    except MalformedCursor:
        return Start("malformed")


def missed_events(position: EventKey | None, bounds: Bounds) -> bool:
    """Whether a reader that has everything up to `position` missed retained-out events.

    `position` None is a reader with nothing delivered and no cursor: it replays what is
    retained and is never behind anything.
    """
    return position is not None and bounds.floor is not None and position < bounds.floor


def missed_removed(position: EventKey | None, last_event: EventKey | None) -> bool:
    """Whether a reader at `position` missed events of a log that is gone entirely
    (`last_event`: the last event id the run handed out). A reader at that id, or with
    no position, has missed nothing: it waits for a new log, or learns how the run ended.
    """
    return position is not None and last_event is not None and position < last_event


def missed_unknown(position: EventKey | None) -> bool:
    """Whether a reader at `position` of a run of which nothing is known (neither a log
    nor a record: never claimed, or expired or evicted whole) may have missed events.

    A position past 0-0 names an event the run once handed out (or nothing at all), and
    nothing is left to verify what followed it, so the reader gets a gap rather than
    waiting for a run that may never come back. No position, or 0-0, is a reader that
    may have come before the producer: it waits.
    """
    return position is not None and position > (0, 0)


def gap(position: EventKey | None, bounds: Bounds) -> StreamGap:
    """The gap for a reader at `position` that `missed_events` found behind the floor."""
    reason: GapReason = "trimmed" if bounds.trimmed else "stream_removed"
    requested = None if position is None else format_key(position)
    return StreamGap(requested, bounds.first, bounds.last, reason)


def removed(position: EventKey | None, reason: GapReason) -> StreamGap:
    """The gap for a reader whose log went away under it: nothing is retained."""
    return StreamGap(None if position is None else format_key(position), None, None, reason)


# -- what a write may carry -----------------------------------------------------------


def encode_payload(data: Any) -> bytes:
    """The payload's compact JSON; InvalidInput when it is not representable as JSON."""
    try:
        return encode_json(data)
    except TypeError as exc:  # orjson.JSONEncodeError
        raise InvalidInput(f"data is not JSON-serialisable: {exc}") from None


def encode_batch(events: Sequence[tuple[str, Any]]) -> list[tuple[str, bytes]]:
    """Validate and encode a whole batch before anything is written (a batch is atomic)."""
    if not events:
        raise InvalidInput("a batch needs at least one event")
    return [(check_event_name(name), encode_payload(data)) for name, data in events]


def heartbeat_interval(default: float, requested: float | None) -> float:
    """The subscription's heartbeat interval: `requested`, or the bridge default."""
    if requested is None:
        return default
    if isinstance(requested, bool) or not isinstance(requested, int | float):
        raise InvalidInput("heartbeat_interval must be a number")
    if not math.isfinite(requested) or requested <= 0:
        raise InvalidInput("heartbeat_interval must be finite and > 0")
    return float(requested)
