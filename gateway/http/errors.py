"""The one boundary that turns exceptions into HTTP error responses.

Every error body is `{"error": "<code>", "detail": "<human text>"}`. Routes raise the
gateway's exception tree (`gateway.errors`) or `HttpError` for purely HTTP-level
problems (invalid JSON, a bad query parameter); the handlers installed by
`install_error_handlers` pick the status. Nothing that a client can send may turn into
a 500: unexpected exceptions are still a 500, but only for real bugs.
"""

from __future__ import annotations

from typing import Final

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from ..errors import (
    BackendUnavailable,
    BridgeClosed,
    Forbidden,
    GatewayError,
    InvalidInput,
    PayloadTooLarge,
    ProducerFenced,
    RunNotFound,
    RunOwned,
    SessionActive,
    StreamEnded,
    Unauthorized,
)
from .observe import note_error, note_http_error
from .responses import json_response

RETRY_AFTER_SECONDS: Final = 1


class HttpError(Exception):
    """An error with an explicit status and code, raised by the HTTP layer itself."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail


class RunEndedOnClaim(StreamEnded):
    """A claim of a run whose log already ends: `409 run_ended` (writes say `ended`)."""

    code = "run_ended"


def error_response(
    status: int, code: str, detail: str, headers: dict[str, str] | None = None
) -> Response:
    return json_response({"error": code, "detail": detail}, status, headers=headers)


def _status_of(exc: GatewayError) -> tuple[int, dict[str, str] | None]:
    """The status (and extra headers) for one gateway error; most specific class first."""
    if isinstance(exc, PayloadTooLarge):
        return 413, None
    if isinstance(exc, InvalidInput):
        return 422, None
    if isinstance(exc, RunNotFound):
        return 404, None
    if isinstance(exc, ProducerFenced | RunOwned | StreamEnded | SessionActive):
        return 409, None
    if isinstance(exc, BackendUnavailable | BridgeClosed):
        return 503, {"Retry-After": str(RETRY_AFTER_SECONDS)}
    if isinstance(exc, Unauthorized):
        return 401, {"WWW-Authenticate": "Bearer"}
    if isinstance(exc, Forbidden):
        return 403, None
    return 500, None


def gateway_error_response(exc: GatewayError) -> Response:
    status, headers = _status_of(exc)
    detail = str(exc) or exc.code.replace("_", " ")
    return error_response(status, exc.code, detail, headers)


async def _on_own_error(request: Request, exc: Exception) -> Response:
    response = handled_error_response(request, exc)
    assert response is not None  # installed for GatewayError and HttpError only
    return response


_STARLETTE_CODES: Final = {404: "not_found", 405: "method_not_allowed"}


async def _on_starlette_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = _STARLETTE_CODES.get(exc.status_code, "http_error")
    note_http_error(request, code)
    headers = dict(exc.headers) if exc.headers else None
    return error_response(exc.status_code, code, str(exc.detail), headers)


def handled_error_response(request: Request, exc: Exception) -> Response | None:
    """The error response for the gateway's own errors, None for anything else.

    What the handlers installed below answer; the SSE fast path (`app.py`) calls it
    directly for errors raised before a response starts.
    """
    if isinstance(exc, GatewayError):
        note_error(request, exc)  # outcome of the request log line, metrics, lifecycle line
        return gateway_error_response(exc)
    if isinstance(exc, HttpError):
        note_http_error(request, exc.code)
        return error_response(exc.status, exc.code, exc.detail)
    return None


def install_error_handlers(app: Starlette) -> None:
    app.add_exception_handler(GatewayError, _on_own_error)
    app.add_exception_handler(HttpError, _on_own_error)
    app.add_exception_handler(HTTPException, _on_starlette_http_exception)
