"""SessionStore on Redis: turn records in their runs' slots, a per-session order index,
a bounded global session index, durable tombstones.

Key layout and the Cluster trade-off: `keys.py`. The records are written by the run's
own scripts (`claim.lua`, `publish.lua`, `publish_end.lua` with `turn_fold.lua`, driven
by `RedisStreamBridge`); this store reads them and keeps the indexes:

- `session_claim` (run by the bridge's claim): tombstone check, the session's next order.
- `session_read`: one session's row and its newest run ids by order.
- `turn_read`: one turn record (hash + text), atomically, in its run's slot, with
  the text its log holds that the record has not folded yet folded in first.
- `session_delete`: retire (tombstone first), clear (refused while a turn runs; a
  compare on the session counter makes the check and the delete one decision), prune
  entries whose record is gone, persist the keys of a session with a parked turn.
- `session_index`: the global index (by activity, parked), in its own slot.

The index is a hint: `list_sessions` verifies each candidate with `session_read`
(tombstoned or emptied sessions are dropped with a compare-and-remove), and the parked
listing checks each candidate's newest record.

Read cost of `list_sessions(limit)`: one `ZREVRANGE` of `limit` ids, then one pipelined
`EVALSHA session_read` per id (concurrent calls on Cluster, where pipelines refuse
scripts), plus for `parked=True` one `turn_read` per row. Stale rows make it read
further windows of twice the shortfall, at most `MAX_WINDOWS` windows.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Final, TypeVar

import anyio
import orjson
from redis import exceptions as redis_errors
from redis.asyncio import Redis, RedisCluster
from redis.commands.core import AsyncScript

from ..errors import BackendUnavailable, SessionActive
from ..names import check_run_id, check_session_id
from ..sessions import turns as T
from ..sessions.base import DEFAULT_LIMIT, MAX_LIMIT, SessionRow, parse_limit
from ..sessions.watch import TurnSignal
from ..settings import Settings
from . import turn_fields as F
from .calls import Calls
from .keys import run_keys
from .notifier import Notifier
from .pool import PoolGate
from .replies import as_text
from .scripts import ensure_loaded, lua_source
from .session_keys import SessionKeys, check_prefix, index_keys, session_keys

RedisClient = Redis | RedisCluster
R = TypeVar("R")

# A claim takes its order (session slot), then opens its record (run slot): an entry
# with no record is taken for a claim between those steps this long, then for gone.
PENDING_CLAIM_MS: Final = 30_000
MAX_RETRIES: Final = 8  # clear attempts while claims keep moving the session counter
MAX_WINDOWS: Final = 4  # index windows one list_sessions call may read


def _score(value: bytes | str | float) -> float:
    if isinstance(value, (bytes, str)):
        return float(as_text(value))
    return float(value)


async def _gather(calls: Sequence[Callable[[], Awaitable[Any]]]) -> list[Any]:
    """Run the calls concurrently; results in order; the first failure is re-raised."""
    results: list[Any] = [None] * len(calls)
    failures: list[BaseException] = []

    async def one(index: int, call: Callable[[], Awaitable[Any]]) -> None:
        try:
            results[index] = await call()
        except Exception as exc:
            failures.append(exc)

    async with anyio.create_task_group() as tg:
        for index, call in enumerate(calls):
            tg.start_soon(one, index, call)
    if failures:
        raise failures[0]
    return results


def _record(run_id: str, reply: list[Any]) -> dict[str, Any] | None:
    """A turn record as readers get it (the shape of `turns.new_turn`), from `turn_read`
    (the record's text, then its hash's fields and values: `turn_fields`)."""
    if not reply:
        return None
    text = as_text(reply[0])
    fields = {as_text(reply[i]): reply[i + 1] for i in range(1, len(reply) - 1, 2)}
    if F.STATE not in fields:
        return None

    def items(count_field: str, prefix: str) -> list[Any]:
        count = int(as_text(fields.get(count_field, b"0")))
        return [orjson.loads(fields[f"{prefix}{i}"]) for i in range(1, count + 1)]

    status = fields.get(F.STATUS)
    return {
        "run_id": run_id,
        "session_id": as_text(fields.get(F.SESSION, b"")),
        "order": int(as_text(fields.get(F.ORDER, b"0"))),
        "state": as_text(fields[F.STATE]),
        "created_at": int(as_text(fields.get(F.CREATED, b"0"))) / 1000,
        "last_updated": int(as_text(fields.get(F.UPDATED, b"0"))) / 1000,
        "text": text,
        "status": orjson.loads(status) if status is not None else None,
        "artifacts": items(F.ARTS, F.ART),
        "history": items(F.HIST, F.HIST_ITEM),
        "truncated": as_text(fields.get(F.TRUNC, b"")) == "1",
    }


class RedisSessionStore:
    def __init__(
        self,
        settings: Settings,
        client: RedisClient,
        *,
        notifier: Notifier | None = None,
        calls: Calls | None = None,
    ) -> None:
        self._prefix = check_prefix(settings.redis_key_prefix)
        self._redis = client
        # Every call crosses the bridge's boundary (passes at the pool they share,
        # deadline, retries, error mapping: calls.py), or one of its own alone.
        self._calls = calls or Calls(
            settings,
            client,
            PoolGate(settings.redis_max_connections, None, settings.redis_idle_connection_seconds),
        )
        self._notifier = notifier  # the bridge's: session feeds wait on it
        self._index = index_keys(self._prefix)
        self._scripts: dict[str, AsyncScript] = {
            name: client.register_script(lua_source(name))
            for name in (
                "session_read",
                "session_delete",
                "session_index",
                "turn_read",
                "session_legacy",
            )
        }

    # -- plumbing ---------------------------------------------------------------

    def _keys(self, session_id: str) -> SessionKeys:
        return session_keys(self._prefix, session_id)

    def watch(self, session_id: str) -> AbstractAsyncContextManager[TurnSignal]:
        """The session's feed channel, through the bridge's one pub/sub connection."""
        if self._notifier is None:
            raise RuntimeError("session feeds need the Redis bridge's notifier")
        return self._notifier.watch(self._keys(session_id).feed)

    async def _call(self, operation: Callable[[], Awaitable[R]]) -> R:
        return await self._calls.call(operation)

    async def ensure_scripts(self) -> int:
        """Readiness: load any of the session scripts Redis lacks; how many it loaded."""
        scripts = list(self._scripts.values())
        return await self._call(lambda: ensure_loaded(self._redis, scripts))

    async def _script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        script = self._scripts[name]
        return await self._call(lambda: script(keys=keys, args=args))

    async def _records(self, run_ids: Sequence[str]) -> list[dict[str, Any] | None]:
        """The turn records of these runs (None where there is none), each read
        atomically in its run's slot (`turn_read`), in one round trip."""
        calls: list[tuple[list[str], list[Any]]] = []
        for run_id in run_ids:
            keys = run_keys(self._prefix, check_run_id(run_id))
            calls.append(([keys.turn, keys.text, keys.meta, keys.log], []))
        replies = await self._many("turn_read", calls)
        return [_record(r, reply) for r, reply in zip(run_ids, replies, strict=True)]

    async def _many(self, name: str, calls: Sequence[tuple[list[str], list[Any]]]) -> list[Any]:
        """One script per (keys, args), pipelined (one round trip on one server, on one
        connection of the pool); concurrent calls on Cluster, whose pipelines refuse
        scripts."""
        if not calls:
            return []
        script = self._scripts[name]
        if isinstance(self._redis, RedisCluster):
            parts = [functools.partial(script, keys=keys, args=args) for keys, args in calls]
            return await self._call(lambda: _gather(parts))

        async def run() -> list[Any]:
            async with self._redis.pipeline(transaction=False) as pipe:
                for keys, args in calls:
                    pipe.evalsha(script.sha, len(keys), *keys, *args)
                return list(await pipe.execute())

        try:
            return await self._call(run)
        except BackendUnavailable as exc:
            if not isinstance(exc.__cause__, redis_errors.NoScriptError):
                raise
        # SCRIPT FLUSH or a fresh server: load it again and retry once
        await self._call(lambda: self._redis.script_load(script.script))
        return await self._call(run)

    async def _turns_of(
        self, session_id: str, want: int, after: int | None = None
    ) -> tuple[list[dict[str, Any]], str, bool] | None:
        """The session's turns, its counter, and whether a claim is between its steps
        (its order taken, its record not yet written); None when retired. `after` None: the
        newest `want` by order; else up to `want` above `after`, stopping before a claim
        still between its steps (see `turns_after`). Either way oldest first. Entries
        whose record is gone (expired, removed) or belongs to another session are
        pruned from the index."""
        keys = self._keys(session_id)
        (reply,) = await self._read_rows([session_id], want, "" if after is None else str(after))
        if as_text(reply[0]) != "ok":
            return None
        seq, now_ms, legacy = as_text(reply[3]), int(as_text(reply[4])), int(reply[5])
        entries = [
            (as_text(reply[i]), as_text(reply[i + 1]), as_text(reply[i + 2]))
            for i in range(6, len(reply) - 2, 3)
        ]
        records = await self._records([run_id for run_id, _, _ in entries])
        found: list[dict[str, Any]] = []
        stale: list[str] = []
        claiming = False
        for (run_id, order, claimed), record in zip(entries, records, strict=True):
            if record is not None and record["session_id"] == session_id:
                found.append(record)
                continue
            pending = record is None and claimed and now_ms - int(claimed) < PENDING_CLAIM_MS
            if pending:
                claiming = True
                if after is not None:
                    break  # the next turn is still being claimed: the page ends here
            else:
                stale += [run_id, order]
        if stale:
            await self._script("session_delete", keys.lists, ["prune", *stale])
        if legacy and after is None:  # records from before the order come first
            found = [*await self._legacy(session_id, want), *found]
        found.sort(key=lambda d: (d["order"], d["created_at"], d["run_id"]))
        return found[-want:], seq, claiming

    async def _legacy(self, session_id: str, want: int) -> list[dict[str, Any]]:
        """The session's records from before this layout (an upgrade), settled from their
        runs: one its old writer left `running` (or parked) whose run has ended since
        takes the run's END status. They sort before every turn with an order."""
        keys = self._keys(session_id)
        reply = await self._script(
            "session_legacy",
            [keys.legacy_turns, keys.legacy_exp],
            ["read", keys.legacy_prefix, max(want, 1)],
        )
        docs = [orjson.loads(reply[i + 1]) for i in range(0, len(reply) - 1, 2)]
        metas = [run_keys(self._prefix, check_run_id(str(d["run_id"]))).meta for d in docs]

        async def statuses() -> list[Any]:
            async with self._redis.pipeline(transaction=False) as pipe:
                for meta in metas:
                    pipe.hget(meta, "status")
                return list(await pipe.execute())

        for doc, status in zip(docs, await self._call(statuses) if docs else [], strict=True):
            doc.setdefault("order", 0)
            ended = as_text(status) if status is not None else ""
            if ended and ended != T.RUNNING and doc.get("state") in T.LIVE_STATES:
                doc["state"] = ended
        return docs

    async def turn_of(self, session_id: str, run_id: str) -> dict[str, Any] | None:
        check_session_id(session_id)
        if await self.is_retired(session_id):
            return None
        (record,) = await self._records([run_id])
        return record if record is not None and record["session_id"] == session_id else None

    async def turns_after(
        self, session_id: str, after: int, limit: int = DEFAULT_LIMIT
    ) -> list[dict[str, Any]]:
        limit = parse_limit(limit)
        seen = await self._turns_of(check_session_id(session_id), limit, int(after))
        return [] if seen is None else seen[0]

    async def next_turn(self, session_id: str, after: int) -> tuple[dict[str, Any] | None, bool]:
        seen = await self._turns_of(check_session_id(session_id), 1, int(after))
        if seen is None:
            return None, False
        turns, _, claiming = seen
        return (turns[0] if turns else None), claiming

    # -- writes -----------------------------------------------------------------

    async def delete_session(self, session_id: str, retire: bool) -> list[str]:
        keys = self._keys(session_id)
        when = time.time()
        for _ in range(MAX_RETRIES):
            if retire:
                reply = await self._script("session_delete", keys.lists, ["retire", repr(when)])
            else:
                seen = await self._turns_of(session_id, 1_000_000)
                if seen is None:
                    return []
                found, seq, claiming = seen
                running = [r["run_id"] for r in found if r["state"] == T.RUNNING]
                if running or claiming:  # a turn being claimed is about to run
                    which = repr(running[0]) if running else "being claimed"
                    raise SessionActive(
                        f"session {session_id!r} has a running turn ({which}); retry after it ends"
                    )
                reply = await self._script("session_delete", keys.lists, ["clear", seq])
                if as_text(reply[0]) == "moved":
                    continue  # a claim took an order meanwhile: check again
            break
        else:
            raise BackendUnavailable(f"session {session_id!r}: too many claims, try again")
        run_ids = [as_text(run_id) for run_id in reply[1:]]
        old = await self._script(
            "session_legacy",
            [keys.legacy_turns, keys.legacy_exp],
            ["delete", keys.legacy_prefix],
        )
        run_ids += [as_text(run_id) for run_id in old if as_text(run_id) not in run_ids]
        for run_id in run_ids:
            run = run_keys(self._prefix, run_id)
            await self._call(lambda run=run: self._redis.delete(run.turn, run.text))  # type: ignore[misc]
        await self._script(
            "session_index",
            self._index.both,
            ["remove", session_id, "1e308" if retire else repr(when)],
        )
        await self._call(lambda: self._redis.spublish(keys.feed, b""))  # wake its feeds
        await self._calls.replicated()  # (min_replicas_acked: the deletion is on them)
        return run_ids

    async def is_retired(self, session_id: str) -> bool:
        tomb = self._keys(session_id).tomb
        return bool(await self._call(lambda: self._redis.exists(tomb)))

    # -- reads ------------------------------------------------------------------

    async def running_turn(self, session_id: str) -> str | None:
        seen = await self._turns_of(check_session_id(session_id), 1)
        if seen is None or not seen[0]:
            return None
        newest = seen[0][-1]
        return str(newest["run_id"]) if newest["state"] in T.LIVE_STATES else None

    async def list_turns(self, session_id: str, limit: int = DEFAULT_LIMIT) -> list[dict[str, Any]]:
        limit = parse_limit(limit)
        seen = await self._turns_of(check_session_id(session_id), limit)
        return [] if seen is None else seen[0]

    async def list_sessions(
        self, limit: int = DEFAULT_LIMIT, parked: bool = False
    ) -> list[SessionRow]:
        limit = parse_limit(limit)
        zset = self._index.parked if parked else self._index.by_activity
        which = "2" if parked else "1"
        rows: list[SessionRow] = []
        seen: set[str] = set()
        start, window = 0, limit  # optimistic: most index rows are valid
        for _ in range(MAX_WINDOWS):
            entries = await self._window(zset, start, window)
            if not entries:
                break
            sids = [as_text(sid) for sid, _ in entries]
            found = await self._rows(sids, parked)
            stale: list[str] = []
            for (sid, (_, score)), row in zip(zip(sids, entries, strict=True), found, strict=True):
                if row is None:
                    stale += [which, sid, repr(_score(score))]
                elif sid not in seen and len(rows) < limit:
                    seen.add(sid)
                    rows.append(row)
            removed = 0
            if stale:
                removed = int(
                    await self._script("session_index", self._index.both, ["drop", *stale])
                )
            if len(rows) >= limit or len(entries) < window:
                break
            start += len(entries) - removed  # removed entries shifted the rest up
            window = 2 * (limit - len(rows)) + 8
        rows.sort(key=lambda r: (r["last_updated"], r["session_id"]), reverse=True)
        return rows[:limit]

    async def session_rows(
        self, session_ids: Collection[str], parked: bool = False
    ) -> list[SessionRow]:
        wanted = sorted({check_session_id(s) for s in list(session_ids)[:MAX_LIMIT]})
        if not wanted:
            return []
        rows = [row for row in await self._rows(wanted, parked) if row is not None]
        rows.sort(key=lambda r: (r["last_updated"], r["session_id"]), reverse=True)
        return rows

    async def _rows(self, session_ids: list[str], parked: bool) -> list[SessionRow | None]:
        replies = await self._read_rows(session_ids, 1)
        newest: list[str | None] = []
        for reply in replies:
            ok = as_text(reply[0]) == "ok" and int(reply[2]) > 0 and len(reply) > 6
            newest.append(as_text(reply[6]) if ok else None)
        states: dict[str, str] = {}
        if parked:
            runs = [r for r in newest if r is not None]
            for run, record in zip(runs, await self._records(runs), strict=True):
                if record is not None:
                    states[run] = record["state"]
        rows: list[SessionRow | None] = []
        for sid, reply, newest_run in zip(session_ids, replies, newest, strict=True):
            run_id = newest_run
            last_updated = as_text(reply[1]) if run_id is not None else ""
            if not last_updated or (parked and not T.is_parked(states.get(run_id or ""))):
                rows.append(None)
                continue
            row: SessionRow = {
                "session_id": sid,
                "last_updated": float(last_updated),
                "turn_count": int(reply[2]),
            }
            if parked:
                row["last_state"] = states[run_id or ""]
            rows.append(row)
        return rows

    async def _window(self, zset: str, start: int, size: int) -> list[tuple[bytes | str, float]]:
        async def read() -> list[tuple[bytes | str, float]]:
            entries: list[Any] = await self._redis.zrevrange(
                zset, start, start + size - 1, withscores=True
            )
            return [(entry[0], float(entry[1])) for entry in entries]

        return await self._call(read)

    async def _read_rows(self, session_ids: list[str], want_ids: int, after: str = "") -> list[Any]:
        """`session_read` for each id, in one round trip (see `_many`)."""
        return await self._many(
            "session_read", [(self._keys(sid).reads, [want_ids, after]) for sid in session_ids]
        )
