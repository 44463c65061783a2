"""The sessions/turns store contract (docs/protocol.md §6), shared by the memory and Redis backends.

Every run claimed with a `session_id` is a turn of that session. The stream bridge
writes the turn records, in the same atomic step as the claim, append or END they
reflect (memory: `MemorySessionStore.claimed/appended/ended`, called by
`MemoryStreamBridge`; Redis: `lua/claim.lua`, `publish.lua`, `publish_end.lua` with
`turn_fold.lua`). A turn's `order` is the session's counter at the claim. This store
reads them:

- `GET /v1/sessions`            -> `list_sessions(limit, parked)` (`parse_limit` first)
- `GET /v1/sessions/{id}/turns` -> `list_turns(session_id, limit)`
- `DELETE /v1/sessions/{id}`    -> `delete_session(session_id, retire)`; the returned run
  ids are the logs to remove with `bridge.cleanup(run_id)`.
- `GET /v1/sessions/{id}/ui-stream` -> `running_turn(session_id)`: the run to replay.

A write to a retired session opens no turn (the claim itself succeeds), and a message
that cannot be shaped is not stored. Turn records and rows are plain JSON objects (see
`turns.py` for the record shape); readers always get detached copies.

Index rows: `{"session_id", "last_updated", "turn_count"}` newest activity first;
`parked=True` lists only sessions whose newest-created turn is `input-required` or
`auth-required`, newest first, each row also carrying `last_state`.

Turns: the newest `limit` turns by `order`, returned oldest first (transcript order),
including the in-flight turn with its partial text and non-terminal state.

Retire (`retire=True`) removes the turns and writes a durable tombstone that is never
evicted: any later write for that session id (a late save of an in-flight producer,
even after a gateway restart) is dropped, and the index and the turns reader exclude the
id forever. Clear (`retire=False`) removes the turns and keeps the id usable; it raises
`SessionActive` (409) while a turn of the session is `running` (on Redis also while one
is being claimed: its order taken, its record not yet written). Parked turns do not
block a clear: nothing settles them (the operator answers with a fresh turn), so they
would block it forever. Clear's check and delete are one decision on both backends
(memory: one synchronous step; Redis: the delete compares the session's counter with
the one the check saw, so a claim in between makes it check again).
"""

from __future__ import annotations

from collections.abc import Collection
from contextlib import AbstractAsyncContextManager
from typing import Any, Final, Protocol, TypedDict, runtime_checkable

from ..errors import InvalidInput
from .watch import TurnSignal

MAX_LIMIT: Final = 200
DEFAULT_LIMIT: Final = 50


class SessionRow(TypedDict, total=False):
    session_id: str
    last_updated: float
    turn_count: int
    last_state: str  # only in `parked=True` rows


def parse_limit(value: object, default: int = DEFAULT_LIMIT) -> int:
    """Validate a `limit` (query string or int): 1..200; None -> `default`.

    Raises InvalidInput (a 400) for anything else: signs, spaces, non-ASCII digits,
    floats, booleans, 0, > 200.
    """
    if value is None:
        return default
    if isinstance(value, bool):
        raise InvalidInput("limit must be an integer between 1 and 200")
    if isinstance(value, str):
        if not value or len(value) > 3 or not all("0" <= c <= "9" for c in value):
            raise InvalidInput("limit must be an integer between 1 and 200")
        value = int(value)
    if not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
        raise InvalidInput("limit must be an integer between 1 and 200")
    return value


def parse_flag(value: object, name: str = "parked") -> bool:
    """Validate a boolean query flag: true/false/1/0 (case-insensitive); None -> False."""
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        lowered = value.lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no", ""):
            return False
    raise InvalidInput(f"{name} must be true or false")


@runtime_checkable
class SessionStore(Protocol):
    async def list_sessions(
        self, limit: int = DEFAULT_LIMIT, parked: bool = False
    ) -> list[SessionRow]: ...

    async def session_rows(
        self, session_ids: Collection[str], parked: bool = False
    ) -> list[SessionRow]:
        """The index rows of these sessions only (newest first; at most 200 ids are
        looked at): what a subscriber token scoped to some sessions may list."""
        ...

    async def list_turns(
        self, session_id: str, limit: int = DEFAULT_LIMIT
    ) -> list[dict[str, Any]]: ...

    async def turn_of(self, session_id: str, run_id: str) -> dict[str, Any] | None:
        """The turn record of `run_id` in this session (None: not a turn of it, gone,
        or the session is retired)."""
        ...

    async def turns_after(
        self, session_id: str, after: int, limit: int = DEFAULT_LIMIT
    ) -> list[dict[str, Any]]:
        """The session's turns with an order above `after`, lowest first, at most
        `limit`: how a reader pages through a session exactly (the session feed's "next
        turn"). A turn whose claim is still between its steps (Redis: its order taken,
        its record not yet written) ends the page, so a reader waits for it rather than
        passing it; turns whose records are gone are skipped."""
        ...

    async def next_turn(self, session_id: str, after: int) -> tuple[dict[str, Any] | None, bool]:
        """The session's first turn with an order above `after` (as `turns_after`), and
        whether a claim is between its steps there (Redis: its order taken, its record
        not yet written; never on memory), so that a session feed waiting for the next
        turn looks again shortly instead of sleeping through it."""
        ...

    async def delete_session(self, session_id: str, retire: bool) -> list[str]:
        """Remove the session's turns; returns their run ids (for `bridge.cleanup`).

        Raises SessionActive when `retire` is False and a turn is running.
        """
        ...

    async def is_retired(self, session_id: str) -> bool: ...

    async def running_turn(self, session_id: str) -> str | None:
        """The run id of the session's running turn: its newest-created turn, when that
        one has not ended (`running`, or parked on the operator). None otherwise (no
        such session, retired, every turn ended or expired)."""
        ...

    def watch(self, session_id: str) -> AbstractAsyncContextManager[TurnSignal]:
        """The session's change signal (a turn created, the session retired or cleared),
        for the session feed; see `watch.py`."""
        ...
