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
- **Trailers**: the trailer fields after a chunked body are counted against the same
  limits as the head (their bytes with the head's, their number with the headers'), and
  never kept (uvicorn would append them to the request's headers, without bound). So are
  the bytes of a body that carry no body data (chunk framing, a trailer line without an
  end): more than `max_request_head_bytes` of them in a row is refused too.
- **Refusals close**: a `431` (head or trailers too large, too many fields) is answered
  with `Connection: close` and the connection is closed, whatever the client sends next.
  When the response to the request has already started (a chunked request whose answer
  came before its body ended), the connection is closed without a second answer.
- **Connection cap**: beyond `max_connections` open connections, a new connection is
  answered `503` (`Retry-After: 1`) and closed at once, before it can send anything, so
  the process keeps file descriptors for its established streams and for Redis.
  uvicorn's own `limit_concurrency` checks only when a request arrives, by which time
  idle connections may have exhausted the descriptors. Health probes are never shut
  out by the cap: `PROBE_RESERVE` connections beyond it are let in for the probe routes
  only (`/healthz`, `/readyz`, `/metrics`); any other request on them is answered the
  same `503` and closed. Which reader holds how many of the connections is the
  subscription registry's business (`subject_stream_share`, `subscriptions.py`).

By default the cap is the process's open-file limit minus a reserve for the Redis pool
and the process's own files (the probe reserve is inside the latter).

The hooks are the protocol's parser callbacks (`on_message_begin`, `on_headers_complete`,
`on_message_complete`) and its `on_response_complete`, each extended, never replaced.
"""

from __future__ import annotations

import asyncio
import resource
from http import HTTPStatus
from typing import Any, ClassVar, Final

import orjson
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ...settings import Settings
from ..edge.errors import HTTP_CODES

# Descriptors kept out of the connection cap: listening sockets, logs, scripts, and so on
# (the Redis pool is added on top).
FD_RESERVE: Final = 32
MIN_CONNECTIONS: Final = 16
# Connections past the cap let in for health probes only (inside FD_RESERVE).
PROBE_RESERVE: Final = 16
PROBE_PATHS: Final = frozenset({b"/healthz", b"/readyz", b"/metrics"})


def connection_limit(settings: Settings) -> int | None:
    """`max_connections`, or the open-file limit minus the reserve (None: unlimited)."""
    if settings.max_connections is not None:
        return settings.max_connections
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    return max(MIN_CONNECTIONS, soft - FD_RESERVE - settings.redis_max_connections)


def subject_stream_limit(settings: Settings) -> int | None:
    """Open streams and `/wait` calls one reader may hold in this process: its share of
    the connection cap (at least 1); None when there is no cap."""
    cap = connection_limit(settings)
    if cap is None:
        return None
    return max(1, int(cap * settings.subject_stream_share))


def _refusal(code: str, detail: str) -> bytes:
    status = HTTPStatus(HTTP_CODES[code])
    body = orjson.dumps({"error": code, "detail": detail})
    head = (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
        b"connection: close\r\ncontent-length: %d\r\n\r\n"
        % (status.value, status.phrase.encode(), len(body))
    )
    return head + body


_BUSY_DETAIL: Final = "the gateway is at its connection limit"
_BUSY: Final = _refusal("too_many_connections", _BUSY_DETAIL)
_HEAD_TOO_LARGE: Final = _refusal(
    "request_head_too_large", "the request line and headers exceed the gateway's limit"
)
_TRAILERS_TOO_LARGE: Final = _refusal(
    "request_head_too_large", "the request's trailers, with its head, exceed the gateway's limits"
)


async def _busy_app(scope: Scope, receive: Receive, send: Send) -> None:
    """What a connection let in past the cap gets for anything but a probe."""
    body = orjson.dumps({"error": "too_many_connections", "detail": _BUSY_DETAIL})
    headers = [
        (b"content-type", b"application/json"),
        (b"retry-after", b"1"),
        (b"connection", b"close"),
        (b"content-length", b"%d" % len(body)),
    ]
    status = HTTP_CODES["too_many_connections"]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class GatewayHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the head limits and the connection cap."""

    head_timeout: ClassVar[float] = 10.0
    max_head_bytes: ClassVar[int] = 16_384
    max_headers: ClassVar[int] = 100
    max_connections: ClassVar[int | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0  # read since the current head began (while incomplete)
        self._head_pending = True  # no complete head since the last complete request
        self._heads = 0  # heads completed, so a read that completes one is not counted
        self._serving = 0  # requests whose head is complete and whose response is not
        self._fields = 0  # header and trailer fields of the current request
        self._bodies = 0  # body callbacks, so a read that carried body data is told apart
        self._no_body_bytes = 0  # bytes read in a row in a body without body data
        self._probes_only = False  # let in past the cap: serves the probe routes only

    @classmethod
    def configured(cls, settings: Settings) -> type[GatewayHttpProtocol]:
        """This protocol with the limits of `settings` (what `uvicorn.Config(http=…)` takes)."""
        return type(
            cls.__name__,
            (cls,),
            {
                "head_timeout": settings.request_head_timeout_seconds,
                "max_head_bytes": settings.max_request_head_bytes,
                "max_headers": settings.max_request_headers,
                "max_connections": connection_limit(settings),
            },
        )

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.max_connections is not None and len(self.connections) > self.max_connections:
            if len(self.connections) > self.max_connections + PROBE_RESERVE:
                transport.write(_BUSY)
                transport.close()
                return
            self._probes_only = True
        self._arm_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        counting, heads, bodies = self._head_pending, self._heads, self._bodies
        super().data_received(data)
        if self.transport.is_closing() or heads != self._heads:
            return
        # Count a read only when it neither began after a complete request nor completed
        # a head: then all of it is head (an undercount of one read at most).
        if counting and self._head_pending:
            self._head_bytes += len(data)
            if self._head_bytes > self.max_head_bytes:
                self._refuse(_HEAD_TOO_LARGE)
        elif not counting and not self._head_pending:
            # Still in the same request's body. A read without body data is framing or
            # trailers (in a row, an endless trailer line): bounded like a head.
            if self._bodies != bodies:
                self._no_body_bytes = 0
            else:
                self._no_body_bytes += len(data)
                if self._no_body_bytes > self.max_head_bytes:
                    self._refuse(_TRAILERS_TOO_LARGE, in_request=True)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields += 1
        if self._head_pending:
            super().on_header(name, value)
            return
        # A trailer: counted with the head, never kept (the request's scope is taken).
        self._head_bytes += len(name) + len(value) + 4  # ": " and CRLF
        if self._fields > self.max_headers or self._head_bytes > self.max_head_bytes:
            self._refuse(_TRAILERS_TOO_LARGE, in_request=True)

    def on_headers_complete(self) -> None:
        self._head_pending = False
        self._heads += 1
        self._serving += 1
        if self._probes_only and self.url.partition(b"?")[0] not in PROBE_PATHS:
            app, self.app = self.app, _busy_app  # what uvicorn does at limit_concurrency
            try:
                super().on_headers_complete()
            finally:
                self.app = app
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._bodies += 1
        super().on_body(body)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        # The next bytes start a new head.
        self._head_pending, self._head_bytes, self._fields, self._no_body_bytes = True, 0, 0, 0

    def _refuse(self, answer: bytes, *, in_request: bool = False) -> None:
        """Close the connection: `answer` first, unless the request being received
        (`in_request`: its head is complete) already has a response under way."""
        if self.transport.is_closing():
            return
        cycle = self.cycle if in_request else None
        if cycle is None or not cycle.response_started:
            self.transport.write(answer)
        if cycle is not None and not cycle.response_complete:
            # What connection_lost will tell it anyway: the app writes nothing after this.
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()

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
