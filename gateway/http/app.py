"""The Starlette application: `create_app(settings, bridge=None)`.

The lifespan opens the bridge with `open_bridge(settings)` unless one is passed in
(then the caller owns and closes it), and owns one anyio task group for background
work (the producer-liveness monitor), and the `DropWatch` (`liveness.open_drop_watch`,
its own task group: the checks of dropped streamed appends), closed before the bridge.
On exit it drains open SSE responses and waits, then cancels the task group; bridge
teardown is shielded inside the provider.

`app.state.gateway` is the `GatewayState` (bridge, settings, subscription registry,
metrics, authenticator). `RequestLogMiddleware` (`observe.py`) wraps every route on the
stack, and the short path does the same for the direct ones: request ids and one log
line per request; the lifespan logs `startup`, `drain` and `shutdown`.
The direct routes (the SSE `GET`s and the producer's append) are dispatched by
`GatewayApp` itself, doing in one frame what the middleware stack does (a shorter
suspended call chain per idle stream, less work per appended token; see the class);
the CORS rules (`cors.py`) sit in front of both paths.
Call `drain(app)` (or use `gateway.http.serve.server.GatewayServer`)
when the server starts shutting down, so SSE responses end cleanly before uvicorn waits
for connections to close.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, Final

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, Response
from starlette.routing import Match, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from ..bridge.base import StreamBridge
from ..bridge.provider import open_bridge
from ..sessions.provider import session_store_for
from ..settings import Settings
from .edge.auth import Authenticator
from .edge.cors import cors_app
from .edge.errors import handled_error_response, install_error_handlers
from .edge.guards import RequestGuard
from .edge.observe import RequestLogMiddleware, begin_request, lifecycle
from .edge.routing import DirectRoute
from .metrics import Metrics
from .openapi import Operation, Reply, document, document_mount, openapi_document
from .responses import json_response
from .routes import (
    langgraph,
    operator,
    ops,
    producer,
    session_feed,
    subscriber,
    ui_history,
    ui_stream,
)
from .routes import (
    sessions as sessions_routes,
)
from .serve.connections import subject_stream_limit
from .state import GatewayState
from .streaming.liveness import monitor, open_drop_watch
from .streaming.subscriptions import SubscriptionRegistry


@document(
    Operation(
        "This document (OpenAPI 3.1), generated from the routes",
        "ops",
        {200: Reply("The OpenAPI document", media="application/json")},
    )
)
async def openapi(request: Request) -> Response:
    app: GatewayApp = request.app
    if app.api_document is None:
        app.api_document = openapi_document(app.routes)
    return json_response(app.api_document)


# The browser console and the JS client (no build step; shipped inside the wheel).
STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
_STATIC: Final = StaticFiles(directory=STATIC_DIR)
document_mount(
    _STATIC,
    Operation(
        "The console's files and the JS client (`/static/gateway-client.js`)",
        "ops",
        {
            200: Reply("The file", media="text/plain"),
            404: Reply("No such file", media="text/plain"),
        },
    ),
)


@document(
    Operation(
        "The browser console (docs/client.md)",
        "ops",
        {200: Reply("The console page", media="text/html")},
    )
)
async def console(_request: Request) -> Response:
    return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


def create_app(settings: Settings, bridge: StreamBridge | None = None) -> Starlette:
    subscriptions = SubscriptionRegistry(subject_limit=subject_stream_limit(settings))
    state = GatewayState(
        settings=settings,
        subscriptions=subscriptions,
        # read at scrape time: the bridge's own counters (e.g. notifier reconnects)
        metrics=Metrics(subscriptions, bridge=lambda: state.bridge_),
        auth=Authenticator.from_settings(settings),
        bridge_=bridge,
        sessions_=None if bridge is None else session_store_for(bridge, settings),
    )

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            if bridge is None:
                state.bridge_ = await stack.enter_async_context(open_bridge(settings))
                state.sessions_ = session_store_for(state.bridge_, settings)
            # dropped streamed appends, checked after the grace (closed before the bridge)
            state.drops = await stack.enter_async_context(
                open_drop_watch(state.bridge, settings.producer_lost_grace_seconds, state.metrics)
            )
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(
                        monitor,
                        state.bridge,
                        subscriptions,
                        settings.heartbeat_interval_seconds,
                        state.metrics,
                        state.sessions,
                    )
                    state.started = True
                    lifecycle(
                        "startup",
                        "gateway serving",
                        backend="redis" if settings.redis_url else "memory",
                        legacy_end_scan=settings.legacy_end_scan_enabled,
                    )
                    await ops.log_eviction_policy(state.bridge)
                    try:
                        yield
                    finally:
                        _drain(state)
                        tg.cancel_scope.cancel()
            finally:
                state.started = False
                state.drops = None
                if bridge is None:
                    state.bridge_ = state.sessions_ = None
                lifecycle("shutdown", "gateway stopped")

    routes = [
        *producer.routes,
        *subscriber.routes,
        *operator.routes,
        *langgraph.routes,
        *sessions_routes.routes,
        *ui_stream.routes,
        *ui_history.routes,
        *session_feed.routes,
        *ops.routes,
        Route("/openapi.json", openapi, methods=["GET"]),
        Route("/", console, methods=["GET"]),
        Mount("/static", _STATIC, name="static"),
    ]
    app = GatewayApp(
        routes=routes,
        lifespan=lifespan,
        middleware=[Middleware(RequestLogMiddleware)],
        settings=settings,
    )
    # No trailing-slash redirects: Starlette builds their Location from the Host header
    # and copies the query string (a subscriber's `access_token`) into it.
    app.router.redirect_slashes = False
    app.guard = RequestGuard(settings, state.auth.open_mode)
    install_error_handlers(app)
    app.state.gateway = state
    return app


class GatewayApp(Starlette):
    """Starlette with a short path for the direct routes, and the CORS rules in front.

    An idle SSE response is what a process holds thousands of, suspended for minutes:
    each frame of the call chain above it (Starlette's error middleware, the request log
    middleware, the exception middleware, the router, the route's request wrapper and
    their `send` closures) stays allocated for its lifetime; and a producer appends one
    event per POST, many times a second, each time through that whole chain. For a
    request a `DirectRoute` matches in full (`routing.py`: path and method), `__call__`
    does what that chain does in one frame, through public API only: the route's scope
    keys, the request id and log line (`observe`), errors answered by the one error
    boundary (`errors.handled_error_response`, what the installed handlers answer), and
    the plain 500 for anything else. Everything else (a `HEAD`, a method the route does
    not allow, every other route) and a `debug` app take the normal stack. Middleware
    added to the app does not see the direct routes: it belongs in front of the whole app
    (as `cors.py` is) or in the endpoint. Direct paths must not be shadowed by an earlier
    route (none is).
    """

    guard: RequestGuard | None = None
    api_document: dict[str, Any] | None = None  # /openapi.json, built on its first request

    def __init__(self, *args: Any, settings: Settings, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # By method, so a request tries only the routes that could match it in full
        # (never `HEAD`: that takes the stack).
        self._direct_routes: dict[str, list[DirectRoute]] = {}
        for route in self.router.routes:
            if isinstance(route, DirectRoute):
                for method in route.methods or ():
                    if method != "HEAD":
                        self._direct_routes.setdefault(method, []).append(route)
        self._cors = cors_app(self._dispatch, settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.guard is not None:
            refusal = self.guard.refusal(scope)
            if refusal is not None:
                sender = begin_request(scope, send)  # its request log line, with the code
                sender.record.outcome = refusal[1]
                try:
                    await self.guard.refuse(scope, sender, refusal)
                finally:
                    sender.finished()
                return
        # Requests without `Origin` (every non-browser client) skip the CORS layer, as
        # CORSMiddleware itself would: one frame less per idle stream.
        if self._cors is not None and _has_origin(scope):
            await self._cors(scope, receive, send)  # the CORS rules, then `_dispatch`
            return
        matched = self._direct_match(scope)
        if matched is None:
            await super().__call__(scope, receive, send)
        else:
            await self._serve_direct(scope, receive, send, *matched)

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        matched = self._direct_match(scope)
        if matched is None:
            await super().__call__(scope, receive, send)
        else:
            await self._serve_direct(scope, receive, send, *matched)

    def _direct_match(self, scope: Scope) -> tuple[DirectRoute, Any] | None:
        if scope["type"] == "http" and not self.debug:
            for route in self._direct_routes.get(scope["method"], ()):
                match, child_scope = route.matches(scope)
                if match is Match.FULL:
                    return route, child_scope
        return None

    async def _serve_direct(
        self, scope: Scope, receive: Receive, send: Send, route: DirectRoute, child_scope: Any
    ) -> None:
        # The scope keys Starlette.__call__ and the router set.
        scope["app"] = self
        scope.setdefault("router", self.router)
        scope["route"] = route
        scope.update(child_scope)
        sender = begin_request(scope, send)  # RequestLogMiddleware
        try:
            request = Request(scope, receive, sender)
            try:
                response = await route.endpoint(request)
            except Exception as exc:
                handled = handled_error_response(request, exc)
                if handled is None:
                    raise
                response = handled
            del request  # not kept alive by this frame for the stream's lifetime
            await response(scope, receive, sender)
        except Exception:
            sender.failed()
            if not sender.started:  # ServerErrorMiddleware: a plain 500, then re-raise
                await PlainTextResponse("Internal Server Error", status_code=500)(
                    scope, receive, send
                )
            raise
        finally:
            sender.finished()


def _has_origin(scope: Scope) -> bool:
    return scope["type"] == "http" and any(name == b"origin" for name, _ in scope["headers"])


def drain(app: Starlette) -> None:
    """End every open SSE response and `/wait` cleanly (call on the app's event loop)."""
    state: GatewayState = app.state.gateway
    _drain(state)


def _drain(state: GatewayState) -> None:
    if not state.subscriptions.draining:
        lifecycle(
            "drain",
            "draining open SSE responses and /wait calls",
            open_sse=state.subscriptions.open_sse,
            open_waits=state.subscriptions.open_waits,
        )
    state.subscriptions.drain()
