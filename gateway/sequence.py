"""Numbered appends: a producer that numbers its events can retry any write blindly.

A producer may say that a batch's first event is its N-th event of the current lease
epoch (1-based; the rest of the batch follows consecutively). The bridge then applies a
batch only once:

- N is the next expected number: the batch is appended;
- N is the first number of the last applied batch, with the same length: it is a retry
  after a lost reply, answered with the ids first assigned, and nothing is appended;
- N is past the next expected number: `SequenceGap` (events in between never arrived);
- any other overlap with applied events: `SequenceConflict` (not a retry of the last
  batch: only that batch's ids are kept).

The state is bounded and lives with the run: the token the numbering belongs to (a
takeover's new token starts a new numbering), the next expected number, and the first
number and ids of the last applied batch. The Redis bridge keeps the same fields in the
run's hash and decides in `lua/publish.lua`; the memory bridge uses `admit` below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from .errors import InvalidInput, SequenceConflict, SequenceGap

# Numbers stay exact in Lua (doubles) and in JSON readers up to here.
MAX_SEQ: Final = 2**53 - 1
HEADER: Final = "X-Producer-Seq"


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
    first: int  # the first number of the last applied batch
    ids: tuple[str, ...]  # the ids that batch was given


def admit(numbering: Numbering | None, token: str, seq: int, count: int) -> tuple[str, ...] | None:
    """None: append the batch. A tuple: a retry of the last batch; these are its ids.

    Raises SequenceGap / SequenceConflict (nothing may be appended).
    """
    current = numbering if numbering is not None and numbering.token == token else None
    expected = 1 if current is None else current.next
    if seq == expected:
        return None
    if seq > expected:
        raise SequenceGap(
            f"batch starts at event {seq}, but the next expected is {expected}", expected
        )
    if current is not None and seq == current.first and count == len(current.ids):
        return current.ids
    raise SequenceConflict(
        f"batch {seq}..{seq + count - 1} overlaps applied events and is not the last applied "
        f"batch (the next expected is {expected})",
        expected,
    )
