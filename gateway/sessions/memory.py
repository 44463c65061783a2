"""In-process SessionStore (the embedded default, beside MemoryStreamBridge).

Every operation runs without awaiting, so each one is atomic on the event loop (the
tombstone check and the write, clear's active check and the delete). Retention follows
the runs: a running turn lives `stream_ttl_seconds` after its last write, an ended one
`ended_ttl_seconds`, a parked one until the session is cleared or retired. Expired turns
are dropped lazily on access. Index reads walk every live session (O(sessions)): fine
for one process; the Redis store is the one with bounded index reads. Tombstones are
kept for the life of the process (memory holds nothing across a restart).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from ..errors import SessionActive
from ..names import check_run_id, check_session_id
from ..settings import Settings
from ..values import EndStatus
from . import turns as T
from .base import DEFAULT_LIMIT, MAX_LIMIT, SessionRow, parse_limit
from .shaping import shape_input_message
from .watch import ChangeSignal, TurnSignal


@dataclass(slots=True)
class _Turn:
    doc: dict[str, Any]
    expires_at: float | None  # None: parked, never swept


@dataclass(slots=True)
class _Session:
    turns: dict[str, _Turn] = field(default_factory=dict)
    last_updated: float = 0.0
    newest_run: str | None = None
    newest_created: float = -1.0
    last_state: str | None = None


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

    # -- writes -----------------------------------------------------------------

    async def start_turn(
        self, session_id: str, run_id: str, input_message: Any, now: float
    ) -> bool:
        if not self._writable(session_id, run_id):
            return False
        if self._live_turn(session_id, run_id) is not None:
            return True
        doc = T.new_turn(session_id, run_id, shape_input_message(input_message), now)
        self._store(session_id, run_id, doc, new=True)
        return True

    async def apply_events(
        self, session_id: str, run_id: str, events: list[tuple[str, Any]], now: float
    ) -> bool:
        if not self._writable(session_id, run_id):
            return False
        current = self._live_turn(session_id, run_id)
        if current is None:
            doc = T.new_turn(session_id, run_id, None, now)
            T.apply_events(doc, events, now, self._limits)
            self._store(session_id, run_id, doc, new=True)
        elif T.apply_events(current.doc, events, now, self._limits):
            self._store(session_id, run_id, current.doc, new=False)
        return True

    async def end_turn(self, session_id: str, run_id: str, status: EndStatus, now: float) -> bool:
        if not self._writable(session_id, run_id):
            return False
        current = self._live_turn(session_id, run_id)
        if current is None:
            return False
        if T.end_turn(current.doc, status, now):
            self._store(session_id, run_id, current.doc, new=False)
        return True

    # -- reads ------------------------------------------------------------------

    async def list_sessions(
        self, limit: int = DEFAULT_LIMIT, parked: bool = False
    ) -> list[SessionRow]:
        limit = parse_limit(limit)
        candidates: list[tuple[float, str, _Session]] = []
        for session_id in list(self._sessions):
            session = self._live_session(session_id)
            if session is None:
                continue
            if parked and not T.is_parked(session.last_state):
                continue
            candidates.append((session.last_updated, session_id, session))
        rows: list[SessionRow] = []
        for last_updated, session_id, session in heapq.nlargest(limit, candidates):
            row: SessionRow = {
                "session_id": session_id,
                "last_updated": last_updated,
                "turn_count": len(session.turns),
            }
            if parked and session.last_state is not None:
                row["last_state"] = session.last_state
            rows.append(row)
        return rows

    async def session_rows(
        self, session_ids: Collection[str], parked: bool = False
    ) -> list[SessionRow]:
        wanted = {check_session_id(s) for s in list(session_ids)[:MAX_LIMIT]}
        rows: list[SessionRow] = []
        for session_id in wanted - self._tombstones.keys():
            session = self._live_session(session_id)
            if session is None or (parked and not T.is_parked(session.last_state)):
                continue
            row: SessionRow = {
                "session_id": session_id,
                "last_updated": session.last_updated,
                "turn_count": len(session.turns),
            }
            if parked and session.last_state is not None:
                row["last_state"] = session.last_state
            rows.append(row)
        rows.sort(key=lambda r: (r["last_updated"], r["session_id"]), reverse=True)
        return rows

    async def list_turns(self, session_id: str, limit: int = DEFAULT_LIMIT) -> list[dict[str, Any]]:
        check_session_id(session_id)
        limit = parse_limit(limit)
        if session_id in self._tombstones:
            return []
        session = self._live_session(session_id)
        if session is None:
            return []
        newest = heapq.nlargest(
            limit,
            session.turns.items(),
            key=lambda item: (item[1].doc["last_updated"], item[0]),
        )
        return [T.copy_turn(turn.doc) for _, turn in reversed(newest)]

    async def delete_session(self, session_id: str, retire: bool) -> list[str]:
        check_session_id(session_id)
        session = self._sessions.get(session_id)
        if not retire and session is not None:
            for turn in session.turns.values():
                if turn.doc["state"] == T.RUNNING and not self._expired(turn):
                    raise SessionActive(
                        f"session {session_id!r} has a running turn; retry after it ends"
                    )
        if retire:
            self._tombstones.setdefault(session_id, self._clock())
        self._sessions.pop(session_id, None)
        self._changed(session_id)
        return sorted(session.turns) if session is not None else []

    async def is_retired(self, session_id: str) -> bool:
        return check_session_id(session_id) in self._tombstones

    async def running_turn(self, session_id: str) -> str | None:
        if check_session_id(session_id) in self._tombstones:
            return None
        session = self._live_session(session_id)
        if session is None or session.newest_run is None:
            return None
        turn = session.turns.get(session.newest_run)
        if turn is None or turn.doc["state"] not in T.LIVE_STATES:
            return None
        return session.newest_run

    # -- internals --------------------------------------------------------------

    def _expired(self, turn: _Turn) -> bool:
        return turn.expires_at is not None and turn.expires_at <= self._clock()

    def _writable(self, session_id: str, run_id: str) -> bool:
        """Check the ids; False when the session is retired (its writes are dropped)."""
        check_session_id(session_id)
        check_run_id(run_id)
        return session_id not in self._tombstones

    def _live_turn(self, session_id: str, run_id: str) -> _Turn | None:
        session = self._live_session(session_id)
        return session.turns.get(run_id) if session is not None else None

    def _live_session(self, session_id: str) -> _Session | None:
        """The session with its expired turns dropped; None (and forgotten) when empty."""
        session = self._sessions.get(session_id)
        if session is None:
            return None
        for run_id in [r for r, t in session.turns.items() if self._expired(t)]:
            del session.turns[run_id]
        if not session.turns:
            del self._sessions[session_id]
            return None
        return session

    def _store(self, session_id: str, run_id: str, doc: dict[str, Any], *, new: bool) -> None:
        state = doc["state"]
        if T.is_parked(state):
            expires_at: float | None = None
        elif T.is_ended(state):
            expires_at = self._clock() + self._ended_ttl
        else:
            expires_at = self._clock() + self._running_ttl
        session = self._sessions.setdefault(session_id, _Session())
        session.turns[run_id] = _Turn(doc=doc, expires_at=expires_at)
        created = float(doc["created_at"])
        if session.newest_run == run_id:
            session.last_state = state
        elif (new and created >= session.newest_created) or created > session.newest_created:
            session.newest_run, session.newest_created = run_id, created
            session.last_state = state
        session.last_updated = max(session.last_updated, float(doc["last_updated"]))
        if new:
            self._changed(session_id)
