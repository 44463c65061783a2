"""Event ids and reconnect cursors: `<ms>-<seq>`, ASCII digits, each part an unsigned 64-bit.

One parser serves both backends, before any cursor reaches XREAD and when detecting gaps;
ids a backend assigned itself are read with `key_of`, which checks nothing.
"""

from __future__ import annotations

from typing import Final

from .errors import InvalidInput

UINT64_MAX: Final = 18446744073709551615
# A run's ids in epoch e (lua/entry_id.lua: moved on when its writes find another Redis
# server than before) have a sequence part of at least e * EPOCH_SPAN, so no id of an
# earlier epoch is ever handed out again.
EPOCH_SPAN: Final = 2**40
_DIGITS: Final = frozenset("0123456789")
_MAX_DIGITS: Final = len(str(UINT64_MAX))

EventKey = tuple[int, int]


class MalformedCursor(InvalidInput):
    code = "malformed_cursor"


def _component(text: str) -> int:
    # str.isdigit() accepts non-ASCII digits ("٣", "³"); int() accepts signs, spaces and "_".
    if not text or len(text) > _MAX_DIGITS or not _DIGITS.issuperset(text):
        raise MalformedCursor(f"cursor component {text[:24]!r} is not an unsigned integer")
    value = int(text)
    if value > UINT64_MAX:
        raise MalformedCursor("cursor component exceeds 18446744073709551615")
    return value


def parse_cursor(cursor: str) -> EventKey:
    """Parse `<ms>-<seq>` into an orderable key; raise MalformedCursor otherwise."""
    ms, sep, seq = cursor.partition("-")
    if not sep:
        raise MalformedCursor("cursor must look like <ms>-<seq>")
    return _component(ms), _component(seq)


def key_of(entry_id: str) -> EventKey:
    """The key of an id a backend assigned (well-formed by construction, so unchecked:
    the bridges' per-event bookkeeping, where `parse_cursor` was a visible cost)."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq)


def try_parse_cursor(cursor: str | None) -> EventKey | None:
    """None for a missing or malformed cursor (callers apply the malformed-cursor policy)."""
    if cursor is None:
        return None
    try:
        return parse_cursor(cursor)
    except MalformedCursor:
        return None


def format_key(key: EventKey) -> str:
    return f"{key[0]}-{key[1]}"
