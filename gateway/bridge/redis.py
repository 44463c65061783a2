"""The Redis Streams backend: many gateway processes share one Redis (or Redis Cluster).

Each run is a stream (the log) and a hash (the run record), tagged into one cluster slot
(see `keys.py`). Every write is one Lua script (see `lua/`) so the producer-token check,
END detection and the append cannot interleave with another writer. Readers use
`read.lua` to read entries together with the exact trim boundary, and a blocking
`XREAD` only as a wake-up signal.
"""

from __future__ import annotations

import functools
import math
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit

import anyio
import orjson
from anyio.abc import TaskGroup
from redis import exceptions as redis_errors
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript

from ..cursor import EventKey, MalformedCursor, format_key, parse_cursor
from ..errors import (
    BackendUnavailable,
    BridgeClosed,
    InvalidInput,
    ProducerFenced,
    RunOwned,
    SequenceConflict,
    SequenceGap,
    StreamEnded,
)
from ..names import check_end_status, check_event_name, check_run_id, check_session_id
from ..sequence import check_seq
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
from .base import one_by_one
from .keys import FIELD_DATA, FIELD_END, FIELD_ERROR, FIELD_EVENT, RunKeys, check_prefix, run_keys
from .redis_fanout import Notifier
from .scripts import ensure_loaded, lua_source

RedisClient = Redis | RedisCluster
T = TypeVar("T")

READ_BATCH: Final = 512
CLUSTER_SCHEMES: Final = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
_BACKEND_ERRORS: Final = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError)
# Replies meaning the server refused the command without running it (a cluster in
# failover, a slot being moved): a write may be re-sent after these, and only these.
_REFUSED_ERRORS: Final = (
    redis_errors.BusyLoadingError,  # still loading its AOF/RDB after a restart
    redis_errors.ClusterDownError,
    redis_errors.SlotNotCoveredError,
    redis_errors.TryAgainError,
)
# Bridge-level retries of one operation (and the first backoff, doubled each time).
RETRIES: Final = 4
RETRY_BACKOFF: Final = 0.05


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
    if len(fields) == 4 and fields[0] == FIELD_EVENT and fields[2] == FIELD_DATA:
        # The layout lua/publish.lua writes: no dict per entry on the replay hot path.
        return StreamEvent(id=entry_id, event=fields[1].decode(), data=fields[3])
    pairs = dict(zip(fields[::2], fields[1::2], strict=False))  # another writer's order
    return StreamEvent(id=entry_id, event=_text(pairs[FIELD_EVENT]), data=pairs[FIELD_DATA])


def _no_retry() -> Retry:
    return Retry(NoBackoff(), 0)


def _connect(settings: Settings) -> RedisClient:
    """The command client, with redis-py's own retries switched off.

    redis-py (8.x) re-sends a command up to 10 times on a ConnectionError/TimeoutError,
    also when the command may already have run (the reply was lost): for a publish
    script that is a silently duplicated event. So redis-py never retries here; the
    bridge does (`_call`): reads on any backend error, writes only on replies that say
    the server refused the command without running it (CLUSTERDOWN, TRYAGAIN, an
    uncovered slot). Any other failure of a write reaches the caller as
    BackendUnavailable (HTTP 503): the write may or may not have been applied, and the
    producer can find out from the run's `last_event_id`. MOVED/ASK redirections are
    followed by the cluster client itself (the command was not run where it was refused).
    """
    url = settings.redis_url
    assert url is not None
    scheme, sep, rest = url.partition("://")
    if scheme in CLUSTER_SCHEMES:
        return RedisCluster.from_url(
            f"{CLUSTER_SCHEMES[scheme]}{sep}{rest}",
            max_connections=settings.redis_max_connections,
            retry=_no_retry(),
        )
    # Waiting for a free connection is bounded: past it the caller sees BackendUnavailable.
    pool = BlockingConnectionPool.from_url(
        url, max_connections=settings.redis_max_connections, timeout=10, retry=_no_retry()
    )
    return Redis(connection_pool=pool)


def _notification_client(commands: RedisClient, settings: Settings) -> Callable[[], Redis]:
    """A factory of the one pub/sub connection: to the server, or to any cluster node."""
    url = settings.redis_url
    assert url is not None
    if isinstance(commands, Redis):
        return lambda: Redis.from_url(url)
    scheme, _, rest = url.partition("://")
    parts = urlsplit(f"{CLUSTER_SCHEMES[scheme]}://{rest}")
    userinfo = parts.netloc.rpartition("@")[0]

    def any_node() -> Redis:
        nodes = commands.get_nodes() or [commands.get_default_node()]
        node = nodes[int(time.monotonic() * 1000) % len(nodes)]  # rotate across reconnects
        netloc = f"{userinfo}@{node.host}:{node.port}" if userinfo else f"{node.host}:{node.port}"
        return Redis.from_url(parts._replace(netloc=netloc, query="").geturl())

    return any_node


class RedisStreamBridge:
    """StreamBridge on Redis Streams.

    Use it as an async context manager (`open_bridge` does): it owns the task that
    listens for change notifications.
    """

    def __init__(self, settings: Settings, commands: RedisClient) -> None:
        self._settings = settings
        self._prefix = check_prefix(settings.redis_key_prefix)
        self._redis = commands
        self._closed = False
        self._scripts: dict[str, AsyncScript] = {
            name: commands.register_script(lua_source(name))
            for name in ("claim", "publish", "publish_end", "renew_lease", "read", "cancel")
        }
        # Plain counters for the HTTP layer's metrics (the bridge imports no metrics code).
        self.notifier_reconnects = 0
        self._notifier = Notifier(
            _notification_client(commands, settings),
            settings.fanout_window_events,
            on_reconnect=self._count_notifier_reconnect,
        )
        self._task_group: TaskGroup | None = None

    @property
    def client(self) -> RedisClient:
        """The command client, for stores that live beside the runs (sessions)."""
        return self._redis

    @classmethod
    def connect(cls, settings: Settings) -> RedisStreamBridge:
        return cls(settings, _connect(settings))

    async def __aenter__(self) -> RedisStreamBridge:
        if isinstance(self._redis, RedisCluster):
            try:
                await self._redis.initialize()  # learn the nodes before picking one to listen to
            except (*_BACKEND_ERRORS, redis_errors.RedisError) as exc:
                raise BackendUnavailable(f"Redis Cluster is unavailable: {exc}") from exc
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        await self._task_group.start(self._notifier.run)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        with anyio.CancelScope(shield=True):
            await self.close()
        if self._task_group is not None:
            self._task_group.cancel_scope.cancel()
            await self._task_group.__aexit__(None, None, None)
            self._task_group = None

    def _count_notifier_reconnect(self) -> None:
        self.notifier_reconnects += 1

    # -- plumbing ---------------------------------------------------------------

    def _keys(self, run_id: str) -> RunKeys:
        return run_keys(self._prefix, check_run_id(run_id))

    async def _call(self, operation: Callable[[], Awaitable[T]], *, resend: bool = True) -> T:
        """Run one Redis operation, retried a few times; with `resend=False` only after a
        refusal (the operation did not run), never after a connection failure."""
        attempt = 0
        while True:
            if self._closed:
                raise BridgeClosed("the bridge is closed")
            try:
                return await operation()
            except _REFUSED_ERRORS as exc:
                if attempt >= RETRIES:
                    raise BackendUnavailable(f"Redis error: {exc}") from exc
            except _BACKEND_ERRORS as exc:
                if not resend or attempt >= RETRIES:
                    raise BackendUnavailable(f"Redis is unavailable: {exc}") from exc
            except redis_errors.RedisError as exc:
                if self._closed:
                    raise BridgeClosed("the bridge is closed") from exc
                raise BackendUnavailable(f"Redis error: {exc}") from exc
            await anyio.sleep(RETRY_BACKOFF * 2**attempt)
            attempt += 1

    async def _script(self, name: str, keys: RunKeys, *args: bytes | str | int) -> Any:
        """A write script: never re-sent after it may have run (see `_connect`)."""
        script = self._scripts[name]
        return await self._call(lambda: script(keys=list(keys.both), args=list(args)), resend=False)

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
        self,
        run_id: str,
        events: Sequence[tuple[str, Any]],
        *,
        producer_token: str,
        seq: int | None = None,
    ) -> PublishResult:
        keys = self._keys(run_id)
        if not events:
            raise InvalidInput("a batch needs at least one event")
        args: list[bytes | str | int] = [
            producer_token,
            self._settings.max_events_per_run,
            self._ttl_ms,
            "" if seq is None else check_seq(seq, len(events)),
        ]
        for name, data in events:
            args.append(check_event_name(name))
            args.append(encode_json(data))
        reply = await self._script("publish", keys, *args)
        self._raise_refusal(run_id, reply)
        # -- numbered appends (see gateway.sequence)
        outcome = _text(reply[0])
        if outcome == "duplicate":
            return PublishResult(
                ids=tuple(_text(reply[3]).split(" ")),
                cancel_requested=reply[1] == 1,
                session_id=_text(reply[2]) or None,
                duplicate=True,
            )
        if outcome == "sequence_gap":
            expected = int(reply[1])
            raise SequenceGap(
                f"batch starts at event {seq}; the next expected is {expected}", expected
            )
        if outcome == "sequence_conflict":
            expected = int(reply[1])
            raise SequenceConflict(
                f"batch starting at event {seq} overlaps applied events and is not the last "
                f"applied batch (the next expected is {expected})",
                expected,
            )
        # --
        return PublishResult(
            ids=tuple(_text(entry_id) for entry_id in reply[3:]),
            cancel_requested=reply[1] == 1,
            session_id=_text(reply[2]) or None,
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
        return EndResult(
            id=_text(reply[1]) or None,
            deduplicated=reply[2] == 1,
            session_id=_text(reply[3]) or None,
            legacy_scanned=len(reply) > 4 and reply[4] == 1,
        )

    async def request_cancel(self, run_id: str) -> bool:
        keys = self._keys(run_id)
        script = self._scripts["cancel"]
        return bool(await self._call(lambda: script(keys=[keys.meta]), resend=False))

    async def cleanup(self, run_id: str, delay: float = 0) -> None:
        keys = self._keys(run_id)
        if delay > 0:
            await self._call(lambda: self._redis.pexpire(keys.log, _ms(delay)))
        else:
            await self._call(lambda: self._redis.delete(keys.log))
            # Wake local feeds of every gateway so readers learn of the removal now.
            await self._call(lambda: self._redis.publish(keys.log, b""))

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

    async def _read_entries(self, keys: RunKeys, after: str) -> list[Any]:
        """`_read`, with the entries turned into what readers see (shared, read-only)."""
        exists, trimmed, entries, tail, status = await self._read(keys, after)
        items = [_entry_item(_text(i), fields) for i, fields in entries]
        end = _first_end(items)  # a legacy log may hold entries after an END
        return [exists, trimmed, items if end is None else items[: end + 1], tail, status]

    async def _read(self, keys: RunKeys, after: str) -> list[Any]:
        script = self._scripts["read"]
        reply: list[Any] = await self._call(
            lambda: script(keys=list(keys.both), args=[after, READ_BATCH])
        )
        return reply

    async def _bounds(self, keys: RunKeys) -> tuple[str | None, str | None]:
        """The first and last retained event ids (the END entry is not an event)."""

        async def fetch() -> list[Any]:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.xrange(keys.log, "-", "+", count=1)
                pipe.xrevrange(keys.log, "+", "-", count=2)
                return list(await pipe.execute())

        head, tail = await self._call(fetch)
        events = [_text(i) for i, fields in tail if not _is_end(_flatten(fields))]
        first = _text(head[0][0]) if head and not _is_end(_flatten(head[0][1])) else None
        return first, (events[0] if events else None)

    async def _tail(self, keys: RunKeys) -> tuple[str, list[bytes]] | None:
        reply: Any = await self._call(lambda: self._redis.xrevrange(keys.log, "+", "-", count=1))
        if not reply:
            return None
        return _text(reply[0][0]), _flatten(reply[0][1])

    def subscribe(
        self,
        run_id: str,
        last_event_id: str | None = None,
        heartbeat_interval: float | None = None,
    ) -> AsyncIterator[StreamItem]:
        return one_by_one(self.subscribe_batches(run_id, last_event_id, heartbeat_interval))

    async def subscribe_batches(
        self,
        run_id: str,
        last_event_id: str | None = None,
        heartbeat_interval: float | None = None,
    ) -> AsyncGenerator[Sequence[StreamItem], None]:
        keys = self._keys(run_id)
        interval = (
            self._settings.heartbeat_interval_seconds
            if heartbeat_interval is None
            else heartbeat_interval
        )
        position = "-"  # delivered up to here; "-" is "nothing yet, from the earliest"
        check_gap = False  # a reader without a cursor replays whatever is retained
        newest = await self._tail(keys)
        if last_event_id is not None:
            try:
                position = format_key(parse_cursor(last_event_id))
                check_gap = True
            except MalformedCursor:
                # Active stream: live tail only. Ended stream: replay through END.
                if newest is not None and not _is_end(newest[1]):
                    position = newest[0]
        seen_stream = newest is not None
        seen_record = False  # the run record (without a log yet) was there
        caught_up = False  # reading Redis directly until we reach the shared window
        idle_since = time.monotonic()
        async with self._notifier.attach(keys, newest[0] if newest else "0-0") as feed:
            while True:
                if self._closed or feed.closed:
                    yield [StreamGap(_requested(position), None, None, "bridge_closed")]
                    return
                try:
                    if feed.stale:
                        await feed.refresh(self._read, _entry_item, READ_BATCH)
                    window = feed.after(_position_key(position)) if caught_up else None
                    if window is None:
                        direct = await feed.read_shared(
                            position, functools.partial(self._read_entries, keys, position)
                        )
                except (BridgeClosed, BackendUnavailable):
                    if self._closed:
                        continue
                    raise
                if window is None:
                    exists, trimmed, entries, tail, status = direct
                    if exists:
                        seen_stream = True
                    elif seen_stream:
                        yield [StreamGap(_requested(position), None, None, "stream_removed")]
                        return
                    elif status and _text(status) != "running":
                        # The log of an ended run is gone but its record remains.
                        yield [End(status=_text(status))]  # type: ignore[arg-type]
                        return
                    elif status:
                        seen_record = True  # claimed, nothing published yet
                    elif seen_record:
                        # The record we saw is gone too (Redis lost its data, or the
                        # run expired): waiting would mean heartbeats forever.
                        yield [StreamGap(_requested(position), None, None, "stream_removed")]
                        return
                    behind = check_gap and trimmed and position != "-"
                    if behind and parse_cursor(position) < parse_cursor(_text(trimmed)):
                        # Something after our position was trimmed before we read it.
                        earliest, latest = await self._bounds(keys)
                        yield [StreamGap(position, earliest, latest, "trimmed")]
                        return
                    if tail and _is_end(tail[1]):
                        # The cursor is at or past the END entry: the run is over.
                        yield [_entry_item(_text(tail[0]), tail[1])]
                        return
                    window = entries
                    caught_up = not window
                if window:
                    # Reads and the feed both stop at a log's first END: only last here.
                    yield window
                    last = window[-1]
                    if isinstance(last, End):
                        return
                    position = last.id
                    check_gap = True
                    idle_since = time.monotonic()
                    continue
                if feed.removed:
                    yield [StreamGap(_requested(position), None, None, "stream_removed")]
                    return
                now = time.monotonic()
                if now - idle_since >= interval:
                    if now - feed.last_read >= interval:
                        feed.mark_stale()  # a lost notification costs one interval at most
                    if not seen_stream:
                        caught_up = False  # no log yet: re-check the run record directly
                    yield [HEARTBEAT]
                    idle_since = time.monotonic()
                    continue
                if not feed.stale:
                    await feed.wait(interval - (now - idle_since))

    # -- lifecycle --------------------------------------------------------------

    async def ping(self) -> None:
        await self._call(self._redis.ping, resend=False)  # readiness: no retry delay

    async def ensure_scripts(self) -> int:
        """Readiness: load any of the bridge's Lua scripts Redis lacks; how many it loaded.

        Writes would reload a flushed script on NOSCRIPT anyway; this makes readiness
        say whether the scripts can be loaded at all, before traffic arrives.
        """
        scripts = list(self._scripts.values())
        return await self._call(lambda: ensure_loaded(self._redis, scripts), resend=False)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._notifier.close()  # wakes every waiting subscriber
        try:
            if isinstance(self._redis, RedisCluster):
                await self._redis.aclose()
            else:
                await self._redis.aclose(close_connection_pool=True)
        except (*_BACKEND_ERRORS, redis_errors.RedisError):
            pass


def _first_end(items: Sequence[StreamEvent | End]) -> int | None:
    for index, item in enumerate(items):
        if isinstance(item, End):
            return index
    return None


def _position_key(position: str) -> EventKey:
    return (0, 0) if position == "-" else parse_cursor(position)


def _requested(position: str) -> str | None:
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
