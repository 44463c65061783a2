"""The Redis Streams backend: many gateway processes share one Redis (or Redis Cluster).

Each run is a stream (the log) and a hash (the run record), tagged into one cluster slot
(see `keys.py`). Every write is one Lua script (see `lua/`) so the producer-token check,
END detection and the append cannot interleave with another writer, and every write
notifies the run's shard channel (`notifier.py`). A reader runs the shared subscriber
loop (`bridge/reader.py`) over a `_RunView`: direct reads of the entries together with
the exact trim boundary and the run record in one round trip (a MULTI/EXEC of plain
commands on one server, `read.lua` on a cluster), and the run's per-process `RunFeed`
(`fanout.py`) as its window.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import secrets
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Sequence,
)
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any, Final, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit

import anyio
import orjson
from anyio.abc import TaskGroup
from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.driver_info import DriverInfo

from ..bridge import rules, turn_keys
from ..bridge.base import one_by_one
from ..bridge.reader import Placement, follow_log
from ..bridge.rules import READ_BATCH, Entry, LogRead
from ..cursor import EventKey, format_key, parse_cursor
from ..errors import (
    BackendUnavailable,
    BridgeClosed,
    GatewayError,
    InvalidInput,
    NotReplicated,
    ProducerFenced,
    RunOwned,
    SequenceGap,
    SessionMismatch,
    StreamEnded,
    TurnExists,
)
from ..names import check_end_status, check_run_id, check_session_id
from ..sequence import check_seq, sequence_conflict
from ..sessions.shaping import shape_input_message
from ..sessions.turns import PARKED_STATES, moves_state
from ..settings import Settings
from ..timing.deadlines import CallDeadlines
from ..values import (
    Claim,
    End,
    EndResult,
    EndStatus,
    LeaseState,
    PublishResult,
    RunInfo,
    StreamEvent,
    StreamItem,
    encode_json,
)
from .codec import (
    entry_item,
    flatten,
    is_end,
    parse_log_read,
    parse_read,
    stream_info,
)
from .fanout import SHARED_READ_SECONDS, RunFeed
from .keys import RunKeys, check_prefix, run_keys
from .notifier import Notifier, OneServer, Router
from .replies import as_text, ceil_ms
from .scripts import ensure_loaded, lua_source
from .session_keys import index_keys, session_keys, turn_key
from .turns import Held, Turns
from .wire import CheckedPool, pack

log = logging.getLogger(__name__)

RedisClient = Redis | RedisCluster
T = TypeVar("T")

SHARED_OPENS: Final = 256  # `open_stream` reads kept for sharing (runs x positions)
# Notifications carry the appended events up to this size (larger ones make readers
# read the log), so a gateway following a run delivers without a read per change.
PUSH_BYTES: Final = 64 * 1024
# A log may exceed its limit by limit/this many events before it is trimmed (exactly):
# most publishes then skip the trim's commands. Logs under this many events trim at once.
TRIM_SLACK_DIVISOR: Final = 64
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
# Scripts not followed by `WAIT` under `min_replicas_acked`: the readers' script, and
# the session hints, whose failure is only logged (no reply reports them).
_UNACKNOWLEDGED: Final = frozenset({"read", "session_touch", "session_index"})
# Bridge-level retries of one operation (and the first backoff, doubled each time).
RETRIES: Final = 4
RETRY_BACKOFF: Final = 0.05


def _unavailable(what: str, exc: BaseException) -> BackendUnavailable:
    log.info("%s: %s", what, exc)  # the details (with the address) stay in the log
    return BackendUnavailable(f"{what} ({type(exc).__name__})")


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

    Timeouts: connecting is bounded by `redis_connect_timeout_seconds`; every bridge
    operation by `redis_command_timeout_seconds` (`_attempts`, with a `CallDeadline`).
    redis-py's own socket timeout stays off: it wraps each send in `asyncio.wait_for`,
    which on Python 3.11 can drop a cancellation that arrives as the send completes, and
    a response whose client went away must always be stoppable.
    """
    url = settings.redis_url
    assert url is not None
    timeouts: dict[str, Any] = {
        "socket_timeout": None,
        "socket_connect_timeout": settings.redis_connect_timeout_seconds,
    }
    scheme, sep, rest = url.partition("://")
    if scheme in CLUSTER_SCHEMES:
        return RedisCluster.from_url(
            f"{CLUSTER_SCHEMES[scheme]}{sep}{rest}",
            max_connections=settings.redis_max_connections,
            retry=_no_retry(),
            **timeouts,
        )
    # A plain pool, never waited on: every caller takes a turn first (`turns`: the
    # bridge's calls and the session store's), and there are as many turns as
    # connections, so a caller with its turn always finds one free. (redis-py's blocking
    # pool would add a condition and a timer to every command.) It checks every
    # connection it hands out.
    pool = CheckedPool.from_url(
        url,
        max_connections=settings.redis_max_connections,
        retry=_no_retry(),
        # What CLIENT SETINFO says, made once: redis-py's default looks its own version
        # up in the package metadata for every new connection (~0.5 ms of CPU each; a
        # fresh process's first storm of resumes opens dozens at once).
        driver_info=_driver_info(),
        **timeouts,
    )
    return Redis(connection_pool=pool)


@functools.cache
def _driver_info() -> DriverInfo:
    return DriverInfo()


def _notification_router(commands: RedisClient, settings: Settings) -> Router:
    """Where the notifier listens: the server itself, or each channel's slot owner."""
    url = settings.redis_url
    assert url is not None
    # It waits for messages indefinitely by design; only connecting is bounded. redis-py's
    # own reconnect-and-resubscribe is off: the notifier reconnects itself, so that it
    # knows to subscribe every live feed and to mark them stale (notifications may have
    # been lost meanwhile).
    options: dict[str, Any] = {
        "socket_connect_timeout": settings.redis_connect_timeout_seconds,
        "retry": _no_retry(),
    }
    if isinstance(commands, Redis):
        return OneServer(lambda: Redis.from_url(url, **options))
    return _ClusterRouter(commands, url, options)


class _ClusterRouter:
    """Shard channels of a Redis Cluster: located with the command client's slot map (a
    node that no longer owns a slot answers MOVED; one that cannot be reached makes the
    notifier `refresh` the map from the other nodes)."""

    def __init__(self, commands: RedisCluster, url: str, options: dict[str, Any]) -> None:
        scheme, _, rest = url.partition("://")
        self._commands = commands
        self._parts = urlsplit(f"{CLUSTER_SCHEMES[scheme]}://{rest}")
        self._userinfo = self._parts.netloc.rpartition("@")[0]
        # The URL's TLS options (ssl_ca_certs, ssl_certfile, ...) apply to every node;
        # its other options are the cluster client's own, which a node client refuses.
        tls = [(k, v) for k, v in parse_qsl(self._parts.query) if k.startswith("ssl_")]
        self._query = urlencode(tls)
        self._options = options

    def locate(self, channel: str) -> str:
        try:
            node = self._commands.get_node_from_key(channel)
        except redis_errors.SlotNotCoveredError:
            node = None  # mid-failover: any node redirects to the owner once there is one
        return (node or self._commands.get_default_node()).name

    async def refresh(self) -> None:
        # The slot map the command client shares (it does not always re-learn it by
        # itself after a primary died, with its retries off).
        await self._commands.nodes_manager.initialize()

    def connect(self, node: str) -> Redis:
        netloc = f"{self._userinfo}@{node}" if self._userinfo else node
        address = self._parts._replace(netloc=netloc, query=self._query).geturl()
        return Redis.from_url(address, **self._options)


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
        self._deadlines = CallDeadlines(settings.redis_command_timeout_seconds)
        self._ttl_ms = ceil_ms(settings.stream_ttl_seconds)  # the run keys' rolling TTL
        # Turns at the pool (see `turns`); the command timeout starts once the
        # caller has its turn. On one server, scripts keep connections between turns.
        self._turns = Turns(
            settings.redis_max_connections,
            None if isinstance(commands, RedisCluster) else commands.connection_pool,
            settings.redis_idle_connection_seconds,
        )
        self._scripts: dict[str, AsyncScript] = {
            name: commands.register_script(lua_source(name))
            for name in (
                "claim",
                "claim_key",
                "lease_cut",
                "publish",
                "publish_end",
                "renew_lease",
                "read",
                "cancel",
                "cleanup_later",
                "session_claim",
                "session_index",
                "session_touch",
            )
        }
        # Plain counters for the HTTP layer's metrics (the bridge imports no metrics code).
        self.notifier_reconnects = 0
        self.replica_ack_failures = 0  # writes refused: too few replicas confirmed them
        # `WAIT` sent right behind each write when replicas must confirm it (settings
        # refuse it on a cluster, whose scripts go through its client: no kept connection).
        self._wait_ms = ceil_ms(settings.replica_ack_timeout_seconds)
        self._wait = b""
        if settings.min_replicas_acked:
            # `WAIT` waits for the connection's last write to be replicated: a reply that
            # wrote nothing (an END repeated after a 503, a refusal) would wait for
            # nothing. A `PUBLISH` (on one server always replicated, received by nobody)
            # marks the replication stream's current end as this connection's last write.
            mark = pack("PUBLISH", f"{self._prefix}replicated", "")
            self._wait = mark + pack("WAIT", settings.min_replicas_acked, self._wait_ms)
        self._notifier = Notifier(
            _notification_router(commands, settings),
            # Never more than retention: whatever a reader takes from the window is
            # still in the log, so a reader lagging past retention gets its gap here
            # as on every other gateway (the window keeps up to a quarter more).
            min(settings.fanout_window_events, max(1, settings.max_events_per_run * 4 // 5)),
            on_reconnect=self._count_notifier_reconnect,
        )
        self._task_group: TaskGroup | None = None
        # `open_stream`'s reads by (log key, position), with the time each began.
        self._opening: dict[
            tuple[str, str], tuple[asyncio.Future[tuple[RunInfo | None, LogRead] | None], float]
        ] = {}

    @property
    def client(self) -> RedisClient:
        """The command client, for stores that live beside the runs (sessions)."""
        return self._redis

    @property
    def turns(self) -> Turns:
        """Turns at the connection pool, for stores that share the command client."""
        return self._turns

    async def command(self, operation: Callable[[], Awaitable[T]]) -> T:
        """Run one read or idempotent operation of a store that lives beside the runs
        (sessions) on the bridge's call boundary: a turn at the pool, the command
        deadline, its retries and its error mapping (never the server's address)."""
        return await self._call(operation)

    async def replicated(self) -> None:
        """With `min_replicas_acked`: return once that many replicas hold every write
        made before this call, on any connection (the `PUBLISH` mark ends the
        replication stream with this connection's write, see `__init__`), or raise
        NotReplicated. For writes sent through the client (a removal, a session's
        deletion), which no script's `WAIT` follows."""
        if not self._wait:
            return

        async def run(held: Held) -> None:
            _, replicas = await held.execute_many(self._wait, 2)
            self._confirmed(int(replicas))

        async with self._turns.connection() as held:
            await self._attempts(lambda: run(held), True)

    def _confirmed(self, replicas: int) -> None:
        asked = self._settings.min_replicas_acked
        if replicas < asked:
            self.replica_ack_failures += 1
            raise NotReplicated(
                f"the write reached {replicas} of the {asked} Redis replicas asked "
                f"for within {self._wait_ms} ms, so it is not acknowledged (it may or "
                "may not survive a failover)"
            )

    @property
    def notifier(self) -> Notifier:
        """The process's change notifications, for stores that signal through them too."""
        return self._notifier

    @classmethod
    def connect(cls, settings: Settings) -> RedisStreamBridge:
        return cls(settings, _connect(settings))

    async def __aenter__(self) -> RedisStreamBridge:
        if isinstance(self._redis, RedisCluster):
            try:
                await self._redis.initialize()  # learn the nodes before picking one to listen to
            except (*_BACKEND_ERRORS, redis_errors.RedisError) as exc:
                raise _unavailable("Redis Cluster is unavailable", exc) from exc
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        await self._task_group.start(self._notifier.run)
        self._turns.give_back_in(self._task_group)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        with anyio.CancelScope(shield=True):
            await self.close()
        self._turns.give_back_in(None)
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
        """Run one operation of the client in a turn at the pool (see `_attempts`)."""
        async with self._turns:
            return await self._attempts(operation, resend)

    async def _attempts(self, operation: Callable[[], Awaitable[T]], resend: bool) -> T:
        """Run one Redis operation, retried a few times; with `resend=False` only after a
        refusal (the operation did not run), never after a connection failure.

        The whole call, retries included, is bounded by `redis_command_timeout_seconds`.
        Errors name what failed, never the server's address (readers see them).
        """
        attempt = 0
        try:
            with self._deadlines.start():
                while True:
                    if self._closed:
                        raise BridgeClosed("the bridge is closed")
                    try:
                        return await operation()
                    except _REFUSED_ERRORS as exc:
                        if attempt >= RETRIES:
                            raise _unavailable("Redis refused the command", exc) from exc
                    except _BACKEND_ERRORS as exc:
                        if not resend or attempt >= RETRIES:
                            raise _unavailable("Redis is unavailable", exc) from exc
                    except redis_errors.RedisError as exc:
                        if self._closed:
                            raise BridgeClosed("the bridge is closed") from exc
                        raise _unavailable("Redis error", exc) from exc
                    await asyncio.sleep(RETRY_BACKOFF * 2**attempt)
                    attempt += 1
        except TimeoutError as exc:
            if self._closed:
                raise BridgeClosed("the bridge is closed") from exc
            seconds = self._settings.redis_command_timeout_seconds
            raise BackendUnavailable(f"Redis did not answer within {seconds:g} s") from exc

    async def _script(
        self,
        name: str,
        keys: Sequence[str],
        *args: bytes | str | int,
        resend: bool = False,
        server_at: int | None = None,
    ) -> Any:
        """Run one of the bridge's scripts. A write is never re-sent after it may have
        run (`resend=False`, see `_connect`). `server_at`: the index of the argument that
        is the identity of the server the script runs on, filled in from the connection
        it goes out on (`Held.server`; "" on a cluster, whose client routes scripts)."""
        script = self._scripts[name]
        if not self._turns.keeps_connections:  # a cluster: its client routes the script
            if server_at is not None:
                args = (*args[:server_at], "", *args[server_at + 1 :])
            return await self._call(lambda: script(keys=list(keys), args=list(args)), resend=resend)

        fixed = (
            None if server_at is not None else pack("EVALSHA", script.sha, len(keys), *keys, *args)
        )

        async def command(held: Held) -> bytes:
            if fixed is not None:
                return fixed
            assert server_at is not None
            filled = (*args[:server_at], await held.server(), *args[server_at + 1 :])
            return pack("EVALSHA", script.sha, len(keys), *keys, *filled)

        if self._wait and name not in _UNACKNOWLEDGED:
            return await self._replicated(script, command, resend)

        async def run(held: Held) -> Any:
            packed = await command(held)
            try:
                return await held.execute(packed)
            except redis_errors.NoScriptError:  # not run: Redis was flushed or restarted
                await held.execute(pack("SCRIPT", "LOAD", script.script))
                return await held.execute(packed)

        async with self._turns.connection() as held:
            return await self._attempts(lambda: run(held), resend)

    async def _replicated(
        self, script: AsyncScript, command: Callable[[Held], Awaitable[bytes]], resend: bool
    ) -> Any:
        """A write script followed on its own connection by `WAIT`, in the same round
        trip: `WAIT` counts the replicas holding everything written before it (the
        mark's doing, see `__init__`), so the reply comes once `min_replicas_acked` hold
        the write, or BackendUnavailable (it is then not acknowledged: it may or may
        not survive a failover)."""

        async def run(held: Held) -> Any:
            calls = (await command(held), self._wait)
            try:
                reply, _, replicas = await held.execute_many(calls, 3)
            except redis_errors.NoScriptError:  # not run: Redis was flushed or restarted
                await held.execute(pack("SCRIPT", "LOAD", script.script))
                reply, _, replicas = await held.execute_many(calls, 3)
            self._confirmed(int(replicas))
            return reply

        async with self._turns.connection() as held:
            return await self._attempts(lambda: run(held), resend)

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
            turn = await self._script(
                "session_claim",
                session_keys(self._prefix, check_session_id(session_id)).lists,
                run_id,
                self._session_ttl_ms(),
                resend=True,  # idempotent per run
            )
            if as_text(turn[0]) == "ok":
                order, opened, stamp = str(int(turn[1])), turn[2] == 1, as_text(turn[3])
                message = shape_input_message(input_message)
                shaped = b"" if message is None else encode_json(message)
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
            await self._turn_opened(session, stamp)
        return Claim(
            run_id=run_id,
            session_id=session,
            token=token,
            epoch=int(reply[1]),
            # In the gateway's clock (the lease's length from now), not Redis' `lease_until`:
            # the two clocks are never compared.
            lease_expires_at=time.time() + lease_ms / 1000,
        )

    def _session_ttl_ms(self) -> int:
        """How long a session's own keys live at least after a claim or a turn's move
        (none while a turn is parked): as long as a turn record can (session_ttl.lua)."""
        return self._ttl_ms + ceil_ms(self._settings.ended_ttl_seconds)

    async def _turn_opened(self, session_id: str, stamp: str) -> None:
        """After a claim opened a turn: wake the session's feeds again, now that its
        record is written (`session_claim.lua` announced the turn in its own step, which
        no crash can lose; a feed that read between the two steps looks again shortly),
        and put the session on top of the session index (at the claim's time, Redis's
        clock). Both are hints readers verify, so a failure here is logged, never the
        claim's."""
        session = session_keys(self._prefix, session_id)
        try:
            await self._call(lambda: self._redis.spublish(session.feed, b""))
            await self._touch_index(session_id, stamp, parked=False)
        except GatewayError as exc:
            log.warning("session %s: new turn not announced: %s", session_id, exc)

    async def _turn_moved(self, session_id: str, run_id: str) -> None:
        """After a write that may have moved a turn's state (parked, unparked, ended; the
        record itself moved in the write's own step): the session's hints follow it (its
        activity time, the parked listing, no TTL while parked). Logged on failure."""
        keys = self._keys(run_id)
        try:
            state, updated, owner = await self._call(
                lambda: self._redis.hmget(keys.turn, ["state", "updated", "session"])
            )
            if state is None or owner is None or as_text(owner) != session_id:
                return
            stamp = f"{int(as_text(updated or b'0')) / 1000:.6f}"
            parked = as_text(state) in PARKED_STATES
            session = session_keys(self._prefix, session_id)
            noted = await self._script(
                "session_touch",
                session.lists,
                stamp,
                "1" if parked else "0",
                run_id,
                self._session_ttl_ms(),
                resend=True,
            )
            if noted == 1:
                await self._touch_index(session_id, stamp, parked=parked)
        except GatewayError as exc:
            log.warning("session %s: turn %s state not noted: %s", session_id, run_id, exc)

    async def _touch_index(self, session_id: str, stamp: str, *, parked: bool) -> None:
        await self._script(
            "session_index",
            index_keys(self._prefix).both,
            "touch",
            session_id,
            stamp,
            "1" if parked else "0",
            resend=True,
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
        ends_ms = int(reply)
        return ends_ms / 1000 if ends_ms > 0 else None

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
                await self._turn_moved(result.session_id, run_id)
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
                await self._turn_moved(result.session_id, run_id)
            return result
        self._raise_refusal(run_id, reply)
        result = EndResult(
            id=as_text(reply[1]) or None,
            deduplicated=reply[2] == 1,
            session_id=as_text(reply[3]) or None,
            legacy_scanned=len(reply) > 4 and reply[4] == 1,
        )
        if result.session_id is not None:
            await self._turn_moved(result.session_id, run_id)
        return result

    async def request_cancel(self, run_id: str) -> bool:
        keys = self._keys(run_id)
        return bool(await self._script("cancel", [keys.meta]))

    async def cleanup(self, run_id: str, delay: float = 0) -> None:
        keys = self._keys(run_id)
        if delay > 0:
            # The log expires then, and the record says when, so that later writes keep
            # that expiry instead of refreshing the TTL (see publish.lua).
            await self._script("cleanup_later", keys.both, ceil_ms(delay), resend=True)
        else:
            # Reads shared by `open_stream` no longer stand here (other processes keep
            # theirs for at most `SHARED_READ_SECONDS`: as if read a moment earlier).
            for key in [key for key in self._opening if key[0] == keys.log]:
                del self._opening[key]
            await self._call(lambda: self._redis.delete(keys.log))
            # Wake local feeds of every gateway so readers learn of the removal now.
            await self._call(lambda: self._redis.spublish(keys.log, b""))
            await self.replicated()

    # -- reader side ------------------------------------------------------------

    async def stream_exists(self, run_id: str) -> bool:
        keys = self._keys(run_id)
        return bool(await self._call(lambda: self._redis.exists(keys.log)))

    async def get_run(self, run_id: str) -> RunInfo | None:
        keys = self._keys(run_id)

        async def fetch() -> list[Any]:
            # Cluster pipelines route per key; both keys share a slot either way.
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hmget(keys.meta, _INFO_FIELDS)
                pipe.xlen(keys.log)
                pipe.xrange(keys.log, "-", "+", count=1)
                pipe.xrevrange(keys.log, "+", "-", count=2)
                return list(await pipe.execute())

        values, length, head, tail = await self._call(fetch)
        meta_raw = {k: v for k, v in zip(_INFO_FIELDS, values, strict=True) if v is not None}
        return _run_info(run_id, meta_raw, int(length), head[0] if head else None, tail)

    async def open_stream(
        self, run_id: str, last_event_id: str | None = None
    ) -> tuple[RunInfo | None, Callable[[], AsyncGenerator[Sequence[StreamItem], None]]]:
        """`get_run`, and the reader's first read in the same round trip: a gateway that
        never saw the run (behind a load balancer, after a reconnect) resumes it with one
        transaction, run record, bounds and missed entries (`_open_transaction`). The
        subscription starts from that read (a moment old, as if it had read then: it goes
        on after it, and a live run's feed is marked stale once subscribed). A malformed
        cursor, which needs the log's tail first, and a cluster read as before."""
        keys = self._keys(run_id)
        start = rules.parse_start(last_event_id)
        if not self._turns.keeps_connections or start.kind == "malformed":
            info = await self.get_run(run_id)
            return info, functools.partial(self.subscribe_batches, run_id, last_event_id)
        after = "-" if start.key is None else format_key(start.key)
        info, read = await self._open_shared(keys, run_id, after)
        interval = rules.heartbeat_interval(self._settings.heartbeat_interval_seconds, None)
        first = _FirstRead(after, read)
        return info, functools.partial(self._follow, keys, start, interval, first)

    async def _open_shared(
        self, keys: RunKeys, run_id: str, after: str
    ) -> tuple[RunInfo | None, LogRead]:
        """`_open_read`, shared by the readers that open the same run at the same position
        at once (a crowd reconnecting after a deploy: one transaction and one decoding
        for all, as `RunFeed.read_shared` shares a feed's reads): a read in flight is
        joined; a finished one is reused for up to `SHARED_READ_SECONDS` when the log
        ended with its END (nothing can follow it; the log can only vanish meanwhile,
        whose old END such a reader may still be handed, as if it had read a moment
        earlier). A read of a live log is shared while in flight only (its readers go on
        after it and subscribe, so nothing written since is missed), and one that found
        no log is not shared (a run claimed a moment later must not look unknown)."""
        key = (keys.log, after)
        earlier = self._opening.get(key)
        now = time.monotonic()
        if earlier is not None and now - earlier[1] < SHARED_READ_SECONDS:
            shared = await asyncio.shield(earlier[0])
            if shared is not None:
                return shared
        future: asyncio.Future[tuple[RunInfo | None, LogRead] | None]
        future = asyncio.get_running_loop().create_future()
        self._opening.pop(key, None)  # re-inserted last: the newest
        self._opening[key] = (future, now)
        while len(self._opening) > SHARED_OPENS:
            del self._opening[next(iter(self._opening))]
        result: tuple[RunInfo | None, LogRead] | None = None
        try:
            result = await self._open_read(keys, run_id, after)
            return result
        finally:
            shareable = result if result is not None and result[1].exists else None
            future.set_result(shareable)
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

        async def run(held: Held) -> list[Any]:
            return await held.execute_many(command, replies)

        async with self._turns.connection() as held:
            done = await self._attempts(lambda: run(held), True)
        values, info_reply, tail, raw = done[-1]
        meta = {k.encode(): v for k, v in zip(_INFO_FIELDS, values, strict=True) if v is not None}
        if isinstance(info_reply, redis_errors.ResponseError):
            if "no such key" not in str(info_reply):
                raise _unavailable("Redis error", info_reply)
            length, head = 0, None
        else:
            fields = stream_info(info_reply)
            length, head = int(fields[b"length"]), fields.get(b"first-entry")
        info = _run_info(run_id, meta, length, head, tail)
        read = parse_log_read(
            [meta.get(field.encode()) for field in _RECORD_FIELDS], info_reply, raw, after
        )
        return info, read

    async def _read(self, keys: RunKeys, after: str) -> LogRead:
        """The entries after `after` ("-": from the start) and the log's bounds, read
        atomically, in one round trip.

        On one server: a `MULTI` ... `EXEC` transaction of plain commands (the run
        record's status fields, `XINFO STREAM`, `XRANGE`), written at once. `read.lua`
        reads the same, but every entry it returns is converted to a Lua table and back,
        which cost Redis about four times the `XRANGE` itself (a cold resume of 200
        entries: ~500 µs of a ~640 µs script). A cluster's client routes `read.lua`.
        """
        if not self._turns.keeps_connections:
            reply: list[Any] = await self._script(
                "read", keys.both, after, READ_BATCH + 1, resend=True
            )
            return parse_read(reply, after)
        command, replies = _read_transaction(keys, after)

        async def run(held: Held) -> list[Any]:
            return await held.execute_many(command, replies)

        async with self._turns.connection() as held:
            done = await self._attempts(lambda: run(held), True)
        results = done[-1]  # EXEC's: the queued commands' replies, in order
        info = results[1]
        if isinstance(info, redis_errors.ResponseError) and "no such key" not in str(info):
            raise _unavailable("Redis error", info)  # not a stream: as read.lua would fail
        return parse_log_read(results[0], info, results[2], after)

    async def _refresh(self, feed: RunFeed) -> None:
        """Pull everything new since the feed's head into its window."""
        async with feed.refreshing() as mine:
            while mine and feed.take(await self._read(feed.keys, feed.head), READ_BATCH):
                pass

    async def _event_bounds(self, keys: RunKeys) -> tuple[str | None, str | None]:
        """The first and last retained event ids (the END entry is not an event)."""

        async def fetch() -> list[Any]:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.xrange(keys.log, "-", "+", count=1)
                pipe.xrevrange(keys.log, "+", "-", count=2)
                return list(await pipe.execute())

        head, tail = await self._call(fetch)
        events = [as_text(i) for i, fields in tail if not is_end(flatten(fields))]
        first = as_text(head[0][0]) if head and not is_end(flatten(head[0][1])) else None
        return first, (events[0] if events else None)

    async def _tail(self, keys: RunKeys) -> Entry | None:
        reply: Any = await self._call(lambda: self._redis.xrevrange(keys.log, "+", "-", count=1))
        if not reply:
            return None
        return entry_item(as_text(reply[0][0]), flatten(reply[0][1]))

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
        prefetched: _FirstRead | None = None,
    ) -> AsyncGenerator[Sequence[StreamItem], None]:
        """Replay from the start position, then follow the shared feed (`reader.py`).
        `prefetched`: the first read, made already from that position (`open_stream`)."""
        return follow_log(_RunView(self, keys, prefetched), start, interval)

    # -- lifecycle --------------------------------------------------------------

    async def ping(self) -> None:
        await self._call(self._redis.ping, resend=False)  # readiness: no retry delay

    async def eviction_policies(self) -> frozenset[str]:
        """The `maxmemory-policy` of every Redis server holding runs (INFO, which
        managed services allow where CONFIG is disabled). Only `noeviction` keeps the
        contract free of evictions; under any other the floors still hold (readers get
        gaps, never silent skips), but logs vanish."""
        if isinstance(self._redis, RedisCluster):
            cluster = self._redis
            replies: Any = await self._call(
                lambda: cluster.info("memory", target_nodes=RedisCluster.PRIMARIES)
            )
            infos = list(replies.values()) if isinstance(replies, dict) else [replies]
            if infos and not isinstance(infos[0], dict):  # one node: the info itself
                infos = [replies]
        else:
            single = self._redis
            infos = [await self._call(lambda: single.info("memory"))]
        return frozenset(str(info.get("maxmemory_policy", "unknown")) for info in infos)

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
            await self._turns.close()
        except (*_BACKEND_ERRORS, redis_errors.RedisError):
            pass


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
    last two entries (the last event when the newest is the END), XRANGE."""
    parts = [
        pack("MULTI"),
        pack("HMGET", keys.meta, *_INFO_FIELDS),
        pack("XINFO", "STREAM", keys.log),
        pack("XREVRANGE", keys.log, "+", "-", "COUNT", 2),
    ]
    parts.append(pack("XRANGE", keys.log, after, "+", "COUNT", READ_BATCH + 1))
    parts.append(pack("EXEC"))
    return b"".join(parts), len(parts)


def _run_info(
    run_id: str, meta_raw: dict[Any, Any], length: int, head: Any, tail: Sequence[Any]
) -> RunInfo | None:
    """A `RunInfo` from the run record (`_INFO_FIELDS`), the log's length, its first entry (None
    when empty) and its last two entries (XREVRANGE), newest first."""
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
        error=end_entry.error if isinstance(end_entry, End) else _error_of(meta),
    )


def _error_of(meta: dict[str, str]) -> Any:
    raw = meta.get("err")
    return orjson.loads(raw) if raw else None


class _FirstRead:
    """A reader's first read, made already (`open_stream`), handed over once.

    The route keeps the subscription's factory, which holds this, for as long as the
    response is open: taken, the read is held by nobody, rather than its events (decoded
    for this reader alone) for the stream's lifetime."""

    __slots__ = ("_read", "after")

    def __init__(self, after: str, read: LogRead) -> None:
        self.after = after
        self._read: LogRead | None = read

    def take(self, position: str) -> LogRead | None:
        """The read, if it was made from `position` (and not taken before)."""
        read, self._read = self._read, None
        return read if position == self.after else None


class _RunView:
    """One Redis subscription's view of a run's log (`reader.LogView`): direct reads of
    Redis, shared with this process's readers at the same position, and the run's feed
    (`fanout.RunFeed`, shared by every local reader of the run) as the window."""

    __slots__ = ("_bridge", "_keys", "_prefetched", "feed")

    def __init__(
        self, bridge: RedisStreamBridge, keys: RunKeys, prefetched: _FirstRead | None
    ) -> None:
        self._bridge = bridge
        self._keys = keys
        self._prefetched = prefetched
        self.feed: RunFeed  # set by `attached` (the loop's steps all run inside it)

    @property
    def closed(self) -> bool:
        return self._bridge._closed or self.feed.closed

    @property
    def stale(self) -> bool:
        return self.feed.stale

    @asynccontextmanager
    async def attached(self, start: rules.Start) -> AsyncIterator[Placement]:
        # A malformed cursor needs the log's tail first: an active log is followed from
        # there (a position the reader holds from now on: a trim past it before the
        # first read is a gap), an ended one replayed through its END. Any other
        # reader's first read tells what the tail would, in the same round trip: where
        # a new feed starts, and whether the log ends with its END, after which nothing
        # can follow (such a reader, a resume's common case, never subscribes).
        tail_id = None
        phase, position = rules.Phase.NEW, start.key
        if start.kind == "malformed":
            newest = await self._bridge._tail(self._keys)
            tail_id = newest.id if newest is not None and newest.id else "0-0"
            if newest is not None:
                phase = rules.Phase.SEEN
                if not isinstance(newest, End):
                    assert newest.id is not None
                    position = parse_cursor(newest.id)
        async with self._bridge._notifier.attach(self._keys, tail_id, subscribe=False) as feed:
            self.feed = feed
            yield phase, position

    async def read(self, after: EventKey | None, *, seen: bool) -> LogRead:
        position = "-" if after is None else format_key(after)
        feed = self.feed
        first = None if self._prefetched is None else self._prefetched.take(position)
        if first is not None:
            read = first
        else:
            read = await feed.read_shared(
                position, functools.partial(self._bridge._read, self._keys, position)
            )
        if not read.exists and seen:
            # A removal is decided on a read of our own: a shared one may have begun
            # before our first look found the log (its notification not yet heard).
            read = await self._bridge._read(self._keys, position)
        feed.start_at(read.tail.id if read.tail is not None and read.tail.id else "0-0")
        return read

    def window(self, after: EventKey) -> Sequence[StreamItem] | None:
        feed = self.feed
        if feed.missing:
            return None  # (a removed log is found by the reader's own read)
        return feed.after(after)

    async def refresh(self) -> None:
        await self._bridge._refresh(self.feed)

    async def follow(self) -> None:
        await self._bridge._notifier.follow(self.feed)

    def wait(self, deadline: float) -> Coroutine[Any, Any, bool]:
        return self.feed.wait_until(deadline)  # (no coroutine of its own: see there)

    def key_of(self, event: StreamEvent) -> EventKey:
        return self.feed.key_of(event)

    def idle(self, interval: float) -> None:
        if time.monotonic() - self.feed.last_read >= interval:
            self.feed.mark_stale()  # a lost notification costs one interval at most

    async def gap_bounds(self, bounds: rules.Bounds) -> rules.Bounds:
        first, last = await self._bridge._event_bounds(self._keys)
        return replace(bounds, first=first, last=last)

    def final(self, position: EventKey | None) -> End | None:
        window = self.feed.after(position or (0, 0))
        if window is not None and len(window) == 1 and isinstance(window[0], End):
            return window[0]
        return None
