"""The HTTP/1.1 connection handling the gateway runs under uvicorn.

uvicorn's h11 protocol, because its `h11_max_incomplete_event_size` bounds what a
connection may buffer before it has sent a complete request head (the httptools one
buffers an endless header whole), plus two limits uvicorn does not have:

- **Head deadline**: a connection must send a complete request head within
  `request_head_timeout_seconds` of opening, and again after each response; otherwise
  it is closed. A connection that never sends a request, or dribbles a header a byte at
  a time, holds a file descriptor only that long. A request being served (an SSE stream
  included) is never affected: the deadline only closes a connection that has no
  request in progress.
- **Connection cap**: beyond `max_connections` open connections, a new connection is
  answered `503` (`Retry-After: 1`) and closed at once, before it can send anything, so
  the process keeps file descriptors for its established streams and for Redis.
  uvicorn's own `limit_concurrency` checks only when a request arrives, by which time
  idle connections may have exhausted the descriptors.

By default the cap is the process's open-file limit minus a reserve for the Redis pool
and the process's own files.
"""

from __future__ import annotations

import asyncio
import resource
from typing import Any, ClassVar, Final

import h11
import orjson
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..settings import Settings

# Descriptors kept out of the connection cap: listening sockets, logs, scripts, and so on
# (the Redis pool is added on top).
FD_RESERVE: Final = 32
MIN_CONNECTIONS: Final = 16


def connection_limit(settings: Settings) -> int | None:
    """`max_connections`, or the open-file limit minus the reserve (None: unlimited)."""
    if settings.max_connections is not None:
        return settings.max_connections
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    return max(MIN_CONNECTIONS, soft - FD_RESERVE - settings.redis_max_connections)


def _busy_response() -> bytes:
    body = orjson.dumps(
        {"error": "too_many_connections", "detail": "the gateway is at its connection limit"}
    )
    head = (
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        b"retry-after: 1\r\nconnection: close\r\ncontent-length: %d\r\n\r\n" % len(body)
    )
    return head + body


_BUSY: Final = _busy_response()


class GatewayH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the head deadline and the connection cap (see module)."""

    head_timeout: ClassVar[float] = 10.0
    max_connections: ClassVar[int | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None

    @classmethod
    def configured(cls, settings: Settings) -> type[GatewayH11Protocol]:
        """This protocol with the limits of `settings` (what `uvicorn.Config(http=…)` takes)."""
        return type(
            cls.__name__,
            (cls,),
            {
                "head_timeout": settings.request_head_timeout_seconds,
                "max_connections": connection_limit(settings),
            },
        )

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.max_connections is not None and len(self.connections) > self.max_connections:
            transport.write(_BUSY)
            transport.close()
            return
        self._arm_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_deadline()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_head_deadline()

    def _arm_head_deadline(self) -> None:
        self._cancel_head_deadline()
        self._head_timer = self.loop.call_later(self.head_timeout, self._head_deadline)

    def _cancel_head_deadline(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_deadline(self) -> None:
        self._head_timer = None
        # IDLE: no complete request head since the connection opened or the last
        # response; anything else is a request in progress, which is left alone.
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()
