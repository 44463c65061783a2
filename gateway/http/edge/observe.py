"""Request ids, one structured log line per request, and lifecycle log events.

`RequestLogMiddleware` (pure ASGI, outermost inside Starlette's error middleware; the
direct routes (the SSE `GET`s and the producer's append), which `GatewayApp` serves
without the stack, get the same through `begin_request`):

- takes the request id from an incoming `X-Request-ID` (1-128 chars of
  `[A-Za-z0-9._:/+=@-]`) or generates one (32 hex chars), and echoes it in the
  response's `X-Request-ID` header;
- keeps a `RequestRecord` in the ASGI scope (`RECORD_KEY`) that the app fills in: the
  error handlers set `outcome` to the error code, an SSE response sets its stream
  outcome (`end`, `gap`, `disconnect`, `send_timeout`, `drain`, `unavailable`) and the
  number of data events it delivered;
- logs one line when the response has finished (for SSE: when the stream ends), on the
  `gateway.http.requests` logger: `event="request"`, `method`, `route` (the route
  template, never the raw path or query), `status`, `duration_ms`, `request_id`,
  `run_id` / `session_id` when the route has them, `outcome`, and for SSE
  `events_delivered`. Successful ops probes (`/healthz`, `/readyz`, `/metrics`) log at
  DEBUG, 5xx at WARNING, everything else at INFO.

Lifecycle events go through `lifecycle(...)`: the `event` field names them (`startup`,
`drain`, `shutdown`, `recovery_end`, `producer_dropped`, `fenced_write`, `gap`,
`backend_unavailable`, `scripts_reloaded`). No line ever carries a payload, a request
body or a credential.
"""

from __future__ import annotations

import functools
import logging
import re
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias

from starlette.requests import Request
from starlette.routing import Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...errors import GatewayError
from ...names import is_valid_id
from .routing import SSERoute

if TYPE_CHECKING:
    from ..metrics import Metrics

RECORD_KEY: Final = "gateway.request"
REQUEST_ID_HEADER: Final = b"x-request-id"
_REQUEST_ID_RE: Final = re.compile(r"[A-Za-z0-9._:/+=@-]{1,128}")

request_log = logging.getLogger("gateway.http.requests")
lifecycle_log = logging.getLogger("gateway.lifecycle")


@dataclass(slots=True)
class RequestRecord:
    """What the app tells the request log line about one request."""

    request_id: str
    started: float  # time.perf_counter()
    outcome: str | None = None
    events_delivered: int | None = None  # SSE responses only


def record_of(scope: Scope) -> RequestRecord | None:
    record = scope.get(RECORD_KEY)
    return record if isinstance(record, RequestRecord) else None


def request_id_of(scope: Scope) -> str | None:
    record = record_of(scope)
    return None if record is None else record.request_id


def lifecycle(event: str, message: str, *, level: int = logging.INFO, **fields: Any) -> None:
    """One lifecycle log line; `fields` are identifiers and outcomes, never payloads."""
    if lifecycle_log.isEnabledFor(level):
        clean = {key: value for key, value in fields.items() if value is not None}
        lifecycle_log.log(level, message, extra={"event": event, **clean})


# ------------------------------------------------------------------------------- routes


def route_template(scope: Scope) -> str:
    """The matched route's path template (`/v1/runs/{run_id}/stream`), never the raw path."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    if not isinstance(path, str):
        return "unmatched"
    return path + "/{path}" if isinstance(route, Mount) else path


@functools.cache
def _kind(template: str, method: str) -> str:
    if template in ("/healthz", "/readyz", "/metrics"):
        return "ops"
    if template.startswith("/v1/sessions"):
        return "sessions"
    if template.startswith("/v1/runs"):
        if method == "DELETE":
            return "operator"
        if method == "POST" and (
            template == "/v1/runs" or template.endswith(("/events", "/end", "/lease"))
        ):
            return "producer"
        return "subscriber"
    if template.startswith("/threads/"):
        return "subscriber"
    return "other"


def route_kind(scope: Scope) -> str:
    """`producer`, `subscriber`, `sse`, `sessions`, `operator`, `ops` or `other`."""
    if isinstance(scope.get("route"), SSERoute):
        return "sse"
    return _kind(route_template(scope), str(scope.get("method", "GET")))


def _path_param(scope: Scope, name: str) -> str | None:
    """A path parameter when it is a well-formed id (anything else is logged as invalid)."""
    params = scope.get("path_params")
    value = params.get(name) if isinstance(params, dict) else None
    if not isinstance(value, str):
        return None
    return value if is_valid_id(value) else "<invalid>"


# ------------------------------------------------------------------------ error hooks


# What an error handler asks this module to note besides the outcome (the `signal` of the
# error's row in `gateway.http.edge.errors.RULES`).
ErrorSignal: TypeAlias = Literal["backend_unavailable", "fenced_write", "write_after_end"]


def note_error(request: Request, exc: GatewayError, signal: ErrorSignal | None) -> None:
    """Called by the error handlers: outcome, metrics and lifecycle line of one error."""
    scope = request.scope
    record = record_of(scope)
    if record is not None:
        record.outcome = exc.code
    if signal is None:
        return
    state = getattr(request.app.state, "gateway", None)
    metrics: Metrics | None = getattr(state, "metrics", None)
    run_id = _path_param(scope, "run_id")
    request_id = None if record is None else record.request_id
    if signal == "backend_unavailable":
        kind = route_kind(scope)
        if metrics is not None:
            metrics.unavailable(kind)
        lifecycle(
            "backend_unavailable",
            "backend unavailable",
            level=logging.WARNING,
            route=route_template(scope),
            route_kind=kind,
            run_id=run_id,
            request_id=request_id,
            cause=str(exc),  # for operators only: clients get a generic detail
        )
    elif signal == "fenced_write":
        if metrics is not None:
            metrics.fenced_writes.inc()
        lifecycle("fenced_write", "producer write fenced", run_id=run_id, request_id=request_id)
    elif metrics is not None:  # write_after_end
        metrics.writes_after_end.inc()


def note_http_error(request: Request, code: str) -> None:
    record = record_of(request.scope)
    if record is not None:
        record.outcome = code


# -------------------------------------------------------------------------- middleware


def _incoming_request_id(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == REQUEST_ID_HEADER:
            text = value.decode("latin-1")
            return text if _REQUEST_ID_RE.fullmatch(text) else None
    return None


class RequestLogMiddleware:
    """Request id in and out, and one log line per finished request (see module doc)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sender = begin_request(scope, send)
        try:
            await self.app(scope, receive, sender)
        except Exception:
            sender.failed()
            raise
        finally:
            sender.finished()


def begin_request(scope: Scope, send: Send) -> RequestSend:
    """Give an HTTP request its id and record; the `send` that adds `X-Request-ID`.

    What `RequestLogMiddleware` does around the app, shared with the short path
    (`gateway.http.app`): call `failed()` when the app raises, `finished()` at the end.
    """
    request_id = _incoming_request_id(scope) or secrets.token_hex(16)
    record = RequestRecord(request_id, time.perf_counter())
    scope[RECORD_KEY] = record
    return RequestSend(scope, send, record)


class RequestSend:
    """The `send` of one request: adds the request id header, remembers the status.

    A small object rather than a closure: an SSE stream holds one for its lifetime.
    """

    __slots__ = ("_scope", "_send", "record", "started", "status")

    def __init__(self, scope: Scope, send: Send, record: RequestRecord) -> None:
        self._scope = scope
        self._send = send
        self.record = record
        self.status = 500  # if the app fails before it answers
        self.started = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            self.started = True
            header = (REQUEST_ID_HEADER, self.record.request_id.encode("latin-1"))
            message = {**message, "headers": [*message.get("headers", ()), header]}
        await self._send(message)

    @property
    def downstream(self) -> Send:
        """The `send` this one wraps."""
        return self._send

    def failed(self) -> None:
        if self.record.outcome is None:
            self.record.outcome = "error"

    def finished(self) -> None:
        _log_request(self._scope, self.record, self.status)


def body_send(send: Send) -> Send:
    """The `send` for the body of a response that has started: past `RequestSend`, which
    only touches `http.response.start` (an SSE stream writes a body message per event,
    each one coroutine call less this way)."""
    if isinstance(send, RequestSend) and send.started:
        return send.downstream
    return send


def _log_request(scope: Scope, record: RequestRecord, status: int) -> None:
    template = route_template(scope)
    if status >= 500:
        level = logging.WARNING
    elif _kind(template, str(scope.get("method", ""))) == "ops" and status < 400:
        level = logging.DEBUG
    else:
        level = logging.INFO
    if not request_log.isEnabledFor(level):
        return
    duration_ms = round((time.perf_counter() - record.started) * 1000, 3)
    outcome = record.outcome or ("ok" if status < 400 else "error")
    fields: dict[str, Any] = {
        "event": "request",
        "method": scope.get("method"),
        "route": template,
        "status": status,
        "duration_ms": duration_ms,
        "request_id": record.request_id,
        "outcome": outcome,
    }
    for name in ("run_id", "session_id"):
        value = _path_param(scope, name)
        if value is not None:
            fields[name] = value
    if record.events_delivered is not None:
        fields["events_delivered"] = record.events_delivered
    request_log.log(level, "%s %s %d %s", fields["method"], template, status, outcome, extra=fields)
