"""redis-py beyond its documented API, in one place, with the versions it was checked on.

Checked on redis-py 8.2.0 with hiredis 3.5.0 (the versions `requirements/*.txt` lock);
`pyproject.toml` allows `redis>=8.2,<9`, so no unvetted major arrives by itself, and
`make newest` runs the fast suite on the newest releases the ranges allow.
`tests/redis_backend/test_compat.py` checks that every hook below still has the shape
relied on, so a release that moves one fails there, by name, before it fails anywhere
else.

Each hook, who uses it, and why:

- `ConnectionPool._lock`, `ConnectionPool._available_connections` (private): `take_free`
  below, for `wire.CheckedPool.take_idle`. The pool has no public way to shrink, so the
  connections a burst opened would stay open for good.
- (public, 8.2 on) `Connection.pack_command` packs with hiredis when it is installed; the
  bridge relies on it for CPU (8.1 packed in Python: a tenth of a publish's CPU), and
  `wire.pack` gives the same bytes for script calls sent as they are.
- `Connection.send_packed_command(..., check_health=False)`, `Connection.read_response()`:
  `turns.Held`, to send a script call packed once on a connection kept between turns.
- `Connection.can_read()`, `Connection.should_reconnect()`:
  `wire.CheckedPool.ensure_connection`, to check a pooled connection without I/O before
  handing it out. On a connection the server closed, 8.1's `can_read` disconnected it
  before raising `ConnectionError`; 8.2's raises and leaves it connected, so the pool
  disconnects it itself (what broke a fresh install with 8.2).
- `Connection.read_response(timeout=, disconnect_on_error=, push_request=)`,
  `PubSub.connection`, `PubSub.handle_message`: `notifier.Notifier`, to read pushed
  notifications off the pub/sub connection itself (no per-message health check or
  retry layer).
- `PubSub(push_handler_func=...)`: `notifier.Notifier`, to keep RESP3 pushes as they
  came (the default renders each one as text for a debug line that is off).
- `redis.driver_info.DriverInfo`: `bridge`, one for every pooled connection (redis-py
  reads its own package version for each new connection otherwise).
"""

from __future__ import annotations

from collections.abc import Callable

from redis.asyncio import ConnectionPool
from redis.asyncio.connection import AbstractConnection

CHECKED_ON = {"redis": "8.2.0", "hiredis": "3.5.0"}


async def take_free(
    pool: ConnectionPool, select: Callable[[AbstractConnection], bool]
) -> list[AbstractConnection]:
    """Take the free connections `select` picks out of `pool` (the caller disconnects
    them). Under the pool's own lock, so a caller getting a connection meanwhile never
    receives one being taken."""
    async with pool._lock:
        free: list[AbstractConnection] = pool._available_connections
        taken = [connection for connection in free if select(connection)]
        if taken:
            gone = {id(connection) for connection in taken}
            pool._available_connections = [c for c in free if id(c) not in gone]
    return taken
