"""The one boundary that turns exceptions into HTTP error responses.

Every error body is `{"error": "<code>", "detail": "<human text>"}`. Routes raise the
gateway's exception tree (`gateway.errors`) or `HttpError` for purely HTTP-level
problems (invalid JSON, a bad query parameter); `handled_error_response` answers them,
through the handlers `install_error_handlers` installs or directly on `GatewayApp`'s
short path: a `GatewayError` by its row in `RULES`, an `HttpError` with its own status,
Starlette's own `HTTPException` (an unmatched path or method) with its status, and a
client that left while its body was read with 499 `client_disconnect`. Nothing that a
client can send may turn into a 500: unexpected exceptions are still a 500, but only
for real bugs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from ...errors import (
    BackendUnavailable,
    BodyIdle,
    BridgeClosed,
    Forbidden,
    GatewayError,
    InvalidInput,
    NotReplicated,
    Overloaded,
    PayloadTooLarge,
    ProducerFenced,
    RunNotFound,
    RunOwned,
    SequenceRefused,
    SessionActive,
    SessionMismatch,
    StreamEnded,
    TooManyStreams,
    TurnExists,
    Unauthorized,
)
from ..responses import json_response
from .observe import ErrorSignal, note_error, note_http_error

RETRY_AFTER_SECONDS: Final = 1
# What the request log shows for a request whose client left before sending its whole
# body (nobody receives the response; the status is the one proxies use for this).
CLIENT_CLOSED_STATUS: Final = 499


# The codes the HTTP layer answers itself (no `GatewayError` class), each with its status:
# declared once here. `HttpError` and the guards take their status from it, and the OpenAPI
# error table lists them beside the codes of `RULES` (openapi.error_codes).
HTTP_CODES: Final[Mapping[str, int]] = MappingProxyType(
    {
        "invalid_json": 400,
        "invalid_request": 400,
        "host_not_allowed": 403,
        "not_found": 404,
        "method_not_allowed": 405,
        "unsupported_media_type": 415,
        "missing_producer_token": 422,
        "number_out_of_range": 422,
        "too_many_headers": 431,
        "request_head_too_large": 431,
        "too_many_connections": 503,
        "draining": 503,
        "not_started": 503,
    }
)


class HttpError(Exception):
    """An error the HTTP layer raises itself, with a code of `HTTP_CODES` (its status)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status = HTTP_CODES[code]
        self.code = code
        self.detail = detail


class RunEndedOnClaim(StreamEnded):
    """A claim of a run whose log already ends: `409 run_ended` (writes say `ended`)."""

    code = "run_ended"


def error_response(
    status: int,
    code: str,
    detail: str,
    headers: dict[str, str] | None = None,
    extra: dict[str, object] | None = None,
) -> Response:
    return json_response(
        {"error": code, "detail": detail, **(extra or {})}, status, headers=headers
    )


@dataclass(frozen=True, slots=True)
class ErrorRule:
    """How one class of `GatewayError` answers: its status, extra headers, what it counts."""

    status: int
    headers: Mapping[str, str] | None = None
    signal: ErrorSignal | None = None  # what the request log and metrics note (observe.py)


_RETRY_LATER: Final = MappingProxyType({"Retry-After": str(RETRY_AFTER_SECONDS)})

# The one table from errors to answers. A class without a row answers like its nearest
# ancestor that has one (`rule_of` walks the MRO, as Starlette picks exception handlers).
RULES: Final[Mapping[type[GatewayError], ErrorRule]] = MappingProxyType(
    {
        GatewayError: ErrorRule(500),
        InvalidInput: ErrorRule(422),
        PayloadTooLarge: ErrorRule(413),
        RunNotFound: ErrorRule(404),
        ProducerFenced: ErrorRule(409, signal="fenced_write"),
        RunOwned: ErrorRule(409),
        StreamEnded: ErrorRule(409, signal="write_after_end"),
        RunEndedOnClaim: ErrorRule(409),  # a claim, not a write
        SessionActive: ErrorRule(409),
        SessionMismatch: ErrorRule(409),
        TurnExists: ErrorRule(409),  # run_id: the turn the key started
        SequenceRefused: ErrorRule(409),  # sequence_gap / sequence_conflict, expected_seq
        BodyIdle: ErrorRule(408),  # only ever an error line of a streamed append
        BridgeClosed: ErrorRule(503, _RETRY_LATER),
        BackendUnavailable: ErrorRule(503, _RETRY_LATER, signal="backend_unavailable"),
        Unauthorized: ErrorRule(401, MappingProxyType({"WWW-Authenticate": "Bearer"})),
        Forbidden: ErrorRule(403),
        TooManyStreams: ErrorRule(429, _RETRY_LATER),
        Overloaded: ErrorRule(503, _RETRY_LATER),  # streamed appends past their byte budget
    }
)


def rule_of(exc: GatewayError) -> ErrorRule:
    """The row of the most specific class of `exc` that has one."""
    return rule_of_class(type(exc))


def rule_of_class(error: type[GatewayError]) -> ErrorRule:
    for cls in error.__mro__:
        rule = RULES.get(cls)
        if rule is not None:
            return rule
    raise AssertionError("unreachable: GatewayError has a row")


# What callers are told about a backend failure: the exception's text names internal
# addresses (`Error 111 connecting to 10.0.0.5:6379`), which is the operators' business.
BACKEND_UNAVAILABLE_DETAIL: Final = "the backend is unavailable; retry shortly"


def public_detail(exc: Exception) -> str:
    """The `detail` a client may see for `exc`."""
    if isinstance(exc, NotReplicated):  # (it names no server)
        return str(exc)
    if isinstance(exc, BackendUnavailable | OSError):
        return BACKEND_UNAVAILABLE_DETAIL
    if isinstance(exc, GatewayError):
        return str(exc) or exc.code.replace("_", " ")
    return "internal error"


def gateway_error_response(exc: GatewayError) -> Response:
    rule = rule_of(exc)
    headers = None if rule.headers is None else dict(rule.headers)
    return error_response(rule.status, exc.code, public_detail(exc), headers, exc.details())


_STARLETTE_CODES: Final = {HTTP_CODES[code]: code for code in ("not_found", "method_not_allowed")}

# The exceptions the boundary answers (anything else is a bug: a 500).
HANDLED: Final = (GatewayError, HttpError, HTTPException, ClientDisconnect)


def handled_error_response(request: Request, exc: Exception) -> Response | None:
    """The error response for the exceptions in `HANDLED`, None for anything else.

    What the handlers installed below answer; the short path (`app.py`) calls it directly
    for errors raised before a response starts.
    """
    if isinstance(exc, GatewayError):
        # outcome of the request log line, metrics, lifecycle line
        note_error(request, exc, rule_of(exc).signal)
        return gateway_error_response(exc)
    if isinstance(exc, HttpError):
        note_http_error(request, exc.code)
        return error_response(exc.status, exc.code, exc.detail)
    if isinstance(exc, HTTPException):  # Starlette's own: an unmatched path or method
        code = _STARLETTE_CODES.get(exc.status_code, "http_error")
        note_http_error(request, code)
        headers = dict(exc.headers) if exc.headers else None
        return error_response(exc.status_code, code, str(exc.detail), headers)
    if isinstance(exc, ClientDisconnect):
        # Not a server error: no traceback, no 5xx; its own outcome in the request log.
        note_http_error(request, "client_disconnect")
        return error_response(
            CLIENT_CLOSED_STATUS, "client_disconnect", "the client closed the connection"
        )
    return None


async def _on_handled_error(request: Request, exc: Exception) -> Response:
    response = handled_error_response(request, exc)
    assert response is not None  # installed for HANDLED only
    return response


def install_error_handlers(app: Starlette) -> None:
    for exc_class in HANDLED:
        app.add_exception_handler(exc_class, _on_handled_error)
