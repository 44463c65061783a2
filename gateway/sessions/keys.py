"""Redis key names of the sessions store (beside the run keys of `bridge/keys.py`).

Per session (all carry the `{session_id}` hash tag, one Cluster slot, so every session
script is single-slot and atomic):

    <p>session:{<sid>}:tomb         string  durable tombstone of a retired session (no TTL)
    <p>session:{<sid>}:meta         hash    last_updated, newest_run, newest_created,
                                            last_state (state of the newest-created turn)
    <p>session:{<sid>}:turns        zset    run_id -> turn last_updated (seconds)
    <p>session:{<sid>}:exp          zset    run_id -> turn expiry (ms; +inf while parked)
    <p>session:{<sid>}:turn:<run>   hash    rev, state, doc (the turn record JSON)
    <p>session:{<sid>}:feed         shard channel (no key): a turn was created, or the
                                            session was retired (what session feeds wait on)

Global index (both carry the `{~sessions}` tag, one slot; `~` cannot start an id):

    <p>{~sessions}:by-activity      zset    session_id -> last_updated (seconds)
    <p>{~sessions}:parked           zset    session_id -> last_updated, parked sessions only

Trade-off: the global index is one key (per zset), so in Cluster every index write of
every session lands on one shard and one slot; that is what makes "newest N" a single
O(log n + N) `ZREVRANGE` instead of a scatter-gather across shards. An index write is a
separate script from the session write (different slots cannot share a script), so the
index is a hint: readers check every candidate row against its session's keys
(tombstone, turn count, newest state) and drop stale rows with a compare-and-remove.
Turn records live in the session's slot, not the run's, so a session's tombstone check
and its turn writes are one atomic script.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..bridge.keys import check_prefix
from ..names import check_session_id

__all__ = ["IndexKeys", "SessionKeys", "check_prefix", "index_keys", "session_keys"]


@dataclass(frozen=True, slots=True)
class SessionKeys:
    tomb: str
    meta: str
    turns: str
    exp: str
    turn_prefix: str
    feed: str  # a pub/sub channel, not a key

    def turn(self, run_id: str) -> str:
        return self.turn_prefix + run_id

    @property
    def lists(self) -> list[str]:
        """tomb, meta, turns, exp: the KEYS of session_read / session_delete."""
        return [self.tomb, self.meta, self.turns, self.exp]


@dataclass(frozen=True, slots=True)
class IndexKeys:
    by_activity: str
    parked: str

    @property
    def both(self) -> list[str]:
        return [self.by_activity, self.parked]


def session_keys(prefix: str, session_id: str) -> SessionKeys:
    tag = f"{prefix}session:{{{check_session_id(session_id)}}}"
    return SessionKeys(
        tomb=f"{tag}:tomb",
        meta=f"{tag}:meta",
        turns=f"{tag}:turns",
        exp=f"{tag}:exp",
        turn_prefix=f"{tag}:turn:",
        feed=f"{tag}:feed",
    )


def index_keys(prefix: str) -> IndexKeys:
    return IndexKeys(
        by_activity=f"{prefix}{{~sessions}}:by-activity", parked=f"{prefix}{{~sessions}}:parked"
    )
