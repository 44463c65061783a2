"""The Redis bridge's command pool, checking what it hands out, and `pack`.

Since redis-py 8.2 its asyncio connections pack every command with hiredis when hiredis
is installed (8.1 packed in Python: a tenth of a publish's CPU), so the pool uses
redis-py's own connection classes. A script call the bridge sends on a kept connection
is packed once here (`pack`, the same hiredis packer) and sent as it is.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterable
from typing import Any

import hiredis
from redis.asyncio import ConnectionPool
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError

from .compat import take_free


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
    scripts (`turns.py`) go through it too. `can_read` does no I/O.

    It also notes when each connection came back (`release`), so that the turns can take
    the ones unused for a while out of it (`take_idle`): the pool opens connections as
    concurrency needs them (redis-py's does), and no longer keeps every one a burst
    opened.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._returned: weakref.WeakKeyDictionary[AbstractConnection, float] = (
            weakref.WeakKeyDictionary()
        )

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
