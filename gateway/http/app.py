"""The Starlette application: `create_app(settings, bridge=None)`.

The lifespan opens the bridge with `open_bridge(settings)` unless one is passed in
(then the caller owns and closes it), and owns one anyio task group for background
work (the producer-liveness monitor). On exit it drains open SSE responses and waits,
then cancels the task group; bridge teardown is shielded inside the provider.

`app.state.gateway` is the `GatewayState` (bridge, settings, subscription registry,
metrics, authenticator). `RequestLogMiddleware` (`observe.py`) wraps every route: request
ids and one log line per request; the lifespan logs `startup`, `drain` and `shutdown`.
The SSE `GET` routes are dispatched by `GatewayApp` itself, doing in one frame what the
middleware stack does (a shorter suspended call chain per idle stream; see the class).
Call `drain(app)` (or use `gateway.http.server.GatewayServer`)
when the server starts shutting down, so SSE responses end cleanly before uvicorn waits
for connections to close.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from starlette._exception_handler import _lookup_exception_handler
from starlette._utils import is_async_callable
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Match, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ExceptionHandler, Receive, Scope, Send

from ..bridge.base import StreamBridge
from ..bridge.provider import open_bridge
from ..sessions.provider import session_store_for
from ..settings import Settings
from . import langgraph, operator, ops, producer, session_feed, sessions_routes, subscriber
from .auth import Authenticator
from .errors import install_error_handlers
from .liveness import monitor
from .metrics import Metrics
from .observe import RequestLogMiddleware, begin_request, lifecycle
from .openapi import openapi_document
from .responses import json_response
from .state import GatewayState
from .subscriptions import SubscriptionRegistry


async def _openapi(_request: Request) -> Response:
    return json_response(openapi_document())


# The browser console and the JS client (no build step; shipped inside the wheel).
STATIC_DIR = Path(__file__).resolve().parent.parent / "static"


async def _console(_request: Request) -> Response:
    return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


def create_app(settings: Settings, bridge: StreamBridge | None = None) -> Starlette:
    subscriptions = SubscriptionRegistry()
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
                if bridge is None:
                    state.bridge_ = state.sessions_ = None
                lifecycle("shutdown", "gateway stopped")

    routes = [
        *producer.routes,
        *subscriber.routes,
        *operator.routes,
        *langgraph.routes,
        *sessions_routes.routes,
        *session_feed.routes,
        *ops.routes,
        Route("/openapi.json", _openapi, methods=["GET"], include_in_schema=False),
        Route("/", _console, methods=["GET"], include_in_schema=False),
        Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
    ]
    app = GatewayApp(
        routes=routes, lifespan=lifespan, middleware=[Middleware(RequestLogMiddleware)]
    )
    install_error_handlers(app)
    app.state.gateway = state
    return app


# The SSE routes (`GET` only) that `GatewayApp` serves without the middleware stack.
SSE_ENDPOINTS = frozenset(
    {subscriber.stream_run, langgraph.join_stream, session_feed.stream_session}
)


class GatewayApp(Starlette):
    """Starlette with a short path for the SSE `GET` routes.

    An idle SSE response is what a process holds thousands of, suspended for minutes:
    each frame of the call chain above it (Starlette's error middleware, the request log
    middleware, the exception middleware, the router, the route's request wrapper and
    their `send` closures) stays allocated for its lifetime. For a `GET` whose first
    matching route is an SSE route, `__call__` does what that chain does in one frame:
    the same route match and scope keys, the request id and log line (`observe`), the
    app's exception handlers (the one error boundary, `errors.py`) and the plain 500
    for anything else. Everything else, and a `debug` app, takes the normal stack.
    """

    _handlers: tuple[dict[Any, ExceptionHandler], dict[int, ExceptionHandler]] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and not self.debug:
            path: str = scope["path"]
            if path.endswith(("/stream", "/join")):
                matched = _first_full_match(self.router.routes, scope)
                if matched is not None and getattr(matched[0], "endpoint", None) in SSE_ENDPOINTS:
                    await self._serve_sse(scope, receive, send, *matched)
                    return
        await super().__call__(scope, receive, send)

    def _exception_handlers(
        self,
    ) -> tuple[dict[Any, ExceptionHandler], dict[int, ExceptionHandler]]:
        """The handlers of the stack's `ExceptionMiddleware` (built on first use)."""
        if self._handlers is None:
            if self.middleware_stack is None:
                self.middleware_stack = self.build_middleware_stack()
            layer: Any = self.middleware_stack
            while not isinstance(layer, ExceptionMiddleware):
                layer = layer.app
            self._handlers = (layer._exception_handlers, layer._status_handlers)
        return self._handlers

    async def _serve_sse(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        route: BaseRoute,
        child_scope: Any,
    ) -> None:
        # Starlette.__call__, ExceptionMiddleware and Router.app: the same scope keys.
        scope["app"] = self
        handlers = scope["starlette.exception_handlers"] = self._exception_handlers()
        scope.setdefault("router", self.router)
        scope["route"] = route
        scope.update(child_scope)
        sender = begin_request(scope, send)  # RequestLogMiddleware
        try:
            try:
                try:
                    response = await child_scope["endpoint"](Request(scope, receive, sender))
                    await response(scope, receive, sender)
                except Exception as exc:  # the route's wrap_app_handling_exceptions
                    handler = None
                    if isinstance(exc, HTTPException):
                        handler = handlers[1].get(exc.status_code)
                    if handler is None:
                        handler = _lookup_exception_handler(handlers[0], exc)
                    if handler is None:
                        raise
                    if sender.started:
                        raise RuntimeError(
                            "Caught handled exception, but response already started."
                        ) from exc
                    request: Any = Request(scope, receive, sender)
                    if is_async_callable(handler):
                        response = await handler(request, exc)
                    else:
                        response = await run_in_threadpool(handler, request, exc)
                    if response is not None:
                        await response(scope, receive, sender)
                    exc.__traceback__ = None
            except Exception:
                sender.failed()
                raise
            finally:
                sender.finished()
        except Exception:
            if not sender.started:  # ServerErrorMiddleware: a plain 500, then re-raise
                await PlainTextResponse("Internal Server Error", status_code=500)(
                    scope, receive, send
                )
            raise


def _first_full_match(routes: list[BaseRoute], scope: Scope) -> tuple[BaseRoute, Any] | None:
    """The route the router would pick when one matches fully (`Router.app`)."""
    for route in routes:
        match, child_scope = route.matches(scope)
        if match is Match.FULL:
            return route, child_scope
    return None


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
