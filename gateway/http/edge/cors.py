"""Browsers on another origin: the CORS rules, all here (Starlette's `CORSMiddleware`).

`cors_origins` (settings) is the allow-list; empty means no cross-origin access at all
(no middleware). An allowed origin gets CORS on the subscriber and session routes: the
methods `GET` and `POST` (`POST …/cancel`), the request headers a browser client sends
(`Authorization` or `X-Api-Key`, `Last-Event-ID`, `Content-Type`), and the response headers
`X-Request-ID` and `Location` readable. An origin not on the list gets no CORS headers
(the browser refuses the response; a preflight gets 400).

Producer and operator requests (a claim, `…/events`, `…/end`, `…/lease`, any `DELETE`)
are server-to-server: they get no CORS unless `cors_producer_routes` is set, which
allows them the same origins with `DELETE` and the producer headers too.

`GatewayApp` applies `cors_app` in front of everything, the short path included, so
there is one set of rules for every route (a request without `Origin`, which gets no
CORS headers anyway, goes straight past it). A preflight is told apart by
`Access-Control-Request-Method`, the method the browser is asking about.
"""

from __future__ import annotations

from typing import Final

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from ...settings import Settings

READER_METHODS: Final = ("GET", "POST")
# X-Api-Key: where the LangGraph SDK puts a credential (`api_key=`), taken like Authorization
READER_HEADERS: Final = ("Authorization", "X-Api-Key", "Last-Event-ID", "Content-Type")
PRODUCER_METHODS: Final = ("GET", "POST", "DELETE")
PRODUCER_HEADERS: Final = (*READER_HEADERS, "X-Producer-Token", "X-Producer-Seq")
EXPOSED_HEADERS: Final = ("X-Request-ID", "Location", "Retry-After")
PREFLIGHT_MAX_AGE: Final = 600
_PRODUCER_SUFFIXES: Final = ("/events", "/end", "/lease")


def is_server_to_server(method: str, path: str) -> bool:
    """A producer or operator request (by the method it uses or asks about)."""
    if method == "DELETE":
        return True
    return method == "POST" and (path.endswith("/v1/runs") or path.endswith(_PRODUCER_SUFFIXES))


class _Cors:
    """Reader CORS for reader routes; producer CORS (or none) for producer routes."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        def middleware(methods: tuple[str, ...], headers: tuple[str, ...]) -> ASGIApp:
            return CORSMiddleware(
                app,
                allow_origins=list(settings.cors_origins),
                allow_methods=methods,
                allow_headers=headers,
                expose_headers=EXPOSED_HEADERS,
                max_age=PREFLIGHT_MAX_AGE,
            )

        self._app = app
        self._readers = middleware(READER_METHODS, READER_HEADERS)
        self._producers = (
            middleware(PRODUCER_METHODS, PRODUCER_HEADERS) if settings.cors_producer_routes else app
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        method: str = scope["method"]
        if method == "OPTIONS":
            method = Headers(scope=scope).get("access-control-request-method", "").upper()
        if is_server_to_server(method, scope["path"]):
            await self._producers(scope, receive, send)
        else:
            await self._readers(scope, receive, send)


def cors_app(app: ASGIApp, settings: Settings) -> ASGIApp | None:
    """`app` behind the CORS rules of `settings`; None when no origin is allowed."""
    if not settings.cors_origins:
        return None
    return _Cors(app, settings)
