"""Numbered appends: a producer that numbers its events can retry any write blindly.

A producer may say that a batch's first event is its N-th event of the current lease
epoch (1-based; the rest of the batch follows consecutively). The bridge then applies
each event only once:

- N is the next expected number: the batch is appended;
- N is below it (a retry after a lost reply, or a streaming append resent from its
  first unacknowledged line): the events already applied are answered with the ids
  first assigned, and only the batch's tail from the next expected number on is
  appended (nothing, when the whole batch was applied);
- N is past the next expected number: `SequenceGap` (events in between never arrived).

The state is four values kept with the run (the token the numbering belongs to, a
takeover's new token starting a new numbering; the next expected number; the id of the
newest numbered event; the first number of the run of numbered events that ends there
back to back in the log) and a compact record of the ids the numbering's newest events
were given, at least `MAX_LOOKBACK` of them: an overlap is answered from that record,
never by reading the log, so its cost does not depend on the size of the events. It is
answered when its events lie in that run, at most `MAX_LOOKBACK` events back, and are
still retained (newer than the log's floor); otherwise (the events came before an
unnumbered write, lie further back, or were trimmed or removed) it is refused with
`SequenceConflict` and the next expected number, appending nothing: the producer
resends from that number (its events before were applied; only their ids are unknown).

The Redis bridge keeps the same fields in the run's hash, the record as buckets of
consecutive ids (`redis/scripts.py` has the layout's numbers), and decides in
`lua/publish.lua` with the same rule; the memory bridge calls `admit`, `IdRecord`,
`applied_ids` and `advance` below.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from .errors import InvalidInput, SequenceConflict, SequenceGap

# Numbers stay exact in Lua (doubles) and in JSON readers up to here.
MAX_SEQ: Final = 2**53 - 1
HEADER: Final = "X-Producer-Seq"
# How far back an overlap's ids are looked up: the largest default batch, so a blind
# retry of any batch is answered (lua/publish.lua gets it from redis/scripts.py).
MAX_LOOKBACK: Final = 1000


def check_seq(seq: int, count: int) -> int:
    """A batch's first number: an int >= 1 whose batch stays within `MAX_SEQ`."""
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise InvalidInput("the producer sequence number must be an integer >= 1")
    if seq + count - 1 > MAX_SEQ:
        raise InvalidInput(f"the producer sequence number must stay at most {MAX_SEQ}")
    if count < 1:
        raise InvalidInput("a numbered batch needs at least one event")
    return int(seq)  # a plain int (not a subclass such as an IntEnum): it is sent as is


def parse_seq_header(raw: str | None) -> int | None:
    """The `X-Producer-Seq` header: absent is None, anything but ASCII digits a 4xx."""
    if raw is None:
        return None
    text = raw.strip()
    if not text or not text.isascii() or not text.isdigit() or len(text) > 16:
        raise InvalidInput(f"{HEADER} must be a decimal integer >= 1")
    value = int(text)
    if not 1 <= value <= MAX_SEQ:
        raise InvalidInput(f"{HEADER} must be between 1 and {MAX_SEQ}")
    return value


@dataclass(frozen=True, slots=True)
class Numbering:
    """Where a producer's numbering stands (the memory bridge's copy of the Redis fields)."""

    token: str  # the lease it belongs to
    next: int  # the next expected number
    base: int  # events base..next-1 are the log's newest numbered entries, back to back
    last_id: str  # the id of event next-1 (the entry the look-back starts from)


@dataclass(frozen=True, slots=True)
class Admission:
    """What to do with a numbered batch that `admit` let through."""

    skip: int  # its leading events already applied (0: append it all)
    lookback: int  # how many numbers before the next expected one the batch starts


APPEND_ALL: Final = Admission(0, 0)


def admit(numbering: Numbering | None, token: str, seq: int, count: int) -> Admission:
    """The one decision on a numbered batch of `count` events starting at number `seq`.

    Raises SequenceGap (it starts past the next expected number) or SequenceConflict
    (it overlaps events whose ids are no longer known); nothing may be appended then.
    """
    current = numbering if numbering is not None and numbering.token == token else None
    expected = 1 if current is None else current.next
    if seq == expected:
        return APPEND_ALL
    if seq > expected or current is None:
        raise SequenceGap(
            f"batch starts at event {seq}, but the next expected is {expected}", expected
        )
    lookback = expected - seq
    if seq < current.base or lookback > MAX_LOOKBACK:
        raise sequence_conflict(seq, expected)
    return Admission(min(count, lookback), lookback)


class IdRecord:
    """The ids of a numbering's newest numbered events, `MAX_LOOKBACK` at most (the
    memory bridge's copy of the record lua/publish.lua keeps in the run's hash)."""

    __slots__ = ("_ids",)

    def __init__(self) -> None:
        self._ids: deque[str] = deque(maxlen=MAX_LOOKBACK)

    def extend(self, ids: Sequence[str]) -> None:
        """Record the ids of the numbered events appended now (the next numbers)."""
        self._ids.extend(ids)

    def ids(self, numbering: Numbering, seq: int, count: int) -> list[str]:
        """The ids of events `seq` .. `seq + count - 1` (all below `numbering.next`), as
        far as the record still has them."""
        start = len(self._ids) - (numbering.next - seq)
        return [self._ids[i] for i in range(max(start, 0), start + count)]


def applied_ids(
    admission: Admission,
    recorded: Sequence[str],
    floor: str | None,
    log_exists: bool,
    numbering: Numbering,
    seq: int,
) -> tuple[str, ...]:
    """The first-assigned ids of the batch's already-applied events.

    `recorded` are their ids as the record has them (fewer: not recorded any more).
    They must still be in the log: `log_exists`, and newer than the log's `floor` (every
    event with a larger id is retained; None when nothing was trimmed). Otherwise the log
    lost them (trimmed or removed): SequenceConflict.
    """
    if len(recorded) < admission.skip or not log_exists:
        raise sequence_conflict(seq, numbering.next)
    if floor is not None and _id_key(recorded[0]) <= _id_key(floor):
        raise sequence_conflict(seq, numbering.next)
    return tuple(recorded[: admission.skip])


def _id_key(event_id: str) -> tuple[int, int]:
    ms, _, part = event_id.partition("-")
    return int(ms), int(part)


def advance(
    numbering: Numbering | None,
    token: str,
    first_new: int,
    new_ids: Sequence[str],
    previous_last_id: str | None,
) -> Numbering:
    """The numbering after appending `new_ids` as numbers `first_new`, `first_new + 1`, …

    `previous_last_id` is the run's newest event id before this append: when it is the
    last numbered one, the numbered run goes on; otherwise (an unnumbered write came in
    between, or this is the token's first numbered write) a new one starts here.
    """
    contiguous = (
        numbering is not None and numbering.token == token and previous_last_id == numbering.last_id
    )
    base = numbering.base if contiguous and numbering is not None else first_new
    return Numbering(token, first_new + len(new_ids), base, new_ids[-1])


def sequence_conflict(seq: int, expected: int) -> SequenceConflict:
    """The refusal of an overlap whose applied events' ids are no longer known."""
    return SequenceConflict(
        f"batch starts at event {seq}, which was applied but whose id is no longer known "
        f"(more than {MAX_LOOKBACK} events back, before an unnumbered write, or trimmed); "
        f"the next expected is {expected}",
        expected,
    )
