"""Checks every HTTP request passes before any route runs (the short path included).

- **Loopback `Host` in open mode.** A gateway without API keys or a JWT secret trusts
  whoever reaches it, which on loopback means local processes only, unless a web page
  gets the browser to send requests there under another name (DNS rebinding: the page's
  own host name resolving to 127.0.0.1). In open mode the `Host` header must therefore
  name loopback (`localhost`, `*.localhost`, `127.x.y.z`, `[::1]`); anything else is a
  `403 host_not_allowed`. A gateway forced open on another address
  (`allow_open_nonloopback`) skips this: its operator chose the names it answers to.
  So do the routes that never need credentials and reveal no run data (`/healthz`,
  `/readyz`, `/metrics`, `/openapi.json`), which load balancers probe under their own
  host names.
- **Header count.** More than `max_request_headers` header lines is a
  `431 too_many_headers` (their total size is bounded by the HTTP parser).
"""

from __future__ import annotations

from typing import Final

from starlette.types import Scope, Send

from ...hosts import host_header_is_loopback
from ...settings import Settings
from ..responses import json_response
from .errors import HTTP_CODES

_HOST: Final = b"host"
_ANY_HOST_PATHS: Final = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json"})


class RequestGuard:
    def __init__(self, settings: Settings, open_mode: bool) -> None:
        self._loopback_only = open_mode and not settings.allow_open_nonloopback
        self._max_headers = settings.max_request_headers

    def refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        """(status, code, detail) when the request must be refused, else None."""
        headers = scope["headers"]
        if len(headers) > self._max_headers:
            code = "too_many_headers"
            return HTTP_CODES[code], code, f"at most {self._max_headers} request headers"
        if self._loopback_only and scope["path"] not in _ANY_HOST_PATHS:
            for name, value in headers:
                if name == _HOST:
                    if not host_header_is_loopback(value.decode("latin-1")):
                        return (
                            HTTP_CODES["host_not_allowed"],
                            "host_not_allowed",
                            "without authentication this gateway answers only for loopback "
                            "host names (localhost, 127.0.0.1, [::1]); configure an API key "
                            "to serve other names",
                        )
                    break
        return None

    async def refuse(self, scope: Scope, send: Send, refusal: tuple[int, str, str]) -> None:
        status, code, detail = refusal
        # After a 431 the connection is closed: nothing more is read from a flooding client.
        headers = {"connection": "close"} if status == 431 else None
        response = json_response({"error": code, "detail": detail}, status, headers)
        await response(scope, _no_receive, send)


async def _no_receive() -> dict[str, str]:  # the refusal never reads the request
    return {"type": "http.disconnect"}
