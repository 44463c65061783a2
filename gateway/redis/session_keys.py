"""Redis key names of the sessions store (beside the run keys of `redis/keys.py`).

Per session (all carry the `{session_id}` hash tag, one Cluster slot, so every session
script is single-slot and atomic):

    <p>session:{<sid>}:tomb         string  durable tombstone of a retired session (no TTL)
    <p>session:{<sid>}:meta         hash    seq (the last order handed out), last_updated
                                            (seconds: the newest claim, state change or
                                            END), c:<run> (when that claim took its order,
                                            ms: a young entry with no record is a claim
                                            between its steps, an old one is gone)
    <p>session:{<sid>}:order        zset    run_id -> the turn's order (session_claim.lua)
    <p>session:{<sid>}:key:<key>    hash    run, at: the run a claim's idempotency key
                                            started (claim_key.lua; expires on its own)

The session's keys live at least `stream_ttl + ended_ttl` after its newest claim or turn
move, as long as its records can, and without TTL while a turn of it is parked (`parked`
and `p:<run>` in the meta hash count them: `session_ttl.lua`).
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
Turn records live in the run's slot (`redis/keys.py`: `{<run>}:turn`, `{<run>}:text`),
written by the run's own scripts, so a record never lags its log. The session's keys only
point at runs: a claim first takes the session's next order (`session_claim.lua`:
tombstone check, counter, `order` zset), then the run's claim script opens the record
with it. A crash between the two leaves an index entry with no record: readers wait
for such an entry while it is young (a feed does not page past it, a clear is refused),
then take it for gone and prune it, as they prune an entry whose record expired or
belongs to another session. The record is the truth and is never behind its log; the
index only says which runs to read.

Before this layout (an upgrade) records lived in the session's slot,
`session:{<sid>}:turn:<run>` (hash: rev, state, doc), listed in `session:{<sid>}:turns`
(run_id -> last_updated) with expiries in `session:{<sid>}:exp`. Readers still read
them (`session_legacy.lua`), settled from their runs (a record still `running` whose run
has ended takes the run's END status), until they expire or the session is deleted.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..names import check_session_id
from .keys import check_prefix

__all__ = [
    "IndexKeys",
    "SessionKeys",
    "check_prefix",
    "index_keys",
    "session_keys",
    "turn_key",
]


@dataclass(frozen=True, slots=True)
class SessionKeys:
    tomb: str
    meta: str
    order: str
    feed: str  # a pub/sub channel, not a key
    legacy_turns: str  # records from before the order (an upgrade): session_legacy.lua
    legacy_exp: str
    legacy_prefix: str

    @property
    def lists(self) -> list[str]:
        """tomb, meta, order: the KEYS of session_claim / session_read / session_delete."""
        return [self.tomb, self.meta, self.order]

    @property
    def reads(self) -> list[str]:
        """tomb, meta, order, legacy turns: the KEYS of session_read."""
        return [self.tomb, self.meta, self.order, self.legacy_turns]


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
        order=f"{tag}:order",
        feed=f"{tag}:feed",
        legacy_turns=f"{tag}:turns",
        legacy_exp=f"{tag}:exp",
        legacy_prefix=f"{tag}:turn:",
    )


def turn_key(prefix: str, session_id: str, key: str) -> str:
    """The entry of a claim's idempotency key (`bridge/turn_keys.py`), in the session's
    slot (the key's characters include no brace)."""
    return f"{prefix}session:{{{check_session_id(session_id)}}}:key:{key}"


def index_keys(prefix: str) -> IndexKeys:
    return IndexKeys(
        by_activity=f"{prefix}{{~sessions}}:by-activity", parked=f"{prefix}{{~sessions}}:parked"
    )
