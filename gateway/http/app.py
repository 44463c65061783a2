"""The Starlette application: `create_app(settings, bridge=None)`.

The lifespan opens the bridge with `open_bridge(settings)` unless one is passed in
(then the caller owns and closes it), and owns one anyio task group for background
work (the producer-liveness monitor). On exit it drains open SSE responses and waits,
then cancels the task group; bridge teardown is shielded inside the provider.

`app.state.gateway` is the `GatewayState` (bridge, settings, subscription registry,
metrics, authenticator). `RequestLogMiddleware` (`observe.py`) wraps every route: request
ids and one log line per request; the lifespan logs `startup`, `drain` and `shutdown`.
Call `drain(app)` (or use `gateway.http.server.GatewayServer`)
when the server starts shutting down, so SSE responses end cleanly before uvicorn waits
for connections to close.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..bridge.base import StreamBridge
from ..bridge.provider import open_bridge
from ..sessions.provider import session_store_for
from ..settings import Settings
from . import langgraph, operator, ops, producer, sessions_routes, subscriber
from .auth import Authenticator
from .errors import install_error_handlers
from .liveness import monitor
from .metrics import Metrics
from .observe import RequestLogMiddleware, lifecycle
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
        *ops.routes,
        Route("/openapi.json", _openapi, methods=["GET"], include_in_schema=False),
        Route("/", _console, methods=["GET"], include_in_schema=False),
        Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, middleware=[Middleware(RequestLogMiddleware)])
    install_error_handlers(app)
    app.state.gateway = state
    return app


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
