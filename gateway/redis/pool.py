"""The gate of the Redis command pool (passes, first come first served), and the
connections scripts keep between passes.

(A "pass" here is a caller's place at the pool; a chat's turn is `sessions.turns`.)

Every caller of the command pool takes a pass first, first come first served: redis-py's
pool hands a released connection to whichever caller asks next, so under saturation a
caller that just released one takes it back before a woken waiter runs, and a waiter can
starve past the command timeout. There are as many passes as the pool has connections,
so a caller with its pass always finds one free.

Scripts (every write, and the readers' `read.lua`) are most of the traffic and need
none of the client's per-command machinery (response callbacks, retries, which are off
anyway, and the pool's checkout and check-in, about a quarter of a script call's CPU):
a script pass (`connection()`) gets a connection the passes keep between uses, and sends
on it directly. Kept connections stay checked out of the pool (it counts them against its
size until it has them back), so the pool could run dry for a caller with a pass; such a
pass first gives back idle kept connections whenever kept ones (idle, in use, being
opened) and pool passes together would exceed the pool's size, and waits until the pool
has them. (Those in use or being opened and the pool passes together never do: they hold
passes.) A give-back runs in the bridge's task group (`give_back_in`), not in the caller,
and the connection counts as kept until it is done, so no cancellation of a caller
leaves a connection out of both the passes and the pool.

Connections follow the load: both kinds are opened only when every open one is busy
(redis-py's pool makes one when its free list is empty; a script pass takes the kept one
used last, or waits for the next one given back while `CONNECTING_AT_ONCE` are being
opened), and a connection unused for `idle_seconds` is closed, checked at the end of
a pass at most every `idle_seconds / 4` (`_close_idle`). So a burst that keeps them busy
may open up to the pool's size (a storm of short reads opens a few: they queue for the
ones being opened), and afterwards the process holds what its steady load uses: one
follower and one producer, two or three.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import anyio
from anyio.abc import TaskGroup
from redis.asyncio import ConnectionPool
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError, ResponseError

log = logging.getLogger(__name__)

# Kept connections being opened at once, at most: a script pass that finds none idle
# while this many are connecting waits for the next one a pass gives back (first come,
# first served) instead of opening yet another. A burst (a storm of cold resumes) then
# pipelines its reads on a few connections rather than paying a connection's three
# handshake round trips (and Redis its HELLO and refusals) for each of dozens; a load
# that keeps them all busy still grows the pool, this many at a time, to its size.
CONNECTING_AT_ONCE = 4


class PoolGate:
    """`async with gate:` for a caller of the client; `async with gate.connection()`
    for a script sent on a kept connection (`pool`: None on a cluster, where scripts go
    through the cluster client, which routes them)."""

    def __init__(
        self, size: int, pool: ConnectionPool | None = None, idle_seconds: float = 10.0
    ) -> None:
        self._size = size
        self._pool = pool
        self._semaphore = asyncio.Semaphore(size)
        # Idle kept connections, the last one kept last (taken first), with the time each
        # was kept: the oldest are the ones the load no longer needs.
        self._idle: list[AbstractConnection] = []
        self._idle_since: list[float] = []
        self._kept = 0  # kept connections, idle or in use
        self._pooled = 0  # passes of callers of the client
        self._idle_seconds = idle_seconds
        self._next_check = time.monotonic() + idle_seconds / 4
        self._checking = False
        self._connecting = 0  # kept connections being opened
        # Kept connections being given back to the pool: still counted in `_kept` (the
        # pool counts them as handed out until its release has run), and passes that need
        # the pool's room wait for them (`_wait_room`).
        self._returning = 0
        self._room: list[asyncio.Future[None]] = []
        self._tasks: TaskGroup | None = None  # where give-backs run (`give_back_in`)
        # Script passes waiting for a kept connection (`CONNECTING_AT_ONCE`): each is
        # handed the next one given back, or None: "open one yourself" (a connect failed).
        self._waiting: deque[asyncio.Future[AbstractConnection | None]] = deque()

    @property
    def keeps_connections(self) -> bool:
        return self._pool is not None

    async def __aenter__(self) -> None:
        await self._semaphore.acquire()
        self._pooled += 1
        try:
            # The pool must have room for this pass: every connection it counts as handed
            # out is a kept one (idle, in use, being opened or given back) or another pool
            # pass's. Passes hold the pool's size in permits, so only idle kept connections
            # can be over; give them back, and wait until the pool has them.
            while self._over():
                if self._idle and self._tasks is not None and self._over(self._returning):
                    self._idle_since.pop()
                    self._give_back(self._idle.pop())
                elif self._returning:  # enough are on their way back
                    await self._wait_room()
                else:  # (a bridge not entered gives nothing back: `give_back_in`)
                    break
        except BaseException:
            self._leave_pool()
            raise

    def _over(self, returning: int = 0) -> bool:
        """More connections counted as handed out than the pool's size (less those
        `returning`: the ones on their way back)."""
        return self._kept - returning + self._connecting + self._pooled > self._size

    def give_back_in(self, tasks: TaskGroup | None) -> None:
        """Run give-backs and idle closing in `tasks` (the bridge's task group, while it
        is entered). Without one (a bridge used without `async with`, which also hears no
        notifications) kept connections are never given back or closed."""
        self._tasks = tasks

    def _give_back(self, connection: AbstractConnection) -> None:
        """Return a kept connection to the pool, in the bridge's task group rather than
        in the caller: no cancellation of a caller can leave it out of both the passes and
        the pool. It stays counted in `_kept` until the pool has it (redis-py's release
        takes a lock): a pass that needs the room meanwhile waits (`_wait_room`)."""
        assert self._tasks is not None
        self._returning += 1
        self._tasks.start_soon(self._release, connection)

    async def _release(self, connection: AbstractConnection) -> None:
        assert self._pool is not None
        try:
            await self._pool.release(connection)
        except Exception as exc:  # (it is out of the passes' use either way)
            log.warning("giving a kept Redis connection back failed: %r", exc)
        finally:
            self._returning -= 1
            self._kept -= 1
            waiters, self._room = self._room, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def _wait_room(self) -> None:
        """Until a kept connection being given back is back in the pool."""
        assert self._returning, "nothing is being given back: no room will come"
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._room.append(waiter)
        try:
            await waiter
        finally:
            if not waiter.done():
                self._room.remove(waiter)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._leave_pool()
        if time.monotonic() >= self._next_check:
            await self._close_idle()

    def _leave_pool(self) -> None:
        self._pooled -= 1
        self._semaphore.release()

    def _keep(self, connection: AbstractConnection) -> None:
        while self._waiting:  # straight to the pass that waited longest
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(connection)
                return
        self._idle.append(connection)
        self._idle_since.append(time.monotonic())

    def _let_one_connect(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _close_idle(self) -> None:
        """Close the connections (kept, and the pool's free ones) unused for
        `idle_seconds`. Checked as a pass ends, at most every `idle_seconds / 4`: no
        timer, and a process that makes no call at all has none to close. The closing
        runs in the bridge's task group: the pass's caller does not wait for it."""
        if self._checking or self._pool is None or self._tasks is None:
            return
        self._checking = True
        now = time.monotonic()
        self._next_check = now + self._idle_seconds / 4
        before = now - self._idle_seconds
        stale = 0
        while stale < len(self._idle_since) and self._idle_since[stale] < before:
            stale += 1  # oldest first: those kept longest ago
        unused = self._idle[:stale]
        del self._idle[:stale], self._idle_since[:stale]
        # Given back before they are closed: the pool counts a kept connection as handed
        # out until it has it back, so one closed without that held a place in the pool
        # for good (MaxConnectionsError once enough had).
        for connection in unused:
            self._give_back(connection)
        self._tasks.start_soon(self._close, before, unused)

    async def _close(self, before: float, unused: list[AbstractConnection]) -> None:
        doomed: list[AbstractConnection] = []
        try:
            while self._returning:  # (ours, and any other give-back in flight)
                await self._wait_room()
            # (The pool's: `CheckedPool.take_idle`, when it is one; without it they stay
            # in the pool, as redis-py's own pool keeps what it opened.)
            take_idle = getattr(self._pool, "take_idle", None)
            if take_idle is not None:
                doomed = await take_idle(before, unused)
        finally:
            self._checking = False
            # Out of every list already (no one else has them): closed even when the
            # bridge is closing, or they would stay open with no owner.
            with anyio.CancelScope(shield=True):
                for connection in doomed:
                    try:
                        await connection.disconnect(nowait=True)
                    except (ConnectionError, OSError) as exc:
                        log.info("closing an idle Redis connection failed: %s", exc)

    def connection(self) -> Held:
        """A pass that sends its commands on a kept connection of its own:
        `async with gate.connection() as held: await held.execute(packed)`."""
        assert self._pool is not None, "a cluster's scripts go through its client"
        return Held(self)

    async def close(self) -> None:
        """Close the idle kept connections (the bridge closes its pool first; this is
        for a script that reconnected one on its way out)."""
        self._idle_since.clear()
        while self._waiting:  # they find the pool closed, rather than wait out their deadline
            self._let_one_connect()
        while self._returning:  # (no give-back task outlives the bridge)
            await self._wait_room()
        while self._idle:
            await self._idle.pop().disconnect(nowait=True)

    async def _checkout(self, held: Held) -> AbstractConnection:
        """A connection for `held`, set on it before any await (so that the pass's end
        keeps it whatever happens), checked as the pool checks what it hands out (one
        the server closed, holding unread data or marked to reconnect connects anew)."""
        assert self._pool is not None
        while not self._idle and self._connecting >= CONNECTING_AT_ONCE:
            handed = await self._wait_for_one()
            if handed is not None:
                held.connection = handed
                await self._pool.ensure_connection(handed)
                return handed
        if self._idle:
            self._idle_since.pop()
            connection = held.connection = self._idle.pop()
            await self._pool.ensure_connection(connection)
            return connection
        if self._kept + self._connecting + self._pooled >= self._size and self._returning:
            # The pool may be full of kept connections being given back (they hold no
            # pass): wait until one is back in it, then look again.
            await self._wait_room()
            return await self._checkout(held)
        # The pool has one free: kept ones in use, those being opened and pool passes
        # hold passes, and there is no idle or returning kept one (module docstring).
        self._connecting += 1
        try:
            made: AbstractConnection = await self._pool.get_connection()  # type: ignore[no-untyped-call]
        except BaseException:
            self._let_one_connect()  # it may fare better (or fail on its own deadline)
            raise
        finally:
            self._connecting -= 1
        self._kept += 1
        held.connection = made
        return made

    async def _wait_for_one(self) -> AbstractConnection | None:
        """Until a pass gives a kept connection back (ours now), or a connect failed
        (None: open one). A cancelled waiter passes on what it was handed."""
        waiter: asyncio.Future[AbstractConnection | None]
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        try:
            return await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                handed = waiter.result()
                if handed is None:
                    self._let_one_connect()
                else:
                    self._keep(handed)
            else:
                waiter.cancel()  # (left in the queue; skipped when its pass comes)
            raise


class Held:
    """One connection pass: its commands go on one kept connection, taken at the first
    command (so that a failure to connect is that command's error) and kept again when
    the pass ends. A command interrupted on it (an error, a cancellation) leaves it
    disconnected (redis-py's connection does that itself), and the next command on it
    connects again."""

    __slots__ = ("_gate", "connection")

    def __init__(self, gate: PoolGate) -> None:
        self._gate = gate
        self.connection: AbstractConnection | None = None

    async def __aenter__(self) -> Held:
        await self._gate._semaphore.acquire()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        gate = self._gate
        if self.connection is not None:
            gate._keep(self.connection)
            self.connection = None
        gate._semaphore.release()
        if time.monotonic() >= gate._next_check:
            await gate._close_idle()

    async def server(self) -> str:
        """The identity of the server this pass's connection reaches (`CheckedPool.
        server_of`), connecting it first if needed, so that a command packed with it next
        goes to that very server (a connection that connects anew learns its server
        before anything is sent on it)."""
        connection = self.connection or await self._gate._checkout(self)
        if not connection.is_connected:
            await connection.connect()  # type: ignore[no-untyped-call]
        server_of = getattr(self._gate._pool, "server_of", None)  # (a CheckedPool's)
        return "" if server_of is None else str(server_of(connection))

    async def execute(self, packed: bytes) -> Any:
        """Send one packed command (`wire.pack`) and return its raw reply (an error
        reply is raised)."""
        connection = self.connection or await self._gate._checkout(self)
        # (No health check: redis-py's is off here; the passes check what they hand out.)
        await connection.send_packed_command(packed, check_health=False)
        return await connection.read_response()

    async def execute_each(self, packed: Sequence[bytes], replies: int) -> list[Any]:
        """Send several packed commands in one write and return their `replies` raw
        replies, an error reply in its place as a `ResponseError` value (one command's
        refusal is its own: group commit, `group.py`)."""
        connection = self.connection or await self._gate._checkout(self)
        await connection.send_packed_command(packed, check_health=False)
        out: list[Any] = []
        for _ in range(replies):
            try:
                out.append(await connection.read_response())
            except ResponseError as exc:
                out.append(exc)
        return out

    async def execute_many(self, packed: bytes | Sequence[bytes], replies: int) -> list[Any]:
        """Send several packed commands at once (one round trip: a `MULTI` ... `EXEC`
        transaction, a script and its `WAIT`; several pieces go out in one write, not
        joined first) and return their `replies` raw replies. Every reply is read even when
        one is an error (raised then, after the last), so none is left on the connection
        for the next command."""
        connection = self.connection or await self._gate._checkout(self)
        await connection.send_packed_command(packed, check_health=False)
        out: list[Any] = []
        refused: ResponseError | None = None
        for _ in range(replies):
            try:
                out.append(await connection.read_response())
            except ResponseError as exc:
                refused = refused or exc
                out.append(exc)
        if refused is not None:
            raise refused
        return out
