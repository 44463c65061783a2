"""The HTTP/1.1 connection handling the gateway runs under uvicorn.

uvicorn's httptools protocol (its fastest: every SSE write goes through it), plus the
limits uvicorn does not enforce there:

- **Head size**: a connection may send at most `max_request_head_bytes` of request line
  and headers before the head is complete; beyond that it is answered `431` and closed.
  Without this the parser buffers an endless header whole. (The bound is checked after
  each read, so at most one read, 256 KiB, more is ever buffered.)
- **Head deadline**: a connection must send a complete request head within
  `request_head_timeout_seconds` of opening, and again after each response; otherwise
  it is closed. A connection that never sends a request, or dribbles a header a byte at
  a time, holds a file descriptor only that long. A request being served (an SSE stream
  included) is never affected: the deadline only closes a connection with no request
  in progress.
- **Connection cap**: beyond `max_connections` open connections, a new connection is
  answered `503` (`Retry-After: 1`) and closed at once, before it can send anything, so
  the process keeps file descriptors for its established streams and for Redis.
  uvicorn's own `limit_concurrency` checks only when a request arrives, by which time
  idle connections may have exhausted the descriptors.

By default the cap is the process's open-file limit minus a reserve for the Redis pool
and the process's own files.

The hooks are the protocol's parser callbacks (`on_message_begin`, `on_headers_complete`,
`on_message_complete`) and its `on_response_complete`, each extended, never replaced.
"""

from __future__ import annotations

import asyncio
import resource
from typing import Any, ClassVar, Final

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

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


def _refusal(status: bytes, code: str, detail: str) -> bytes:
    body = orjson.dumps({"error": code, "detail": detail})
    head = (
        b"HTTP/1.1 %s\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
        b"connection: close\r\ncontent-length: %d\r\n\r\n" % (status, len(body))
    )
    return head + body


_BUSY: Final = _refusal(
    b"503 Service Unavailable", "too_many_connections", "the gateway is at its connection limit"
)
_HEAD_TOO_LARGE: Final = _refusal(
    b"431 Request Header Fields Too Large",
    "request_head_too_large",
    "the request line and headers exceed the gateway's limit",
)


class GatewayHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the head limits and the connection cap."""

    head_timeout: ClassVar[float] = 10.0
    max_head_bytes: ClassVar[int] = 16_384
    max_connections: ClassVar[int | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0  # read since the current head began (while incomplete)
        self._head_pending = True  # no complete head since the last complete request
        self._heads = 0  # heads completed, so a read that completes one is not counted
        self._serving = 0  # requests whose head is complete and whose response is not

    @classmethod
    def configured(cls, settings: Settings) -> type[GatewayHttpProtocol]:
        """This protocol with the limits of `settings` (what `uvicorn.Config(http=…)` takes)."""
        return type(
            cls.__name__,
            (cls,),
            {
                "head_timeout": settings.request_head_timeout_seconds,
                "max_head_bytes": settings.max_request_head_bytes,
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

    def data_received(self, data: bytes) -> None:
        counting, heads = self._head_pending, self._heads
        super().data_received(data)
        # Count a read only when it neither began after a complete request nor completed
        # a head: then all of it is head (an undercount of one read at most).
        if counting and self._head_pending and heads == self._heads:
            self._head_bytes += len(data)
            if self._head_bytes > self.max_head_bytes and not self.transport.is_closing():
                self.transport.write(_HEAD_TOO_LARGE)
                self.transport.close()

    def on_headers_complete(self) -> None:
        self._head_pending = False
        self._heads += 1
        self._serving += 1
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head_pending, self._head_bytes = True, 0  # the next bytes start a new head

    def on_response_complete(self) -> None:
        self._serving = max(0, self._serving - 1)
        super().on_response_complete()
        if not self.transport.is_closing() and self._serving == 0:
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
        # No request in progress: the connection has not completed a head in time.
        if self._serving == 0 and not self.transport.is_closing():
            self.transport.close()
