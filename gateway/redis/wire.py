"""The Redis bridge's command pool, checking what it hands out, and `pack`.

Since redis-py 8.2 its asyncio connections pack every command with hiredis when hiredis
is installed (8.1 packed in Python: a tenth of a publish's CPU), so the pool uses
redis-py's own connection classes. A script call the bridge sends on a kept connection
is packed once here (`pack`, the same hiredis packer) and sent as it is.
"""

from __future__ import annotations

import re
import time
import weakref
from collections.abc import Iterable
from typing import Any

import hiredis
from redis.asyncio import ConnectionPool
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError

from .compat import take_free

_RUN_ID = re.compile(rb"run_id:([0-9a-f]+)")


def pack(*args: bytes | str | int | memoryview) -> bytes:
    """One command as it goes on the wire, packed by hiredis: the bridge's script calls,
    which send it as it is (`turns.Held`, and again after a NOSCRIPT)."""
    packed: bytes = hiredis.pack_command(args)  # type: ignore[arg-type]  # its stub: a 1-tuple
    return packed


class CheckedPool(ConnectionPool):
    """redis-py's pool, which checks each connection it hands out, always.

    The pool means to replace a connection the server closed (a restart, the server's
    idle `timeout`) or one holding unread data, but redis-py 8.1 skips that check while
    its maintenance notifications are "auto", the default: the connection was handed
    out and its command failed (a 503, as a write is never re-sent). `ensure_connection`
    is the pool's public hook for the check; the connections the bridge keeps for its
    scripts (`pool.py`) go through it too. `can_read` does no I/O.

    It also notes when each connection came back (`release`), so that the turns can take
    the ones unused for a while out of it (`take_idle`): the pool opens connections as
    concurrency needs them (redis-py's does), and no longer keeps every one a burst
    opened.

    And which server each connection reached (`server_of`): the server's `run_id`, asked
    with `INFO server` each time the connection connects (a connect callback, so no
    command is sent before it is known). A restart and every other server have another,
    so a write that passes it lets its script tell that the run's last write ran on
    another server (lua/entry_id.lua).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._returned: weakref.WeakKeyDictionary[AbstractConnection, float] = (
            weakref.WeakKeyDictionary()
        )
        self._servers: weakref.WeakKeyDictionary[AbstractConnection, str] = (
            weakref.WeakKeyDictionary()
        )

    def make_connection(self) -> AbstractConnection:
        connection: AbstractConnection = super().make_connection()  # type: ignore[no-untyped-call]
        connection.register_connect_callback(self._identify)  # type: ignore[no-untyped-call]
        return connection

    async def _identify(self, connection: AbstractConnection) -> None:
        self._servers.pop(connection, None)
        await connection.send_command("INFO", "server")
        info = await connection.read_response()
        found = _RUN_ID.search(info.encode() if isinstance(info, str) else info)
        if found is not None:
            self._servers[connection] = found[1].decode()

    def server_of(self, connection: AbstractConnection) -> str:
        """The run_id of the server `connection` reached when it last connected ("" when
        it is not connected or the server did not say)."""
        return self._servers.get(connection, "") if connection.is_connected else ""

    async def release(self, connection: AbstractConnection) -> None:
        self._returned[connection] = time.monotonic()
        await super().release(connection)

    async def take_idle(
        self, before: float, also: Iterable[AbstractConnection] = ()
    ) -> list[AbstractConnection]:
        """Take out of the pool the free connections returned before `before` (monotonic
        seconds), and those of `also` still free; the caller disconnects them. (redis-py's
        pool has no public way to shrink: `compat.take_free` holds the one use of its
        internals.)"""
        returned = self._returned
        chosen = set(also)
        return await take_free(self, lambda c: c in chosen or returned.get(c, before) < before)

    async def ensure_connection(self, connection: AbstractConnection) -> None:
        if connection.is_connected:
            try:
                stale = bool(connection.should_reconnect()) or await connection.can_read()  # type: ignore[no-untyped-call]
            except ConnectionError:  # the server closed it: redis-py 8.1 disconnected it
                stale = True  # already, 8.2 leaves that to the caller
            if stale:
                await connection.disconnect(nowait=True)
        if not connection.is_connected:  # (connect() itself goes through a retry wrapper)
            await connection.connect()  # type: ignore[no-untyped-call]
