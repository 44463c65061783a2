"""SessionStore on Redis: durable turns, a bounded session index, durable tombstones.

Key layout and the Cluster trade-off: `keys.py`. Scripts (one per concern, in `lua/`):

- `session_turn_write`: tombstone check + compare-and-set of the turn record + the
  session's turn list, expiry list and meta, atomically in the session's slot.
- `session_index`: the global index (by activity, parked), in its own slot.
- `session_read`: one session's verified row (and newest turn ids), dropping list
  entries of expired turns (bounded: `PRUNE_BUDGET` per call).
- `session_delete`: retire (tombstone first) or clear (refused while a turn runs).

A write reads the record, evolves it with `turns.py` (the same code as the memory
store), and writes it back with the revision it read; a concurrent writer makes it retry.
Then it touches the global index. The index is a hint: `list_sessions` verifies each
candidate with `session_read` (tombstoned, emptied or unparked sessions are dropped with
a compare-and-remove), so a late write racing a retire can at worst leave a stale index
entry that no reader ever returns.

Read cost of `list_sessions(limit)`: one `ZREVRANGE` of `limit` ids, then one pipelined
`EVALSHA session_read` per id (concurrent calls on Cluster, where pipelines refuse
scripts; two round trips, limit + 1 commands, independent of the
number of sessions; measured by `bench/sessions_index.py`). Stale rows (dropped with a
compare-and-remove) make it read further windows of twice the shortfall, at most
`MAX_WINDOWS` windows, so one read never does more than a bounded amount of work; a
page may then come back short, and the next read continues the cleanup.
"""

from __future__ import annotations

import asyncio
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

from ..bridge.redis_notifier import Notifier
from ..bridge.replies import as_text, ceil_ms
from ..bridge.scripts import ensure_loaded, lua_source
from ..errors import BackendUnavailable, SessionActive
from ..names import check_run_id, check_session_id
from ..settings import Settings
from ..values import EndStatus, encode_json
from . import turns as T
from .base import DEFAULT_LIMIT, MAX_LIMIT, SessionRow, parse_limit
from .keys import SessionKeys, check_prefix, index_keys, session_keys
from .shaping import shape_input_message
from .watch import TurnSignal

RedisClient = Redis | RedisCluster
R = TypeVar("R")

PRUNE_BUDGET: Final = 16  # expired turn entries dropped per script call, at most
MAX_RETRIES: Final = 32  # compare-and-set attempts of one write
MAX_WINDOWS: Final = 4  # index windows one list_sessions call may read
_BACKEND_ERRORS: Final = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError)


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


class RedisSessionStore:
    def __init__(
        self,
        settings: Settings,
        client: RedisClient,
        *,
        limits: T.TurnLimits = T.DEFAULT_LIMITS,
        notifier: Notifier | None = None,
        turns: AbstractAsyncContextManager[None] | None = None,
    ) -> None:
        self._prefix = check_prefix(settings.redis_key_prefix)
        self._redis = client
        # The bridge's turns at the pool they share (see bridge/redis_turns.py).
        self._turns = turns or asyncio.Semaphore(settings.redis_max_connections)
        self._notifier = notifier  # the bridge's: session feeds wait on it
        self._running_ttl_ms = ceil_ms(settings.stream_ttl_seconds)
        self._ended_ttl_ms = ceil_ms(settings.ended_ttl_seconds)
        self._limits = limits
        self._index = index_keys(self._prefix)
        self._scripts: dict[str, AsyncScript] = {
            name: client.register_script(lua_source(name))
            for name in ("session_turn_write", "session_read", "session_delete", "session_index")
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
        try:
            async with self._turns:
                return await operation()
        except _BACKEND_ERRORS as exc:
            raise BackendUnavailable(f"Redis is unavailable: {exc}") from exc
        except redis_errors.RedisError as exc:
            raise BackendUnavailable(f"Redis error: {exc}") from exc

    async def ensure_scripts(self) -> int:
        """Readiness: load any of the session scripts Redis lacks; how many it loaded."""
        scripts = list(self._scripts.values())
        return await self._call(lambda: ensure_loaded(self._redis, scripts))

    async def _script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        script = self._scripts[name]
        return await self._call(lambda: script(keys=keys, args=args))

    def _ttl_ms(self, state: str) -> int:
        if T.is_parked(state):
            return 0
        return self._ended_ttl_ms if T.is_ended(state) else self._running_ttl_ms

    async def _write(
        self,
        session_id: str,
        run_id: str,
        evolve: Callable[[dict[str, Any] | None], dict[str, Any] | None],
    ) -> bool:
        """Read-evolve-CAS loop. `evolve(current)` returns the record to store, or None
        for "no change". False when the session is retired (or nothing was stored)."""
        keys = self._keys(session_id)
        turn_key = keys.turn(check_run_id(run_id))
        for _ in range(MAX_RETRIES):
            rev, raw = await self._call(lambda: self._redis.hmget(turn_key, ["rev", "doc"]))
            current = orjson.loads(raw) if raw is not None else None
            doc = evolve(current)
            if doc is None:
                return current is not None and not await self.is_retired(session_id)
            reply = await self._script(
                "session_turn_write",
                [keys.tomb, keys.meta, keys.turns, keys.exp, turn_key],
                [
                    run_id,
                    as_text(rev) if rev is not None else "0",
                    encode_json(doc),
                    doc["state"],
                    repr(float(doc["created_at"])),
                    repr(float(doc["last_updated"])),
                    self._ttl_ms(doc["state"]),
                    PRUNE_BUDGET,
                    keys.feed,
                ],
            )
            status = as_text(reply[0])
            if status == "conflict":
                continue
            if status == "retired":
                return False
            last_updated, last_state = as_text(reply[1]), as_text(reply[2])
            await self._script(
                "session_index",
                self._index.both,
                ["touch", session_id, last_updated, "1" if T.is_parked(last_state) else "0"],
            )
            return True
        raise BackendUnavailable(f"turn {run_id!r}: too much write contention, try again")

    # -- writes -----------------------------------------------------------------

    async def start_turn(
        self, session_id: str, run_id: str, input_message: Any, now: float
    ) -> bool:
        check_session_id(session_id)

        def evolve(current: dict[str, Any] | None) -> dict[str, Any] | None:
            if current is not None:
                return None  # idempotent (a takeover claim of the same run)
            return T.new_turn(session_id, run_id, shape_input_message(input_message), now)

        return await self._write(session_id, run_id, evolve)

    async def apply_events(
        self, session_id: str, run_id: str, events: list[tuple[str, Any]], now: float
    ) -> bool:
        check_session_id(session_id)

        def evolve(current: dict[str, Any] | None) -> dict[str, Any] | None:
            if current is None:
                doc = T.new_turn(session_id, run_id, None, now)
                T.apply_events(doc, events, now, self._limits)
                return doc
            return current if T.apply_events(current, events, now, self._limits) else None

        return await self._write(session_id, run_id, evolve)

    async def end_turn(self, session_id: str, run_id: str, status: EndStatus, now: float) -> bool:
        check_session_id(session_id)

        def evolve(current: dict[str, Any] | None) -> dict[str, Any] | None:
            if current is None or not T.end_turn(current, status, now):
                return None
            return current

        return await self._write(session_id, run_id, evolve)

    async def delete_session(self, session_id: str, retire: bool) -> list[str]:
        keys = self._keys(session_id)
        when = time.time()
        reply = await self._script(
            "session_delete",
            keys.lists,
            ["retire" if retire else "clear", repr(when), keys.turn_prefix],
        )
        if as_text(reply[0]) == "active":
            raise SessionActive(
                f"session {session_id!r} has a running turn ({as_text(reply[1])!r}); "
                "retry after it ends"
            )
        await self._script(
            "session_index",
            self._index.both,
            ["remove", session_id, "1e308" if retire else repr(when)],
        )
        await self._call(lambda: self._redis.spublish(keys.feed, b""))  # wake its feeds
        return [as_text(run_id) for run_id in reply[1:]]

    async def is_retired(self, session_id: str) -> bool:
        tomb = self._keys(session_id).tomb
        return bool(await self._call(lambda: self._redis.exists(tomb)))

    # -- reads ------------------------------------------------------------------

    async def running_turn(self, session_id: str) -> str | None:
        keys = self._keys(session_id)

        async def newest() -> list[Any]:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.exists(keys.tomb)
                pipe.hget(keys.meta, "newest_run")
                return list(await pipe.execute())

        retired, run_id = await self._call(newest)
        if retired or run_id is None:
            return None
        run = as_text(run_id)
        state = await self._call(lambda: self._redis.hget(keys.turn(run), "state"))
        if state is None or as_text(state) not in T.LIVE_STATES:
            return None  # ended, or expired (the record's own TTL)
        return run

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
            replies = await self._read_rows([as_text(sid) for sid, _ in entries], 0)
            stale: list[str] = []
            for (raw_sid, score), reply in zip(entries, replies, strict=True):
                sid = as_text(raw_sid)
                row = self._row(sid, reply, parked)
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
        replies = await self._read_rows(wanted, 0)
        rows = [
            row
            for sid, reply in zip(wanted, replies, strict=True)
            if (row := self._row(sid, reply, parked)) is not None
        ]
        rows.sort(key=lambda r: (r["last_updated"], r["session_id"]), reverse=True)
        return rows

    async def _window(self, zset: str, start: int, size: int) -> list[tuple[bytes | str, float]]:
        async def read() -> list[tuple[bytes | str, float]]:
            entries: list[Any] = await self._redis.zrevrange(
                zset, start, start + size - 1, withscores=True
            )
            return [(entry[0], float(entry[1])) for entry in entries]

        return await self._call(read)

    async def list_turns(self, session_id: str, limit: int = DEFAULT_LIMIT) -> list[dict[str, Any]]:
        limit = parse_limit(limit)
        keys = self._keys(session_id)
        (reply,) = await self._read_rows([session_id], limit)
        if as_text(reply[0]) != "ok":
            return []
        run_ids = [as_text(r) for r in reply[4:]]
        if not run_ids:
            return []

        async def fetch() -> list[Any]:
            async with self._redis.pipeline(transaction=False) as pipe:
                for run_id in run_ids:
                    pipe.hget(keys.turn(run_id), "doc")
                return list(await pipe.execute())

        docs = await self._call(fetch)
        turns = [orjson.loads(doc) for doc in docs if doc is not None]
        turns.sort(key=lambda d: (d["last_updated"], d["run_id"]))
        return turns

    async def _read_rows(self, session_ids: list[str], want_ids: int) -> list[Any]:
        """`session_read` for each id, pipelined (one round trip; per node in Cluster)."""
        script = self._scripts["session_read"]
        if isinstance(self._redis, RedisCluster):
            # a cluster pipeline refuses EVALSHA: run the per-slot scripts concurrently
            calls = [
                functools.partial(script, keys=self._keys(sid).lists, args=[PRUNE_BUDGET, want_ids])
                for sid in session_ids
            ]
            return await self._call(lambda: _gather(calls))

        async def run() -> list[Any]:
            async with self._redis.pipeline(transaction=False) as pipe:
                for sid in session_ids:
                    pipe.evalsha(script.sha, 4, *self._keys(sid).lists, PRUNE_BUDGET, want_ids)
                return list(await pipe.execute())

        try:
            return await self._call(run)
        except BackendUnavailable as exc:
            if not isinstance(exc.__cause__, redis_errors.NoScriptError):
                raise
        # SCRIPT FLUSH or a fresh server: load it again and retry once
        await self._call(lambda: self._redis.script_load(script.script))
        return await self._call(run)

    @staticmethod
    def _row(session_id: str, reply: Any, parked: bool) -> SessionRow | None:
        if as_text(reply[0]) != "ok" or int(reply[3]) == 0:
            return None  # retired, or every turn expired / cleared
        last_updated, last_state = as_text(reply[1]), as_text(reply[2])
        if not last_updated:
            return None
        if parked and not T.is_parked(last_state):
            return None
        row: SessionRow = {
            "session_id": session_id,
            "last_updated": float(last_updated),
            "turn_count": int(reply[3]),
        }
        if parked:
            row["last_state"] = last_state
        return row
