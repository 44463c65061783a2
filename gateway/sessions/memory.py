"""In-process SessionStore (the embedded default), owned by `MemoryStreamBridge`.

The bridge writes the turn records: its claim, append and END steps call `claimed`,
`appended` and `ended` synchronously, in the same step as the write they reflect (no
await in between), so a record can never lag its log and a retry that appends nothing
changes nothing (the bridge returns before calling). Everything else here is a reader.

A session's turns are ordered by a per-session counter taken when the claim is accepted
(`order`), never by a clock. Retention follows the runs: a running turn lives
`stream_ttl_seconds` after its last write, an ended one `ended_ttl_seconds`, a parked
one until the session is cleared or retired. Expired turns are dropped lazily on
access. Index reads walk every live session (O(sessions)): fine for one process; the
Redis store is the one with bounded index reads. Tombstones are kept for the life of the
process (memory holds nothing across a restart).
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from ..errors import SessionActive
from ..names import check_session_id
from ..settings import Settings
from ..values import EndStatus
from . import turns as T
from .base import DEFAULT_LIMIT, MAX_LIMIT, SessionRow, parse_limit
from .shaping import shape_input_message
from .watch import ChangeSignal, TurnSignal

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Turn:
    doc: dict[str, Any]
    expires_at: float | None  # None: parked, never swept


@dataclass(slots=True)
class _Session:
    turns: dict[str, _Turn] = field(default_factory=dict)
    counter: int = 0  # the last order handed out (survives expired turns)


class MemorySessionStore:
    def __init__(
        self,
        settings: Settings | None = None,
        *,
        limits: T.TurnLimits = T.DEFAULT_LIMITS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if settings is None:
            settings = Settings.model_validate({})
        self._running_ttl = settings.stream_ttl_seconds
        self._ended_ttl = settings.ended_ttl_seconds
        self._limits = limits
        self._clock = clock
        self._sessions: dict[str, _Session] = {}
        self._session_of: dict[str, str] = {}  # run id -> the session holding its turn
        self._tombstones: dict[str, float] = {}
        self._signals: dict[str, ChangeSignal] = {}  # sessions with a feed open here

    @asynccontextmanager
    async def watch(self, session_id: str) -> AsyncIterator[TurnSignal]:
        """The session's change signal, shared by its feeds in this process."""
        signal = self._signals.get(session_id)
        if signal is None:
            signal = self._signals[session_id] = ChangeSignal()
        signal.users += 1
        try:
            yield signal
        finally:
            signal.users -= 1
            if signal.users == 0 and self._signals.get(session_id) is signal:
                del self._signals[session_id]

    def _changed(self, session_id: str) -> None:
        signal = self._signals.get(session_id)
        if signal is not None:
            signal.mark_stale()

    # -- the bridge's write steps (synchronous: part of the bridge's own step) ----------

    def claimed(self, session_id: str, run_id: str, input_message: Any, now: float) -> None:
        """The claim of `run_id` under `session_id` was accepted: open its turn, with the
        session's next order (a takeover claim of the same run keeps the turn as is)."""
        if session_id in self._tombstones or self._live_turn(run_id) is not None:
            return
        session = self._sessions.setdefault(session_id, _Session())
        session.counter += 1
        doc = T.new_turn(
            session_id, run_id, shape_input_message(input_message), now, session.counter
        )
        session.turns[run_id] = _Turn(doc, self._expiry(doc["state"]))
        self._session_of[run_id] = session_id
        self._changed(session_id)

    def appended(self, run_id: str, events: Iterable[tuple[str, bytes]], now: float) -> None:
        """Events were appended to the log of `run_id` (encoded as the log holds them)."""
        turn = self._live_turn(run_id)
        if turn is None:
            return
        try:
            T.fold_encoded(turn.doc, events, now, self._limits)
        except Exception:  # the append is done: as turn_fold.lua's pcall, never undo it
            log.exception("turn %s: record not updated", run_id)
        # the record follows the run's retention: every write renews it
        turn.expires_at = self._expiry(turn.doc["state"])

    def ended(self, run_id: str, status: EndStatus, now: float) -> None:
        """The run's END was written (or its record marked ended)."""
        turn = self._live_turn(run_id)
        if turn is not None and T.end_turn(turn.doc, status, now):
            turn.expires_at = self._expiry(turn.doc["state"])

    # -- reads ------------------------------------------------------------------

    async def list_sessions(
        self, limit: int = DEFAULT_LIMIT, parked: bool = False
    ) -> list[SessionRow]:
        limit = parse_limit(limit)
        rows = [row for sid in list(self._sessions) if (row := self._row(sid, parked))]
        return heapq.nlargest(limit, rows, key=lambda r: (r["last_updated"], r["session_id"]))

    async def session_rows(
        self, session_ids: Collection[str], parked: bool = False
    ) -> list[SessionRow]:
        wanted = {check_session_id(s) for s in list(session_ids)[:MAX_LIMIT]}
        rows = [row for sid in wanted if (row := self._row(sid, parked))]
        rows.sort(key=lambda r: (r["last_updated"], r["session_id"]), reverse=True)
        return rows

    def _row(self, session_id: str, parked: bool) -> SessionRow | None:
        session = self._live_session(session_id)
        if session is None or session_id in self._tombstones:
            return None
        newest = max(session.turns.values(), key=lambda t: t.doc["order"])
        last_state = newest.doc["state"]
        if parked and not T.is_parked(last_state):
            return None
        row: SessionRow = {
            "session_id": session_id,
            "last_updated": max(float(t.doc["last_updated"]) for t in session.turns.values()),
            "turn_count": len(session.turns),
        }
        if parked:
            row["last_state"] = last_state
        return row

    async def list_turns(self, session_id: str, limit: int = DEFAULT_LIMIT) -> list[dict[str, Any]]:
        check_session_id(session_id)
        limit = parse_limit(limit)
        if session_id in self._tombstones:
            return []
        session = self._live_session(session_id)
        if session is None:
            return []
        newest = heapq.nlargest(limit, session.turns.values(), key=lambda t: t.doc["order"])
        return [T.copy_turn(turn.doc) for turn in reversed(newest)]

    async def turn_of(self, session_id: str, run_id: str) -> dict[str, Any] | None:
        if check_session_id(session_id) in self._tombstones:
            return None
        turn = self._live_turn(run_id)
        if turn is None or turn.doc["session_id"] != session_id:
            return None
        return T.copy_turn(turn.doc)

    async def turns_after(
        self, session_id: str, after: int, limit: int = DEFAULT_LIMIT
    ) -> list[dict[str, Any]]:
        check_session_id(session_id)
        limit = parse_limit(limit)
        session = self._live_session(session_id)
        if session is None or session_id in self._tombstones:
            return []
        later = [t for t in session.turns.values() if t.doc["order"] > after]
        chosen = heapq.nsmallest(limit, later, key=lambda t: t.doc["order"])
        return [T.copy_turn(turn.doc) for turn in chosen]

    async def next_turn(self, session_id: str, after: int) -> tuple[dict[str, Any] | None, bool]:
        turns = await self.turns_after(session_id, after, 1)
        return (turns[0] if turns else None), False  # a claim here is one step

    async def delete_session(self, session_id: str, retire: bool) -> list[str]:
        check_session_id(session_id)
        session = self._live_session(session_id)
        if not retire and session is not None:
            for turn in session.turns.values():
                if turn.doc["state"] == T.RUNNING:
                    raise SessionActive(
                        f"session {session_id!r} has a running turn; retry after it ends"
                    )
        if retire:
            self._tombstones.setdefault(session_id, self._clock())
        # a clear keeps the session's counter: an order is never handed out twice
        removed = self._sessions.pop(session_id, None) if retire else self._sessions.get(session_id)
        run_ids = sorted(removed.turns) if removed is not None else []
        if removed is not None and not retire:
            removed.turns = {}
        for run_id in run_ids:
            self._session_of.pop(run_id, None)
        self._changed(session_id)
        return run_ids

    async def is_retired(self, session_id: str) -> bool:
        return check_session_id(session_id) in self._tombstones

    async def running_turn(self, session_id: str) -> str | None:
        if check_session_id(session_id) in self._tombstones:
            return None
        session = self._live_session(session_id)
        if session is None:
            return None
        newest = max(session.turns.values(), key=lambda t: t.doc["order"])
        return str(newest.doc["run_id"]) if newest.doc["state"] in T.LIVE_STATES else None

    # -- internals --------------------------------------------------------------

    def _expiry(self, state: str) -> float | None:
        if T.is_parked(state):
            return None
        return self._clock() + (self._ended_ttl if T.is_ended(state) else self._running_ttl)

    def _expired(self, turn: _Turn) -> bool:
        return turn.expires_at is not None and turn.expires_at <= self._clock()

    def _live_turn(self, run_id: str) -> _Turn | None:
        session_id = self._session_of.get(run_id)
        if session_id is None:
            return None
        session = self._live_session(session_id)
        turn = session.turns.get(run_id) if session is not None else None
        if turn is None:
            self._session_of.pop(run_id, None)
        return turn

    def _live_session(self, session_id: str) -> _Session | None:
        """The session with its expired turns dropped; None when it holds none (its
        counter is kept: orders are never reused)."""
        session = self._sessions.get(session_id)
        if session is None:
            return None
        for run_id in [r for r, t in session.turns.items() if self._expired(t)]:
            del session.turns[run_id]
            self._session_of.pop(run_id, None)
        return session if session.turns else None
