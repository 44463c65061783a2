"""Reads of a run's log and record, for the bridge and its readers' views.

Every read goes out as one round trip: on one server a `MULTI` ... `EXEC` of plain
commands (`_read_transaction`, `_open_transaction`), on a cluster `read.lua`, which its
client routes. `open_shared` shares a reader's first read with the readers that open the
same run at the same position at once (a crowd reconnecting after a deploy).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import orjson
from redis import exceptions as redis_errors
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript

from ..bridge.rules import READ_BATCH, Entry, LogRead
from ..cursor import EventKey
from ..values import End, RunInfo
from .calls import Calls, unavailable
from .codec import entry_item, flatten, is_end, parse_log_read, parse_read, stream_info
from .connect import RedisClient
from .fanout import SHARED_READ_SECONDS, RunFeed
from .keys import RunKeys
from .replies import as_text
from .wire import pack

SHARED_OPENS: Final = 256  # `open_shared` reads kept for sharing (runs x positions)


class Reads:
    """The bridge's reads, on its call boundary."""

    def __init__(self, calls: Calls, client: RedisClient, read_script: AsyncScript) -> None:
        self._calls = calls
        self._redis = client
        self._read_script = read_script  # a cluster's reads (`read.lua`)
        # `open_shared`'s reads by (log key, position), with the time each began.
        self._opening: dict[
            tuple[str, str],
            tuple[asyncio.Future[tuple[RunInfo | None, LogRead, EventKey | None] | None], float],
        ] = {}

    @property
    def script(self) -> AsyncScript:
        return self._read_script

    def forget(self, keys: RunKeys) -> None:
        """A removed log (removed through this process, or a read of this process found
        it missing): reads shared by `open_shared` no longer stand for it (other
        processes keep theirs until one of their reads finds it missing, for at most
        `SHARED_READ_SECONDS`: as if read a moment earlier)."""
        for key in [key for key in self._opening if key[0] == keys.log]:
            del self._opening[key]

    async def exists(self, keys: RunKeys) -> bool:
        return bool(await self._calls.call(lambda: self._redis.exists(keys.log)))

    async def get_run(self, keys: RunKeys, run_id: str) -> RunInfo | None:

        async def fetch() -> list[Any]:
            # Cluster pipelines route per key; both keys share a slot either way, and
            # the server's clock is read where they live (see `run_info`).
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hmget(keys.meta, _INFO_FIELDS)
                pipe.xlen(keys.log)
                pipe.xrange(keys.log, "-", "+", count=1)
                pipe.xrevrange(keys.log, "+", "-", count=2)
                if isinstance(self._redis, RedisCluster):
                    owner = self._redis.get_node_from_key(keys.meta)
                    pipe.execute_command("TIME", target_nodes=owner)
                else:
                    pipe.time()
                return list(await pipe.execute())

        values, length, head, tail, clock = await self._calls.call(fetch)
        meta_raw = {k: v for k, v in zip(_INFO_FIELDS, values, strict=True) if v is not None}
        return run_info(
            run_id, meta_raw, int(length), head[0] if head else None, tail, clock_ms(clock)
        )

    async def open_shared(
        self,
        keys: RunKeys,
        run_id: str,
        after: str,
        note: Callable[[], EventKey | None] = lambda: None,
    ) -> tuple[RunInfo | None, LogRead, EventKey | None]:
        """`_open_read`, shared by the readers that open the same run at the same position
        at once (a crowd reconnecting after a deploy: one transaction and one decoding
        for all, as `RunFeed.read_shared` shares a feed's reads): a read in flight is
        joined; a finished one is reused for up to `SHARED_READ_SECONDS` when the log
        ended with its END (nothing can follow it; the log can only vanish meanwhile,
        whose old END such a reader may still be handed, as if it had read a moment
        earlier). A read of a live log is shared while in flight only (its readers go on
        after it and subscribe, so nothing written since is missed), and one that found
        no log is not shared (a run claimed a moment later must not look unknown).
        `note()` is taken as the read is sent, and returned with it (the run's window's
        newest id then: `RunFeed.check_tail`)."""
        key = (keys.log, after)
        earlier = self._opening.get(key)
        now = time.monotonic()
        if earlier is not None and now - earlier[1] < SHARED_READ_SECONDS:
            shared = await asyncio.shield(earlier[0])
            if shared is not None:
                return shared
        future: asyncio.Future[tuple[RunInfo | None, LogRead, EventKey | None] | None]
        future = asyncio.get_running_loop().create_future()
        self._opening.pop(key, None)  # re-inserted last: the newest
        self._opening[key] = (future, now)
        while len(self._opening) > SHARED_OPENS:
            del self._opening[next(iter(self._opening))]
        result: tuple[RunInfo | None, LogRead, EventKey | None] | None = None
        try:
            noted = note()
            info, read = await self._open_read(keys, run_id, after)
            result = (info, read, noted)
            return result
        finally:
            shareable = result if result is not None and result[1].exists else None
            future.set_result(shareable)
            if result is not None and not result[1].exists:
                self.forget(keys)  # other positions' reads from before a removal
            ended = shareable is not None and shareable[1].tail_end() is not None
            if not ended:
                self._forget_open(key, future)
            else:  # shared for SHARED_READ_SECONDS, then held by nobody
                loop = asyncio.get_running_loop()
                loop.call_later(SHARED_READ_SECONDS, self._forget_open, key, future)

    def _forget_open(self, key: tuple[str, str], future: asyncio.Future[Any]) -> None:
        mine = self._opening.get(key)
        if mine is not None and mine[0] is future:
            del self._opening[key]

    async def _open_read(
        self, keys: RunKeys, run_id: str, after: str
    ) -> tuple[RunInfo | None, LogRead]:
        """`open_stream`'s one transaction (`_open_transaction`): the record and a read."""
        command, replies = _open_transaction(keys, after)

        done = await self._calls.transaction(command, replies)
        values, info_reply, tail, clock, raw = done[-1]
        meta = {k.encode(): v for k, v in zip(_INFO_FIELDS, values, strict=True) if v is not None}
        if isinstance(info_reply, redis_errors.ResponseError):
            if "no such key" not in str(info_reply):
                raise unavailable("Redis error", info_reply)
            length, head = 0, None
        else:
            fields = stream_info(info_reply)
            length, head = int(fields[b"length"]), fields.get(b"first-entry")
        info = run_info(run_id, meta, length, head, tail, clock_ms(clock))
        read = parse_log_read(
            [meta.get(field.encode()) for field in _RECORD_FIELDS], info_reply, raw, after
        )
        return info, read

    async def read(self, keys: RunKeys, after: str) -> LogRead:
        """The entries after `after` ("-": from the start) and the log's bounds, read
        atomically, in one round trip.

        On one server: a `MULTI` ... `EXEC` transaction of plain commands (the run
        record's status fields, `XINFO STREAM`, `XRANGE`), written at once. `read.lua`
        reads the same, but every entry it returns is converted to a Lua table and back,
        which cost Redis about four times the `XRANGE` itself (a cold resume of 200
        entries: ~500 µs of a ~640 µs script). A cluster's client routes `read.lua`.
        """
        if not self._calls.keeps_connections:
            reply: list[Any] = await self._calls.script(
                self._read_script, keys.both, after, READ_BATCH + 1, resend=True, acknowledged=False
            )
            return parse_read(reply, after)
        command, replies = _read_transaction(keys, after)

        done = await self._calls.transaction(command, replies)
        results = done[-1]  # EXEC's: the queued commands' replies, in order
        info = results[1]
        if isinstance(info, redis_errors.ResponseError) and "no such key" not in str(info):
            raise unavailable("Redis error", info)  # not a stream: as read.lua would fail
        return parse_log_read(results[0], info, results[2], after)

    async def refresh(self, feed: RunFeed) -> None:
        """Pull everything new since the feed's head into its window."""
        restarts = feed.restarts
        async with feed.refreshing() as mine:
            while mine and feed.take(await self.read(feed.keys, feed.head), READ_BATCH):
                pass
        if feed.missing or feed.restarts != restarts:
            self.forget(feed.keys)  # (the feed dropped its own shared reads: `take`)

    async def event_bounds(self, keys: RunKeys) -> tuple[str | None, str | None]:
        """The first and last retained event ids (the END entry is not an event)."""

        async def fetch() -> list[Any]:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.xrange(keys.log, "-", "+", count=1)
                pipe.xrevrange(keys.log, "+", "-", count=2)
                return list(await pipe.execute())

        head, tail = await self._calls.call(fetch)
        events = [as_text(i) for i, fields in tail if not is_end(flatten(fields))]
        first = as_text(head[0][0]) if head and not is_end(flatten(head[0][1])) else None
        return first, (events[0] if events else None)

    async def tail(self, keys: RunKeys) -> Entry | None:
        reply: Any = await self._calls.call(
            lambda: self._redis.xrevrange(keys.log, "+", "-", count=1)
        )
        if not reply:
            return None
        return entry_item(as_text(reply[0][0]), flatten(reply[0][1]))


_RECORD_FIELDS: Final = ("status", "err", "end_id", "last")
# The run record's fields a `RunInfo` and a read need (HMGET, not HGETALL: the record also
# holds the numbering's id record, lua/publish.lua, which no reader wants).
_INFO_FIELDS: Final = (
    *_RECORD_FIELDS,
    "session",
    "created",
    "updated",
    "cancel",
    "epoch",
    "lease_until",
)


def _read_transaction(keys: RunKeys, after: str) -> tuple[bytes, int]:
    """The packed commands of one read (see `_read`) and how many replies they get."""
    parts = [
        pack("MULTI"),
        pack("HMGET", keys.meta, *_RECORD_FIELDS),
        pack("XINFO", "STREAM", keys.log),
    ]
    # From the position itself: the read tells whether it is an entry (codec._log_read).
    parts.append(pack("XRANGE", keys.log, after, "+", "COUNT", READ_BATCH + 1))
    parts.append(pack("EXEC"))
    return b"".join(parts), len(parts)


def _open_transaction(keys: RunKeys, after: str) -> tuple[bytes, int]:
    """`open_stream`'s commands: `get_run`'s and a read's (`_read_transaction`) in one
    transaction: HMGET, XINFO STREAM (length, first entry, bounds), XREVRANGE of the
    last two entries (the last event when the newest is the END), TIME (the lease's
    clock, `run_info`), XRANGE."""
    parts = [
        pack("MULTI"),
        pack("HMGET", keys.meta, *_INFO_FIELDS),
        pack("XINFO", "STREAM", keys.log),
        pack("XREVRANGE", keys.log, "+", "-", "COUNT", 2),
        pack("TIME"),
    ]
    parts.append(pack("XRANGE", keys.log, after, "+", "COUNT", READ_BATCH + 1))
    parts.append(pack("EXEC"))
    return b"".join(parts), len(parts)


def clock_ms(reply: Any) -> int:
    """Redis' `TIME` reply (raw, or as redis-py's callback makes it) in milliseconds."""
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000


def run_info(
    run_id: str,
    meta_raw: dict[Any, Any],
    length: int,
    head: Any,
    tail: Sequence[Any],
    server_ms: int,
) -> RunInfo | None:
    """A `RunInfo` from the run record (`_INFO_FIELDS`), the log's length, its first entry (None
    when empty) and its last two entries (XREVRANGE), newest first.

    `server_ms`: Redis' clock when it read them. The lease's end is stored in Redis' clock
    (its scripts decide by it) and given here in this process's clock, by what is left of
    it (a duration crosses over, never a time): so the liveness checks, which compare it
    with this process's clock, are right whatever the skew between the two."""
    if not meta_raw and not length:
        return None
    meta = {as_text(k): as_text(v) for k, v in meta_raw.items()}
    entries = [(as_text(i), flatten(f)) for i, f in tail]
    end_entry = None
    if entries and is_end(entries[0][1]):
        end_entry = entry_item(entries[0][0], entries[0][1])
        entries = entries[1:]
    retained = length - (1 if end_entry else 0)
    first = as_text(head[0]) if head and retained > 0 else None
    status = meta.get("status", "running")
    if end_entry is not None and status == "running":
        status = end_entry.status  # type: ignore[union-attr]
    now = time.time()
    until = int(meta.get("lease_until", 0))
    return RunInfo(
        run_id=run_id,
        session_id=meta.get("session") or None,
        status=status,  # type: ignore[arg-type]
        created_at=int(meta.get("created", 0)) / 1000 or now,
        updated_at=int(meta.get("updated", 0)) / 1000 or now,
        first_event_id=first,
        last_event_id=entries[0][0] if entries and retained > 0 else None,
        retained_events=retained,
        cancel_requested=meta.get("cancel") == "1",
        epoch=int(meta.get("epoch", 0)),
        lease_expires_at=now + (until - server_ms) / 1000 if until else 0.0,
        log_exists=bool(length),
        error=end_entry.error if isinstance(end_entry, End) else _error_of(meta),
    )


def _error_of(meta: dict[str, str]) -> Any:
    raw = meta.get("err")
    return orjson.loads(raw) if raw else None
