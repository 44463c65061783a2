"""The Redis Streams backend: many gateway processes share one Redis (or Redis Cluster).

Each run is a stream (the log) and a hash (the run record), tagged into one cluster slot
(see `keys.py`). Every write is one Lua script (see `lua/`) so the producer-token check,
END detection and the append cannot interleave with another writer. Readers use
`read.lua` to read entries together with the exact trim boundary, and a blocking
`XREAD` only as a wake-up signal.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar

import orjson
from redis import exceptions as redis_errors
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript

from ..cursor import EventKey, MalformedCursor, format_key, parse_cursor
from ..errors import (
    BackendUnavailable,
    BridgeClosed,
    InvalidInput,
    ProducerFenced,
    RunOwned,
    StreamEnded,
)
from ..names import check_end_status, check_event_name, check_run_id, check_session_id
from ..settings import Settings
from ..values import (
    HEARTBEAT,
    Claim,
    End,
    EndResult,
    EndStatus,
    LeaseState,
    PublishResult,
    RunInfo,
    StreamEvent,
    StreamGap,
    StreamItem,
    encode_json,
)
from .keys import FIELD_END, FIELD_ERROR, RunKeys, check_prefix, run_keys
from .scripts import lua_source

RedisClient = Redis | RedisCluster
T = TypeVar("T")

READ_BATCH: Final = 512
CLUSTER_SCHEMES: Final = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
_BACKEND_ERRORS: Final = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


def _entry_item(entry_id: str, fields: list[bytes]) -> StreamEvent | End:
    """Turn one stream entry into what a reader sees."""
    if fields and fields[0] == FIELD_END:
        error: Any = None
        if len(fields) >= 4 and fields[2] == FIELD_ERROR:
            error = orjson.loads(fields[3])
        return End(status=_text(fields[1]), error=error, id=entry_id)  # type: ignore[arg-type]
    pairs = dict(zip(fields[::2], fields[1::2], strict=False))
    return StreamEvent(id=entry_id, event=_text(pairs[b"e"]), data=pairs[b"d"])


def _connect(settings: Settings, *, blocking_reads: bool) -> RedisClient:
    url = settings.redis_url
    assert url is not None
    scheme, sep, rest = url.partition("://")
    if scheme in CLUSTER_SCHEMES:
        return RedisCluster.from_url(
            f"{CLUSTER_SCHEMES[scheme]}{sep}{rest}",
            max_connections=settings.redis_max_connections,
        )
    pool = BlockingConnectionPool.from_url(
        url, max_connections=settings.redis_max_connections, timeout=None if blocking_reads else 5
    )
    return Redis(connection_pool=pool)


class RedisStreamBridge:
    """StreamBridge on Redis Streams; build it with `open_bridge` or `connect`."""

    def __init__(self, settings: Settings, commands: RedisClient, reads: RedisClient) -> None:
        self._settings = settings
        self._prefix = check_prefix(settings.redis_key_prefix)
        self._redis = commands  # short commands and scripts
        self._reads = reads  # blocking XREADs hold a connection each; keep them apart
        self._closed = False
        self._scripts: dict[str, AsyncScript] = {
            name: commands.register_script(lua_source(name))
            for name in ("claim", "publish", "publish_end", "renew_lease", "read", "cancel")
        }
        self._read_script = reads.register_script(lua_source("read"))

    @classmethod
    def connect(cls, settings: Settings) -> RedisStreamBridge:
        return cls(
            settings,
            _connect(settings, blocking_reads=False),
            _connect(settings, blocking_reads=True),
        )

    # -- plumbing ---------------------------------------------------------------

    def _keys(self, run_id: str) -> RunKeys:
        return run_keys(self._prefix, check_run_id(run_id))

    async def _call(self, operation: Callable[[], Awaitable[T]]) -> T:
        if self._closed:
            raise BridgeClosed("the bridge is closed")
        try:
            return await operation()
        except _BACKEND_ERRORS as exc:
            raise BackendUnavailable(f"Redis is unavailable: {exc}") from exc
        except redis_errors.RedisError as exc:
            if self._closed:
                raise BridgeClosed("the bridge is closed") from exc
            raise BackendUnavailable(f"Redis error: {exc}") from exc

    async def _script(self, name: str, keys: RunKeys, *args: bytes | str | int) -> Any:
        script = self._scripts[name]
        return await self._call(lambda: script(keys=list(keys.both), args=list(args)))

    def _lease_ms(self, lease_seconds: float | None) -> int:
        seconds = self._settings.lease_seconds if lease_seconds is None else lease_seconds
        if not math.isfinite(seconds) or seconds <= 0:
            raise InvalidInput("lease_seconds must be a positive number")
        return _ms(min(seconds, self._settings.max_lease_seconds))

    @property
    def _ttl_ms(self) -> int:
        return _ms(self._settings.stream_ttl_seconds)

    # -- producer side ----------------------------------------------------------

    async def claim(
        self,
        run_id: str,
        *,
        session_id: str | None = None,
        lease_seconds: float | None = None,
        takeover: bool = False,
    ) -> Claim:
        keys = self._keys(run_id)
        if session_id is not None:
            check_session_id(session_id)
        token = secrets.token_urlsafe(18)
        reply = await self._script(
            "claim",
            keys,
            token,
            self._lease_ms(lease_seconds),
            "1" if takeover else "0",
            session_id or "",
            self._ttl_ms,
        )
        outcome = _text(reply[0])
        if outcome == "owned":
            raise RunOwned(f"run {run_id} has a live producer lease")
        if outcome == "ended":
            raise StreamEnded(f"run {run_id} has ended ({_text(reply[1])})")
        session = _text(reply[3]) or None
        return Claim(
            run_id=run_id,
            session_id=session,
            token=token,
            epoch=int(reply[1]),
            lease_expires_at=int(reply[2]) / 1000,
        )

    def _raise_refusal(self, run_id: str, reply: list[Any]) -> None:
        outcome = _text(reply[0])
        if outcome == "fenced":
            raise ProducerFenced(f"producer token refused for run {run_id} ({_text(reply[1])})")
        if outcome == "ended":
            raise StreamEnded(f"run {run_id} has ended")

    async def renew_lease(
        self, run_id: str, *, producer_token: str, lease_seconds: float | None = None
    ) -> LeaseState:
        keys = self._keys(run_id)
        lease_ms = "" if lease_seconds is None else self._lease_ms(lease_seconds)
        reply = await self._script("renew_lease", keys, producer_token, lease_ms, self._ttl_ms)
        self._raise_refusal(run_id, reply)
        return LeaseState(lease_expires_at=int(reply[1]) / 1000, cancel_requested=reply[2] == 1)

    async def publish(
        self, run_id: str, event: str, data: Any, *, producer_token: str
    ) -> PublishResult:
        return await self.publish_many(run_id, [(event, data)], producer_token=producer_token)

    async def publish_many(
        self, run_id: str, events: Sequence[tuple[str, Any]], *, producer_token: str
    ) -> PublishResult:
        keys = self._keys(run_id)
        if not events:
            raise InvalidInput("a batch needs at least one event")
        args: list[bytes | str | int] = [
            producer_token,
            self._settings.max_events_per_run,
            self._ttl_ms,
        ]
        for name, data in events:
            args.append(check_event_name(name))
            args.append(encode_json(data))
        reply = await self._script("publish", keys, *args)
        self._raise_refusal(run_id, reply)
        return PublishResult(
            ids=tuple(_text(entry_id) for entry_id in reply[2:]), cancel_requested=reply[1] == 1
        )

    async def publish_end(
        self,
        run_id: str,
        status: EndStatus,
        error: Any = None,
        *,
        producer_token: str | None,
    ) -> EndResult:
        keys = self._keys(run_id)
        check_end_status(status)
        ended_ttl = _ms(self._settings.ended_ttl_seconds)
        reply = await self._script(
            "publish_end",
            keys,
            producer_token or "",
            status,
            b"" if error is None else encode_json(error),
            "1" if self._settings.legacy_end_scan_enabled else "0",
            ended_ttl,
            max(ended_ttl, self._ttl_ms),
        )
        if _text(reply[0]) == "noop":
            return EndResult(id=None, deduplicated=False)
        self._raise_refusal(run_id, reply)
        return EndResult(id=_text(reply[1]) or None, deduplicated=reply[2] == 1)

    async def request_cancel(self, run_id: str) -> bool:
        keys = self._keys(run_id)
        script = self._scripts["cancel"]
        return bool(await self._call(lambda: script(keys=[keys.meta])))

    async def cleanup(self, run_id: str, delay: float = 0) -> None:
        keys = self._keys(run_id)
        if delay > 0:
            await self._call(lambda: self._redis.pexpire(keys.log, _ms(delay)))
        else:
            await self._call(lambda: self._redis.delete(keys.log))

    # -- reader side ------------------------------------------------------------

    async def stream_exists(self, run_id: str) -> bool:
        keys = self._keys(run_id)
        return bool(await self._call(lambda: self._redis.exists(keys.log)))

    async def get_run(self, run_id: str) -> RunInfo | None:
        keys = self._keys(run_id)

        async def fetch() -> list[Any]:
            # Cluster pipelines route per key; both keys share a slot either way.
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hgetall(keys.meta)
                pipe.xlen(keys.log)
                pipe.xrange(keys.log, "-", "+", count=1)
                pipe.xrevrange(keys.log, "+", "-", count=2)
                return list(await pipe.execute())

        meta_raw, length, head, tail = await self._call(fetch)
        if not meta_raw and not length:
            return None
        meta = {_text(k): _text(v) for k, v in meta_raw.items()}
        entries = [(_text(i), _flatten(f)) for i, f in tail]
        end_entry = None
        if entries and _is_end(entries[0][1]):
            end_entry = _entry_item(entries[0][0], entries[0][1])
            entries = entries[1:]
        retained = int(length) - (1 if end_entry else 0)
        first = _text(head[0][0]) if head and retained > 0 else None
        status = meta.get("status", "running")
        if end_entry is not None and status == "running":
            status = end_entry.status  # type: ignore[union-attr]
        now = time.time()
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
            lease_expires_at=int(meta.get("lease_until", 0)) / 1000,
            log_exists=bool(length),
            error=end_entry.error if isinstance(end_entry, End) else None,
        )

    async def _read(self, keys: RunKeys, after: str) -> list[Any]:
        script = self._read_script
        reply: list[Any] = await self._call(
            lambda: script(keys=list(keys.both), args=[after, READ_BATCH])
        )
        return reply

    async def _bounds(self, keys: RunKeys) -> tuple[str | None, str | None]:
        async def fetch() -> list[Any]:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.xrange(keys.log, "-", "+", count=1)
                pipe.xrevrange(keys.log, "+", "-", count=1)
                return list(await pipe.execute())

        head, tail = await self._call(fetch)
        return (_text(head[0][0]) if head else None, _text(tail[0][0]) if tail else None)

    async def _tail(self, keys: RunKeys) -> tuple[str, list[bytes]] | None:
        reply: Any = await self._call(lambda: self._redis.xrevrange(keys.log, "+", "-", count=1))
        if not reply:
            return None
        return _text(reply[0][0]), _flatten(reply[0][1])

    async def _wait_for_entries(self, keys: RunKeys, after: str, block_seconds: float) -> bool:
        """Block until the log has something after `after`, or `block_seconds` pass."""
        position = "0-0" if after == "-" else after
        reply = await self._call(
            lambda: self._reads.xread({keys.log: position}, count=1, block=_ms(block_seconds))
        )
        return bool(reply)

    async def subscribe(
        self,
        run_id: str,
        last_event_id: str | None = None,
        heartbeat_interval: float | None = None,
    ) -> AsyncIterator[StreamItem]:
        keys = self._keys(run_id)
        interval = (
            self._settings.heartbeat_interval_seconds
            if heartbeat_interval is None
            else heartbeat_interval
        )
        cursor: EventKey | None = None
        position = "-"  # read after this id; "-" is "from the earliest retained"
        if last_event_id is not None:
            try:
                cursor = parse_cursor(last_event_id)
                position = format_key(cursor)
            except MalformedCursor:
                # Active stream: live tail only. Ended stream: replay through END.
                newest = await self._tail(keys)
                if newest is not None and not _is_end(newest[1]):
                    position = newest[0]
        check_gap = cursor is not None
        seen_stream = False
        idle_since = time.monotonic()
        while True:
            exists, trimmed, entries, tail, status = await self._read(keys, position)
            if exists:
                seen_stream = True
            elif seen_stream:
                yield StreamGap(last_event_id_or(position), None, None, "stream_removed")
                return
            elif status and _text(status) != "running":
                # The log of an ended run is gone but its record remains: never hang.
                yield End(status=_text(status))  # type: ignore[arg-type]
                return
            behind = check_gap and trimmed and position != "-"
            if behind and parse_cursor(position) < parse_cursor(_text(trimmed)):
                # Something after our position was trimmed before we read it.
                earliest, latest = await self._bounds(keys)
                yield StreamGap(position, earliest, latest, "trimmed")
                return
            if entries:
                for raw_id, fields in entries:
                    item = _entry_item(_text(raw_id), fields)
                    yield item
                    if isinstance(item, End):
                        return
                    position = item.id
                check_gap = True
                idle_since = time.monotonic()
                continue
            if tail and _is_end(tail[1]):
                # The cursor is at or past the END entry: the run is over.
                yield _entry_item(_text(tail[0]), tail[1])
                return
            remaining = interval - (time.monotonic() - idle_since)
            if remaining <= 0:
                yield HEARTBEAT
                idle_since = time.monotonic()
                continue
            try:
                await self._wait_for_entries(keys, position, remaining)
            except BridgeClosed:
                yield StreamGap(last_event_id_or(position), None, None, "bridge_closed")
                return
            except BackendUnavailable:
                if self._closed:
                    yield StreamGap(last_event_id_or(position), None, None, "bridge_closed")
                    return
                raise

    # -- lifecycle --------------------------------------------------------------

    async def ping(self) -> None:
        await self._call(self._redis.ping)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Closing the reader connections wakes every blocked XREAD at once.
        for client in (self._reads, self._redis):
            try:
                if isinstance(client, RedisCluster):
                    await client.aclose()
                else:
                    await client.aclose(close_connection_pool=True)
            except (*_BACKEND_ERRORS, redis_errors.RedisError):
                pass


def last_event_id_or(position: str) -> str | None:
    return None if position == "-" else position


def _is_end(fields: Sequence[bytes]) -> bool:
    return bool(fields) and fields[0] == FIELD_END


def _flatten(fields: Any) -> list[bytes]:
    if isinstance(fields, dict):
        flat: list[bytes] = []
        for key, value in fields.items():
            flat += [key, value]
        return flat
    return list(fields)
