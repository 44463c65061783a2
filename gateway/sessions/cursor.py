"""Session feed cursors: the `id:` of every session feed frame, and how it is resumed.

    <run_id>/<ms>-<seq>   after that event of that turn's run
    <run_id>/0-0          after the turn's `turn` frame (its run from the first event)
    <run_id>/end          after the turn's `turn_end` frame: the next turn comes next
    <run_id>/gap          the feed stopped at a gap in that turn
    retired               the feed ended because the session was retired

Run ids never contain `/`, so the first `/` splits the two parts; the run id follows the
run id rules, the position the run cursor rules (`gateway.cursor`). A reconnect with a
`gap` or `retired` cursor is a client reconnecting only because the feed closed: it is
answered so that it stops (HTTP 204). Anything else is malformed (a 422 before the
stream starts: a session cursor is never guessed at).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from ..cursor import MalformedCursor, parse_cursor
from ..errors import InvalidInput
from ..names import check_run_id

CursorKind = Literal["event", "end", "gap", "retired"]
TURN_START: Final = "0-0"
RETIRED: Final = "retired"
MAX_CURSOR_CHARS: Final = 256


@dataclass(frozen=True, slots=True)
class SessionCursor:
    kind: CursorKind
    run_id: str | None = None  # None only for `retired`
    event_id: str | None = None  # for `event`: the run cursor to resume the run from

    def __str__(self) -> str:
        if self.kind == "retired":
            return RETIRED
        position = self.event_id if self.kind == "event" else self.kind
        return f"{self.run_id}/{position}"


def parse_session_cursor(text: str) -> SessionCursor:
    """Parse a session cursor; raise MalformedCursor (a 422) for anything else."""
    if text == RETIRED:
        return SessionCursor("retired")
    if len(text) > MAX_CURSOR_CHARS:
        raise MalformedCursor("a session cursor is at most 256 characters")
    run_id, sep, position = text.partition("/")
    if not sep:
        raise MalformedCursor("a session cursor looks like <run_id>/<event id>")
    try:
        check_run_id(run_id)
    except InvalidInput:
        raise MalformedCursor("the session cursor names no valid run id") from None
    if position in ("end", "gap"):
        return SessionCursor(position, run_id)  # type: ignore[arg-type]
    parse_cursor(position)  # raises MalformedCursor
    return SessionCursor("event", run_id, position)


def event_cursor(run_id: str, event_id: str) -> str:
    return f"{run_id}/{event_id}"
