"""Turns at the Redis command pool, and the connections scripts keep between turns.

Every caller of the command pool takes a turn first, first come first served: redis-py's
pool hands a released connection to whichever caller asks next, so under saturation a
caller that just released one takes it back before a woken waiter runs, and a waiter can
starve past the command timeout. There are as many turns as the pool has connections,
so a caller with its turn always finds one free.

Scripts (every write, and the readers' `read.lua`) are most of the traffic and need
none of the client's per-command machinery (response callbacks, retries, which are off
anyway, and the pool's checkout and check-in, about a quarter of a script call's CPU):
a script turn (`connection()`) gets a connection the turns keep between uses, and sends
on it directly. Kept connections stay checked out of the pool, so the pool could run dry
for a caller that uses the client itself; such a turn first gives back an idle kept
connection whenever kept ones and pool turns together would exceed the pool's size.
(Kept connections in use and pool turns together never do: they hold turns.)
"""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType
from typing import Any

from redis.asyncio import ConnectionPool
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError, ResponseError

log = logging.getLogger(__name__)


class Turns:
    """`async with turns:` for a caller of the client; `async with turns.connection()`
    for a script sent on a kept connection (`pool`: None on a cluster, where scripts go
    through the cluster client, which routes them)."""

    def __init__(self, size: int, pool: ConnectionPool | None = None) -> None:
        self._size = size
        self._pool = pool
        self._semaphore = asyncio.Semaphore(size)
        self._idle: list[AbstractConnection] = []
        self._kept = 0  # kept connections, idle or in use
        self._pooled = 0  # turns of callers of the client

    @property
    def keeps_connections(self) -> bool:
        return self._pool is not None

    async def __aenter__(self) -> None:
        await self._semaphore.acquire()
        self._pooled += 1
        try:
            while self._kept + self._pooled > self._size and self._idle:
                await self._give_back(self._idle.pop())
        except BaseException:
            self._leave_pool()
            raise

    async def _give_back(self, connection: AbstractConnection) -> None:
        self._kept -= 1
        assert self._pool is not None
        # Shielded from a cancellation of the caller (redis-py's release takes the
        # connection off its in-use set before its first await, so even then the pool
        # has it back before another turn can ask for it).
        try:
            await asyncio.shield(self._pool.release(connection))
        except (ConnectionError, OSError) as exc:  # it is out of use either way
            log.info("giving a kept Redis connection back failed: %s", exc)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._leave_pool()

    def _leave_pool(self) -> None:
        self._pooled -= 1
        self._semaphore.release()

    def connection(self) -> Held:
        """A turn that sends its commands on a kept connection of its own:
        `async with turns.connection() as held: await held.execute(packed)`."""
        assert self._pool is not None, "a cluster's scripts go through its client"
        return Held(self)

    async def close(self) -> None:
        """Close the idle kept connections (the bridge closes its pool first; this is
        for a script that reconnected one on its way out)."""
        while self._idle:
            await self._idle.pop().disconnect(nowait=True)

    async def _checkout(self, held: Held) -> AbstractConnection:
        """A connection for `held`, set on it before any await (so that the turn's end
        keeps it whatever happens), checked as the pool checks what it hands out (one
        the server closed, holding unread data or marked to reconnect connects anew)."""
        assert self._pool is not None
        if self._idle:
            connection = held.connection = self._idle.pop()
            await self._pool.ensure_connection(connection)
            return connection
        # The pool has one free: kept ones in use and pool turns hold turns, and there
        # is no idle kept one (see the module docstring).
        made: AbstractConnection = await self._pool.get_connection()  # type: ignore[no-untyped-call]
        self._kept += 1
        held.connection = made
        return made


class Held:
    """One connection turn: its commands go on one kept connection, taken at the first
    command (so that a failure to connect is that command's error) and kept again when
    the turn ends. A command interrupted on it (an error, a cancellation) leaves it
    disconnected (redis-py's connection does that itself), and the next command on it
    connects again."""

    __slots__ = ("_turns", "connection")

    def __init__(self, turns: Turns) -> None:
        self._turns = turns
        self.connection: AbstractConnection | None = None

    async def __aenter__(self) -> Held:
        await self._turns._semaphore.acquire()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.connection is not None:
            self._turns._idle.append(self.connection)
            self.connection = None
        self._turns._semaphore.release()

    async def execute(self, packed: bytes) -> Any:
        """Send one packed command (`redis_wire.pack`) and return its raw reply (an error
        reply is raised)."""
        connection = self.connection or await self._turns._checkout(self)
        # (No health check: redis-py's is off here; the turns check what they hand out.)
        await connection.send_packed_command(packed, check_health=False)
        return await connection.read_response()

    async def execute_many(self, packed: bytes, replies: int) -> list[Any]:
        """Send several packed commands at once (one round trip: a `MULTI` ... `EXEC`
        transaction) and return their `replies` raw replies. Every reply is read even when
        one is an error (raised then, after the last), so none is left on the connection
        for the next command."""
        connection = self.connection or await self._turns._checkout(self)
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
