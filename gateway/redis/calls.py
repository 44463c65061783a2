"""The one boundary every Redis call crosses, the bridge's and the session store's.

A call takes a pass at the pool (`pool.PoolGate`), runs under the command deadline, is
re-sent a few times when that cannot duplicate it, and leaves with redis-py's errors
mapped to the gateway's in one place (`map_error`, after httpx's
`map_httpcore_exceptions`): a message that says what failed and never names the server,
whose address stays in the log. With `min_replicas_acked`, a write's reply comes only
once `WAIT` confirms that many replicas hold it.

Re-sending (see `connect.connect_client` for why redis-py's own retries are off): a read
or an idempotent operation (`resend=True`) after any backend error; a write
(`resend=False`) only after a reply that says the server refused it without running it
(CLUSTERDOWN, TRYAGAIN, an uncovered slot, still loading). Any other failure of a write
reaches the caller as BackendUnavailable (HTTP 503): it may or may not have been
applied, and the producer can find out from the run's `last_event_id`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar

from redis import exceptions as redis_errors
from redis.commands.core import AsyncScript

from ..errors import BackendUnavailable, BridgeClosed, GatewayError, NotReplicated
from ..settings import Settings
from ..timing.deadlines import CallDeadlines
from .connect import RedisClient
from .group import ASK_SERVER, GroupCommit, on_a_cluster, on_one_server
from .keys import check_prefix
from .pool import Held, PoolGate
from .replies import ceil_ms
from .wire import pack

log = logging.getLogger(__name__)

T = TypeVar("T")

BACKEND_ERRORS: Final = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError)
# Replies meaning the server refused the command without running it (a cluster in
# failover, a slot being moved): a write may be re-sent after these, and only these.
_REFUSED_ERRORS: Final = (
    redis_errors.BusyLoadingError,  # still loading its AOF/RDB after a restart
    redis_errors.ClusterDownError,
    redis_errors.SlotNotCoveredError,
    redis_errors.TryAgainError,
)
# Retries of one call (and the first backoff, doubled each time).
RETRIES: Final = 4
RETRY_BACKOFF: Final = 0.05


def unavailable(what: str, exc: BaseException) -> BackendUnavailable:
    log.info("%s: %s", what, exc)  # the details (with the address) stay in the log
    return BackendUnavailable(f"{what} ({type(exc).__name__})")


def map_error(exc: Exception, closed: bool, timeout: float) -> Exception:
    """The gateway's error for one of redis-py's, or for the call's deadline passing: a
    closed bridge is BridgeClosed (its connections were shut under the call), anything
    else BackendUnavailable; the gateway's own errors and anything else as they are.
    (A function the one `except` of `Calls._attempts` calls, not a context manager
    entered per call: that cost a few microseconds on every write.)"""
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, TimeoutError):
        if closed:
            return BridgeClosed("the bridge is closed")
        return BackendUnavailable(f"Redis did not answer within {timeout:g} s")
    if isinstance(exc, _REFUSED_ERRORS):
        return unavailable("Redis refused the command", exc)
    if isinstance(exc, BACKEND_ERRORS):
        return unavailable("Redis is unavailable", exc)
    if isinstance(exc, redis_errors.RedisError):
        if closed:
            return BridgeClosed("the bridge is closed")
        return unavailable("Redis error", exc)
    return exc


class Calls:
    """Calls to one Redis deployment (a server or a cluster), shared by the bridge and
    the session store, which share its pool."""

    def __init__(self, settings: Settings, client: RedisClient, gate: PoolGate) -> None:
        self._settings = settings
        self._client = client
        self.gate = gate
        self.closed = False
        self._timeout = settings.redis_command_timeout_seconds
        # Scripts of concurrent calls, sent together (group.py); it runs once given the
        # bridge's task group (`GroupCommit.start_in`).
        send = on_one_server(gate) if gate.keeps_connections else on_a_cluster(gate, client)
        self.group = GroupCommit(send, self._timeout)
        self._deadlines = CallDeadlines(self._timeout)
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
            prefix = check_prefix(settings.redis_key_prefix)
            mark = pack("PUBLISH", f"{prefix}replicated", "")
            self._wait = mark + pack("WAIT", settings.min_replicas_acked, self._wait_ms)

    @property
    def keeps_connections(self) -> bool:
        """On one server: calls can hold a connection of their own (`held`, `script`)."""
        return self.gate.keeps_connections

    async def call(self, operation: Callable[[], Awaitable[T]], *, resend: bool = True) -> T:
        """Run one operation of the client, with a pass at the pool."""
        async with self.gate:
            return await self._attempts(operation, resend)

    async def held(self, operation: Callable[[Held], Awaitable[T]], *, resend: bool = True) -> T:
        """Run one operation on a connection the gate keeps (one server only)."""
        async with self.gate.connection() as held:
            return await self._attempts(lambda: operation(held), resend)

    async def transaction(self, command: bytes, replies: int) -> list[Any]:
        """Packed commands (a read's MULTI ... EXEC) on a kept connection: their replies."""

        async def run(held: Held) -> list[Any]:
            return await held.execute_many(command, replies)

        return await self.held(run)

    async def script(
        self,
        script: AsyncScript,
        keys: Sequence[str],
        *args: bytes | str | int,
        resend: bool = False,
        server_at: int | None = None,
        acknowledged: bool = True,
    ) -> Any:
        """Run a Lua script. A write is never re-sent after it may have run
        (`resend=False`). `server_at`: the index of the argument that is the identity
        of the server the script runs on, filled in from the connection it goes out on
        (`Held.server`; on a cluster, whose client routes scripts, `ASK_SERVER`: the
        script asks the server it runs on, lua/entry_id.lua). `acknowledged`:
        False for scripts no `WAIT` follows under `min_replicas_acked` (reads, and
        hints whose failure is only logged)."""
        if self.group.running and not (self._wait and acknowledged):
            # with the scripts of other calls, one write per server (WAIT, under
            # `min_replicas_acked`, needs the write's own connection)
            group = self.group
            return await self._attempts(lambda: group.run(script, keys, args, server_at), resend)
        if not self.keeps_connections:  # a cluster: its client routes the script
            if server_at is not None:
                args = (*args[:server_at], ASK_SERVER, *args[server_at + 1 :])
            return await self.call(lambda: script(keys=list(keys), args=list(args)), resend=resend)

        fixed = (
            None if server_at is not None else pack("EVALSHA", script.sha, len(keys), *keys, *args)
        )

        async def command(held: Held) -> bytes:
            if fixed is not None:
                return fixed
            assert server_at is not None
            filled = (*args[:server_at], await held.server(), *args[server_at + 1 :])
            return pack("EVALSHA", script.sha, len(keys), *keys, *filled)

        if self._wait and acknowledged:
            return await self.held(
                lambda held: self._replicated(script, command, held), resend=resend
            )

        async def run(held: Held) -> Any:
            packed = await command(held)
            try:
                return await held.execute(packed)
            except redis_errors.NoScriptError:  # not run: Redis was flushed or restarted
                await held.execute(pack("SCRIPT", "LOAD", script.script))
                return await held.execute(packed)

        return await self.held(run, resend=resend)

    async def _replicated(
        self, script: AsyncScript, command: Callable[[Held], Awaitable[bytes]], held: Held
    ) -> Any:
        """A write script followed on its own connection by `WAIT`, in the same round
        trip: `WAIT` counts the replicas holding everything written before it (the
        mark's doing, see `__init__`), so the reply comes once `min_replicas_acked` hold
        the write, or NotReplicated (it may or may not survive a failover)."""
        calls = (await command(held), self._wait)
        try:
            reply, _, replicas = await held.execute_many(calls, 3)
        except redis_errors.NoScriptError:  # not run: Redis was flushed or restarted
            await held.execute(pack("SCRIPT", "LOAD", script.script))
            reply, _, replicas = await held.execute_many(calls, 3)
        self._confirmed(int(replicas))
        return reply

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

        await self.held(run)

    def _confirmed(self, replicas: int) -> None:
        asked = self._settings.min_replicas_acked
        if replicas < asked:
            self.replica_ack_failures += 1
            raise NotReplicated(
                f"the write reached {replicas} of the {asked} Redis replicas asked "
                f"for within {self._wait_ms} ms, so it is not acknowledged (it may or "
                "may not survive a failover)"
            )

    async def _attempts(self, operation: Callable[[], Awaitable[T]], resend: bool) -> T:
        """Run one Redis operation, retried a few times; with `resend=False` only after a
        refusal (the operation did not run), never after a connection failure. The
        whole call, retries included, is bounded by `redis_command_timeout_seconds`."""
        attempt = 0
        try:
            with self._deadlines.start():
                while True:
                    if self.closed:
                        raise BridgeClosed("the bridge is closed")
                    try:
                        return await operation()
                    except _REFUSED_ERRORS:
                        if attempt >= RETRIES:
                            raise
                    except BACKEND_ERRORS:
                        if not resend or attempt >= RETRIES:
                            raise
                    await asyncio.sleep(RETRY_BACKOFF * 2**attempt)
                    attempt += 1
        except Exception as exc:
            mapped = map_error(exc, self.closed, self._timeout)
            if mapped is exc:
                raise
            raise mapped from exc
