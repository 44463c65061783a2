"""The Redis Streams backend: many gateway processes share one Redis (or Redis Cluster).

Each run is a stream (the log) and a hash (the run record), tagged into one cluster slot
(see `keys.py`). Every write is one Lua script (see `lua/`) so the producer-token check,
END detection and the append cannot interleave with another writer, and every write
notifies the run's shard channel (`notifier.py`). A reader runs the shared subscriber
loop (`bridge/reader.py`) over a `view.RunView`: direct reads (`reads.py`) and the run's
per-process `RunFeed` (`fanout.py`) as its window.

This module is the bridge proper: the producer's writes and the wiring. Connection
setup is `connect.py`; every call crosses `calls.py`; a session's side of a write
(its order, its hints) is `session_hints.py`.
"""

from __future__ import annotations

import functools
import logging
import math
import secrets
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any, Final

import anyio
from anyio.abc import TaskGroup
from redis import exceptions as redis_errors
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript

from ..bridge import rules, turn_keys
from ..bridge.base import one_by_one
from ..bridge.reader import follow_log
from ..cursor import EventKey, format_key
from ..errors import (
    InvalidInput,
    ProducerFenced,
    RunOwned,
    SequenceGap,
    SessionMismatch,
    StreamEnded,
    TurnExists,
)
from ..names import check_end_status, check_run_id
from ..sequence import check_seq, sequence_conflict
from ..sessions.turns import moves_state
from ..settings import Settings
from ..values import (
    Claim,
    EndResult,
    EndStatus,
    LeaseState,
    PublishResult,
    RunInfo,
    StreamItem,
)
from .calls import BACKEND_ERRORS, Calls, unavailable
from .connect import RedisClient, connect_client, notification_router
from .keys import RunKeys, check_prefix, run_keys
from .notifier import Notifier
from .pool import PoolGate
from .reads import Reads
from .replies import as_text, ceil_ms
from .scripts import ensure_loaded, lua_source
from .session_hints import SessionHints
from .session_keys import turn_key
from .view import FirstRead, RunView

log = logging.getLogger(__name__)

# Notifications carry the appended events up to this size (larger ones make readers
# read the log), so a gateway following a run delivers without a read per change.
PUSH_BYTES: Final = 64 * 1024
# A log may exceed its limit by limit/this many events before it is trimmed (exactly):
# most publishes then skip the trim's commands. Logs under this many events trim at once.
TRIM_SLACK_DIVISOR: Final = 64
# The run keys remembered (`_keys`): about 0.5 kB each; past this many, all are dropped.
RUN_KEYS_KEPT: Final = 4096


class RedisStreamBridge:
    """StreamBridge on Redis Streams.

    Use it as an async context manager (`open_bridge` does): it owns the task that
    listens for change notifications.
    """

    def __init__(self, settings: Settings, commands: RedisClient) -> None:
        self._settings = settings
        self._prefix = check_prefix(settings.redis_key_prefix)
        self._redis = commands
        self._run_keys: dict[str, RunKeys] = {}
        self._ttl_ms = ceil_ms(settings.stream_ttl_seconds)  # the run keys' rolling TTL
        # Passes at the pool; the command timeout starts once the caller has its pass.
        # On one server, scripts keep connections between passes.
        gate = PoolGate(
            settings.redis_max_connections,
            None if isinstance(commands, RedisCluster) else commands.connection_pool,
            settings.redis_idle_connection_seconds,
        )
        self._calls = Calls(settings, commands, gate)
        self._scripts: dict[str, AsyncScript] = {
            name: commands.register_script(lua_source(name))
            for name in (
                "claim",
                "claim_key",
                "lease_cut",
                "publish",
                "publish_end",
                "renew_lease",
                "cancel",
                "cleanup_later",
            )
        }
        self._reads = Reads(self._calls, commands, commands.register_script(lua_source("read")))
        self._hints = SessionHints(settings, self._calls, commands, self._prefix)
        # A plain counter for the HTTP layer's metrics (the bridge imports no metrics code).
        self.notifier_reconnects = 0
        self._notifier = Notifier(
            notification_router(commands, settings),
            # Never more than retention: whatever a reader takes from the window is
            # still in the log, so a reader lagging past retention gets its gap here
            # as on every other gateway (the window keeps up to a quarter more).
            min(settings.fanout_window_events, max(1, settings.max_events_per_run * 4 // 5)),
            on_reconnect=self._count_notifier_reconnect,
        )
        self._task_group: TaskGroup | None = None

    @property
    def client(self) -> RedisClient:
        """The command client, for stores that live beside the runs (sessions)."""
        return self._redis

    @property
    def calls(self) -> Calls:
        """The call boundary, for stores that share the command client (sessions)."""
        return self._calls

    @property
    def gate(self) -> PoolGate:
        """Passes at the connection pool (the bridge's and the session store's)."""
        return self._calls.gate

    @property
    def replica_ack_failures(self) -> int:
        """Writes refused: too few replicas confirmed them (`min_replicas_acked`)."""
        return self._calls.replica_ack_failures

    @property
    def notifier(self) -> Notifier:
        """The process's change notifications, for stores that signal through them too."""
        return self._notifier

    @classmethod
    def connect(cls, settings: Settings) -> RedisStreamBridge:
        return cls(settings, connect_client(settings))

    async def __aenter__(self) -> RedisStreamBridge:
        if isinstance(self._redis, RedisCluster):
            try:
                await self._redis.initialize()  # learn the nodes before picking one to listen to
            except (*BACKEND_ERRORS, redis_errors.RedisError) as exc:
                raise unavailable("Redis Cluster is unavailable", exc) from exc
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        await self._task_group.start(self._notifier.run)
        self.gate.give_back_in(self._task_group)
        if self._settings.group_commit:
            self._calls.group.start_in(self._task_group)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        with anyio.CancelScope(shield=True):
            await self.close()
        self.gate.give_back_in(None)
        self._calls.group.start_in(None)
        if self._task_group is not None:
            self._task_group.cancel_scope.cancel()
            await self._task_group.__aexit__(None, None, None)
            self._task_group = None

    def _count_notifier_reconnect(self) -> None:
        self.notifier_reconnects += 1

    def _keys(self, run_id: str) -> RunKeys:
        # Remembered for the runs in use: a streamed turn's every append asked for them
        # again (the id checked, four names built). Bounded, and a miss is only a rebuild.
        keys = self._run_keys.get(run_id) if type(run_id) is str else None
        if keys is None:
            if len(self._run_keys) >= RUN_KEYS_KEPT:
                self._run_keys.clear()
            keys = self._run_keys[run_id] = run_keys(self._prefix, check_run_id(run_id))
        return keys

    async def _script(
        self,
        name: str,
        keys: Sequence[str],
        *args: bytes | str | int,
        resend: bool = False,
        server_at: int | None = None,
    ) -> Any:
        return await self._calls.script(
            self._scripts[name], keys, *args, resend=resend, server_at=server_at
        )

    def _lease_ms(self, lease_seconds: float | None) -> int:
        seconds = self._settings.lease_seconds if lease_seconds is None else lease_seconds
        if not math.isfinite(seconds) or seconds <= 0:
            raise InvalidInput("lease_seconds must be a positive number")
        return ceil_ms(min(seconds, self._settings.max_lease_seconds))

    # -- producer side ----------------------------------------------------------

    async def claim(
        self,
        run_id: str,
        *,
        session_id: str | None = None,
        lease_seconds: float | None = None,
        takeover: bool = False,
        input_message: Any = None,
        idempotency_key: str | None = None,
    ) -> Claim:
        keys = self._keys(run_id)
        entry: str | None = None  # the key's entry, when this claim took it fresh
        if idempotency_key is not None:
            entry = await self._take_turn_key(
                run_id, session_id, turn_keys.check_key(idempotency_key, session_id), takeover
            )
        try:
            return await self._claim(
                keys, run_id, session_id, lease_seconds, takeover, input_message
            )
        except (RunOwned, StreamEnded, SessionMismatch):
            # Refused, so no turn started: the key is free again. (Not after a failure
            # that may have come after the claim ran: the key then keeps pointing at it.)
            if entry is not None:
                await self._script("claim_key", [entry], "release", run_id, resend=True)
            raise

    async def _take_turn_key(
        self, run_id: str, session_id: str | None, key: str, takeover: bool
    ) -> str | None:
        """Take the key's entry for `run_id` (the entry's name when it was absent, None
        when this claim replaced or kept one), or raise TurnExists."""
        entry = turn_key(self._prefix, session_id or "", key)
        # The entry lives as long as its run's record can after an END that comes at
        # the end of the run keys' TTL (`decide` re-checks the holder anyway).
        ttl = self._ttl_ms + max(self._ttl_ms, ceil_ms(self._settings.ended_ttl_seconds))
        replaceable = ""
        for _ in range(3):
            reply = await self._script("claim_key", [entry], "take", run_id, replaceable, ttl)
            if as_text(reply[0]) == "taken":
                return entry if replaceable == "" else None
            holder = as_text(reply[1])
            verdict = turn_keys.decide(
                await self.get_run(holder),
                int(reply[2]) / 1000,
                holder=holder,
                run_id=run_id,
                takeover=takeover,
                now=time.time(),
                ended_ttl=self._settings.ended_ttl_seconds,
            )
            if verdict == "exists":
                raise TurnExists(holder)
            replaceable = holder  # taken only if still held by that stale holder
        raise TurnExists(holder)  # replaced meanwhile by another claim: that one won

    async def _claim(
        self,
        keys: RunKeys,
        run_id: str,
        session_id: str | None,
        lease_seconds: float | None,
        takeover: bool,
        input_message: Any,
    ) -> Claim:
        order, shaped, opened, stamp = "", b"", False, ""
        if session_id is not None:
            # A session's turn order is the session's counter (its own slot, so a step of
            # its own, before the run's claim; see redis/session_keys.py for why that order).
            step = await self._hints.claim_order(session_id, run_id, input_message)
            if step is not None:
                order, shaped, opened, stamp = step
        token = secrets.token_urlsafe(18)
        lease_ms = self._lease_ms(lease_seconds)
        reply = await self._script(
            "claim",
            keys.writes,
            token,
            lease_ms,
            "1" if takeover else "0",
            session_id or "",
            self._ttl_ms,
            order,
            shaped,
        )
        outcome = as_text(reply[0])
        if outcome == "owned":
            raise RunOwned(f"run {run_id} has a live producer lease")
        if outcome == "ended":
            raise StreamEnded(f"run {run_id} has ended ({as_text(reply[1])})")
        if outcome == "session":
            raise SessionMismatch.of(run_id, as_text(reply[1]) or None)
        session = as_text(reply[3]) or None
        if opened and session is not None:
            await self._hints.opened(session, stamp)
        return Claim(
            run_id=run_id,
            session_id=session,
            token=token,
            epoch=int(reply[1]),
            # In the gateway's clock (the lease's length from now), not Redis' `lease_until`:
            # the two clocks are never compared.
            lease_expires_at=time.time() + lease_ms / 1000,
        )

    def _raise_refusal(self, run_id: str, reply: list[Any]) -> None:
        outcome = as_text(reply[0])
        if outcome == "fenced":
            raise ProducerFenced(f"producer token refused for run {run_id} ({as_text(reply[1])})")
        if outcome == "ended":
            raise StreamEnded(f"run {run_id} has ended")

    async def renew_lease(
        self,
        run_id: str,
        *,
        producer_token: str,
        lease_seconds: float | None = None,
        stream: str | None = None,
    ) -> LeaseState:
        keys = self._keys(run_id)
        lease_ms = "" if lease_seconds is None else self._lease_ms(lease_seconds)
        reply = await self._script(
            "renew_lease", keys.both, producer_token, lease_ms, self._ttl_ms, stream or ""
        )
        self._raise_refusal(run_id, reply)
        # In the gateway's clock: what is left of the lease by Redis' clock, from now.
        left = (int(reply[1]) - int(reply[3])) / 1000
        return LeaseState(lease_expires_at=time.time() + left, cancel_requested=reply[2] == 1)

    async def cut_lease(
        self,
        run_id: str,
        *,
        producer_token: str,
        stream: str,
        grace: float,
        last_id: str | None = None,
        dropped_ago: float = 0.0,
    ) -> float | None:
        keys = self._keys(run_id)
        # Never shorter than a millisecond: 0 is the script's "not yours".
        reply = await self._script(
            "lease_cut",
            [keys.meta],
            producer_token,
            stream,
            max(1, ceil_ms(grace)),
            last_id or "",
            max(0, int(dropped_ago * 1000)),
        )
        if reply == 0:
            return None
        # In the gateway's clock: what is left of the lease by Redis' clock, from now.
        return time.time() + (int(reply[0]) - int(reply[1])) / 1000

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
        limit = self._settings.max_events_per_run
        args: list[bytes | str | int] = [
            producer_token,
            limit,
            self._ttl_ms,
            PUSH_BYTES,
            limit // TRIM_SLACK_DIVISOR,
            "" if seq is None else check_seq(seq, len(events)),
            "",  # the server's identity (filled in by _script, for the run's epoch)
            # with the legacy scan on, END is checked on the log's tail (publish.lua)
            "1" if self._settings.legacy_end_scan_enabled else "0",
        ]
        for name, payload in rules.encode_batch(events):
            args.append(name)
            args.append(payload)
        reply = await self._script("publish", keys.writes, *args, server_at=6)
        outcome = as_text(reply[0])
        if outcome == "ok" or outcome == "overlap" or outcome == "duplicate":
            # ok: every event appended; overlap (numbered): the first `reply[3]` were
            # applied before; duplicate (numbered): all were (see gateway.sequence)
            overlap = outcome == "overlap"
            ids = tuple([as_text(entry_id) for entry_id in reply[4 if overlap else 3 :]])
            skipped = int(reply[3]) if overlap else len(ids) if outcome == "duplicate" else 0
            result = PublishResult(
                ids=ids,
                cancel_requested=reply[1] == 1,
                session_id=as_text(reply[2]) or None,
                already_applied=skipped,
            )
            # the session index follows what the appended events moved
            appended = events[skipped:] if skipped else events
            if result.session_id is not None and appended and moves_state(appended):
                await self._hints.moved(result.session_id, run_id)
            return result
        self._raise_refusal(run_id, reply)
        if outcome == "sequence_gap":
            expected = int(reply[1])
            raise SequenceGap(
                f"batch starts at event {seq}; the next expected is {expected}", expected
            )
        if outcome == "sequence_conflict":
            expected = int(reply[1])
            raise sequence_conflict(seq or 0, expected)
        raise AssertionError(f"publish.lua replied {outcome!r}")

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
        ended_ttl = ceil_ms(self._settings.ended_ttl_seconds)
        reply = await self._script(
            "publish_end",
            keys.writes,
            producer_token or "",
            status,
            b"" if error is None else rules.encode_payload(error),
            "1" if self._settings.legacy_end_scan_enabled else "0",
            ended_ttl,
            max(ended_ttl, self._ttl_ms),
            "",  # the server's identity (filled in by _script, for the run's epoch)
            server_at=6,
        )
        if as_text(reply[0]) == "noop":
            return EndResult(id=None, deduplicated=False, applied=False)
        if as_text(reply[0]) == "recorded":
            result = EndResult(id=None, deduplicated=False, session_id=as_text(reply[1]) or None)
            if result.session_id is not None:
                await self._hints.moved(result.session_id, run_id)
            return result
        self._raise_refusal(run_id, reply)
        result = EndResult(
            id=as_text(reply[1]) or None,
            deduplicated=reply[2] == 1,
            session_id=as_text(reply[3]) or None,
            legacy_scanned=len(reply) > 4 and reply[4] == 1,
        )
        if result.session_id is not None:
            await self._hints.moved(result.session_id, run_id)
        return result

    async def request_cancel(self, run_id: str) -> bool:
        keys = self._keys(run_id)
        return bool(await self._script("cancel", [keys.meta]))

    async def cleanup(self, run_id: str, delay: float = 0) -> None:
        keys = self._keys(run_id)
        if delay > 0:
            # The log expires then, and the record says when, so that later writes keep
            # that expiry instead of refreshing the TTL (see publish.lua).
            await self._script("cleanup_later", keys.writes, ceil_ms(delay), resend=True)
        else:
            self._reads.forget(keys)
            feed = self._notifier.feed_of(keys)
            if feed is not None:  # (an ended run's feed hears no notification)
                feed.forget_reads()
            # (a script: the text its turn record has not folded yet is folded first)
            await self._script("cleanup_later", keys.writes, 0, resend=True)
            # Wake local feeds of every gateway so readers learn of the removal now.
            await self._calls.call(lambda: self._redis.spublish(keys.log, b""))
            await self._calls.replicated()

    # -- reader side ------------------------------------------------------------

    async def stream_exists(self, run_id: str) -> bool:
        return await self._reads.exists(self._keys(run_id))

    async def get_run(self, run_id: str) -> RunInfo | None:
        return await self._reads.get_run(self._keys(run_id), run_id)

    async def open_stream(
        self, run_id: str, last_event_id: str | None = None
    ) -> tuple[RunInfo | None, Callable[[], AsyncGenerator[Sequence[StreamItem], None]]]:
        """`get_run`, and the reader's first read in the same round trip: a gateway that
        never saw the run (behind a load balancer, after a reconnect) resumes it with one
        transaction, run record, bounds and missed entries (`reads.py`). The
        subscription starts from that read (a moment old, as if it had read then: it goes
        on after it, and a live run's feed is marked stale once subscribed). A malformed
        cursor, which needs the log's tail first, and a cluster read as before."""
        keys = self._keys(run_id)
        start = rules.parse_start(last_event_id)
        if not self._calls.keeps_connections or start.kind == "malformed":
            info = await self.get_run(run_id)
            return info, functools.partial(self.subscribe_batches, run_id, last_event_id)
        after = "-" if start.key is None else format_key(start.key)
        info, read, newest = await self._reads.open_shared(
            keys, run_id, after, functools.partial(self._window_newest, keys)
        )
        interval = rules.heartbeat_interval(self._settings.heartbeat_interval_seconds, None)
        first = FirstRead(after, read, newest)
        return info, functools.partial(self._follow, keys, start, interval, first)

    def _window_newest(self, keys: RunKeys) -> EventKey | None:
        """The newest id of the run's window in this process (`RunFeed.check_tail`)."""
        feed = self._notifier.feed_of(keys)
        return None if feed is None else feed.newest

    def subscribe(
        self,
        run_id: str,
        last_event_id: str | None = None,
        heartbeat_interval: float | None = None,
    ) -> AsyncGenerator[StreamItem, None]:
        return one_by_one(self.subscribe_batches(run_id, last_event_id, heartbeat_interval))

    def subscribe_batches(
        self,
        run_id: str,
        last_event_id: str | None = None,
        heartbeat_interval: float | None = None,
    ) -> AsyncGenerator[Sequence[StreamItem], None]:
        keys = self._keys(run_id)  # input is checked now, as on the memory bridge
        interval = rules.heartbeat_interval(
            self._settings.heartbeat_interval_seconds, heartbeat_interval
        )
        return self._follow(keys, rules.parse_start(last_event_id), interval)

    def _follow(
        self,
        keys: RunKeys,
        start: rules.Start,
        interval: float,
        prefetched: FirstRead | None = None,
    ) -> AsyncGenerator[Sequence[StreamItem], None]:
        """Replay from the start position, then follow the shared feed (`reader.py`).
        `prefetched`: the first read, made already from that position (`open_stream`)."""
        return follow_log(self._view(keys, prefetched), start, interval)

    def _view(self, keys: RunKeys, prefetched: FirstRead | None = None) -> RunView:
        return RunView(self._calls, self._reads, self._notifier, keys, prefetched)

    # -- lifecycle --------------------------------------------------------------

    async def ping(self) -> None:
        await self._calls.call(self._redis.ping, resend=False)  # readiness: no retry delay

    async def eviction_policies(self) -> frozenset[str]:
        """The `maxmemory-policy` of every Redis server holding runs (INFO, which
        managed services allow where CONFIG is disabled). Only `noeviction` keeps the
        contract free of evictions; under any other the floors still hold (readers get
        gaps, never silent skips), but logs vanish."""
        if isinstance(self._redis, RedisCluster):
            cluster = self._redis
            replies: Any = await self._calls.call(
                lambda: cluster.info("memory", target_nodes=RedisCluster.PRIMARIES)
            )
            infos = list(replies.values()) if isinstance(replies, dict) else [replies]
            if infos and not isinstance(infos[0], dict):  # one node: the info itself
                infos = [replies]
        else:
            single = self._redis
            infos = [await self._calls.call(lambda: single.info("memory"))]
        return frozenset(str(info.get("maxmemory_policy", "unknown")) for info in infos)

    async def ensure_scripts(self) -> int:
        """Readiness: load any of the bridge's Lua scripts Redis lacks; how many it loaded.

        Writes would reload a flushed script on NOSCRIPT anyway; this makes readiness
        say whether the scripts can be loaded at all, before traffic arrives.
        """
        scripts = [*self._scripts.values(), self._reads.script, *self._hints.scripts]
        return await self._calls.call(lambda: ensure_loaded(self._redis, scripts), resend=False)

    async def close(self) -> None:
        if self._calls.closed:
            return
        self._calls.closed = True
        self._notifier.close()  # wakes every waiting subscriber
        try:
            if isinstance(self._redis, RedisCluster):
                await self._redis.aclose()
            else:
                await self._redis.aclose(close_connection_pool=True)
            await self.gate.close()
        except (*BACKEND_ERRORS, redis_errors.RedisError):
            pass
