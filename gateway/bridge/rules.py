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

A position above the floor must be an id of the log itself (`unvouched`): a backend can
lose events readers were given (a failover to a replica that had not received them, a
restart without persistence) or the run id can start a new life after its log and record
expired. A cursor the log did not issue (above its newest id; absent from it though above
its floor; from an earlier life of the run id; below the first entry of a log never
trimmed) is a gap with reason `unknown_position`: never a wait at the tail, never a
replay that follows ids the log no longer holds. 0-0, the position before every event,
needs no vouching. Each backend reports whether the position it read after is an entry
of the log (`LogRead.found`).

What a subscriber does on each read of the log is decided here too (`Phase`, `decide`);
the loop that applies it is `reader.py`, the same for both backends.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

from ..cursor import UINT64_MAX, EventKey, MalformedCursor, format_key, parse_cursor
from ..errors import InvalidInput
from ..names import check_event_name
from ..values import End, GapReason, StreamEvent, StreamGap, StreamItem, encode_json

Entry: TypeAlias = StreamEvent | End

# A reader's direct read takes at most this many events (both backends): a reader far
# behind the log holds no more than this in one step, and one that takes its items one
# at a time (`subscribe`) learns of a removal within this many.
READ_BATCH: Final = 512


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


@dataclass(frozen=True, slots=True)
class LogRead:
    """One read of a run's log after a position, as a backend reports it.

    `bounds` is None when the log does not exist; `status`, `error`, `end_id` and
    `last_event` (the last event id the run handed out) are then the run record's
    ("running" while it runs, "" when there is no record). `entries` are the entries
    after the position (up to a batch size; an END entry is the last of them), `tail`
    the log's newest entry (None when it is empty). `found`: whether the position read
    after is an entry of the log (None: no position was given, or it was not looked up).
    """

    exists: bool
    bounds: Bounds | None
    entries: list[Entry]
    tail: Entry | None
    status: str
    error: Any
    end_id: str | None
    last_event: EventKey | None
    found: bool | None = None

    def tail_end(self) -> End | None:
        return self.tail if isinstance(self.tail, End) else None


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


def unvouched(position: EventKey | None, bounds: Bounds, found: bool | None) -> bool:
    """Whether a reader at `position` holds a position the log cannot vouch for: above
    0-0 and above the floor (at or below it is `missed_events`' business), yet not an
    entry of the log (`found` False: the backend looked it up and it is not there)."""
    if position is None or found is not False or position == (0, 0):
        return False
    return bounds.floor is None or position > bounds.floor


def behind(position: EventKey | None, last_event: EventKey | None) -> bool:
    """Whether a reader at `position` lacks events of a run whose newest event id is
    `last_event` (None: the run handed out none, or it is not known). A reader with no
    position is behind any event; one with a position is behind an unknown newest id,
    as nothing can verify that it had everything."""
    if last_event is None:
        return position is not None and position > (0, 0)
    return position is None or position < last_event


@dataclass(frozen=True, slots=True)
class Missed:
    """A reader missed events (`decide`): the log's bounds, filled in by the caller with
    the retained ids, and why."""

    bounds: Bounds
    reason: GapReason


def missed(bounds: Bounds) -> Missed:
    """A reader behind the floor: events were trimmed, or its log was removed."""
    return Missed(bounds, "trimmed" if bounds.trimmed else "stream_removed")


def gap(position: EventKey | None, bounds: Bounds, reason: GapReason) -> StreamGap:
    """The gap for a reader at `position` that `decide` found behind (`Missed`)."""
    requested = None if position is None else format_key(position)
    return StreamGap(requested, bounds.first, bounds.last, reason)


def removed(position: EventKey | None, reason: GapReason) -> StreamGap:
    """The gap for a reader whose log went away under it: nothing is retained."""
    return StreamGap(None if position is None else format_key(position), None, None, reason)


# -- what a subscriber does on each read -------------------------------------------


class Phase(enum.Enum):
    """Where a subscription stands with the log it follows (`reader.py`)."""

    NEW = "new"  # nothing read yet
    NO_RUN = "no_run"  # read: neither a log nor a run record (a reader before the producer)
    CLAIMED = "claimed"  # read: the run record without a log (claimed, nothing appended)
    SEEN = "seen"  # the log was seen (a malformed cursor's tail), the position not checked
    LIVE = "live"  # the position is checked against the log: it may take the shared window
    DONE = "done"  # a terminal item was decided


Decision: TypeAlias = tuple[Phase, "list[StreamItem] | Missed"]


def decide(phase: Phase, position: EventKey | None, read: LogRead) -> Decision:
    """What one direct read of the log gives a subscriber at `position` in `phase`.

    `position` is what the reader holds (a valid cursor, a malformed cursor's tail, or
    the last event delivered; None: nothing), which is what can fall behind the log's
    floor. The answer is the next
    phase and either the items to deliver (maybe none yet: wait; a terminal item ends
    the subscription, `Phase.DONE`) or `Missed` when the reader is behind the log's
    floor or holds a position the log cannot vouch for (a gap, whose first/last ids the
    caller fills in).
    """
    if not read.exists:
        ended = bool(read.status) and read.status != "running"
        if phase in (Phase.SEEN, Phase.LIVE):
            # The log we saw is gone. A reader that had every event of an ended run still
            # learns how it ended; any other missed what it held (or may have: a run
            # whose record is gone too can verify nothing).
            if ended and not behind(position, read.last_event):
                return Phase.DONE, [_end_of(read)]
            return Phase.DONE, [removed(position, "stream_removed")]
        if missed_removed(position, read.last_event):
            # The log this cursor points into is gone: events were missed.
            return Phase.DONE, [removed(position, "stream_removed")]
        if ended:
            # The log of an ended run is gone (or was never written), but its record
            # remains and says how it ended.
            return Phase.DONE, [_end_of(read)]
        if read.status:
            return Phase.CLAIMED, []  # claimed, nothing published yet: wait
        if phase is Phase.CLAIMED or missed_unknown(position):
            # The record we saw is gone too (the run expired, or the backend lost it), or
            # the cursor points into a run nothing is left of: waiting would be forever.
            return Phase.DONE, [removed(position, "stream_removed")]
        return Phase.NO_RUN, []
    assert read.bounds is not None
    if missed_events(position, read.bounds):
        return Phase.DONE, missed(read.bounds)
    if unvouched(position, read.bounds, read.found):
        return Phase.DONE, Missed(read.bounds, "unknown_position")
    if not read.entries:
        end = read.tail_end()
        if end is not None:
            return Phase.DONE, [end]  # the cursor is at or past the END: the run is over
        return Phase.LIVE, []
    last = read.entries[-1]
    return (Phase.DONE if isinstance(last, End) else Phase.LIVE), list(read.entries)


def _end_of(read: LogRead) -> End:
    return End(read.status, read.error, read.end_id)  # type: ignore[arg-type]


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
