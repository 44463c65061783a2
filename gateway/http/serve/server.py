"""`GatewayServer`: a uvicorn server that drains SSE responses when it shuts down.

uvicorn waits for open connections to finish before it runs the lifespan shutdown, and
it never tells a streaming response that the server is exiting. This subclass drains
the gateway app first (SSE responses end cleanly, `/wait` answers 202), so clients
reconnect elsewhere with `Last-Event-ID` and uvicorn's graceful wait completes at once.
"""

from __future__ import annotations

import socket
from typing import Any

import uvicorn
from starlette.applications import Starlette

from ...settings import Settings
from ..app import drain
from .connections import GatewayHttpProtocol


def server_config(app: Starlette, settings: Settings, **options: Any) -> uvicorn.Config:
    """The uvicorn configuration the gateway runs under: `settings.host`/`port` (unless
    given in `options`) and the request-head and connection limits of `connections.py`."""
    options.setdefault("host", settings.host)
    options.setdefault("port", settings.port)
    # The gateway never reads a request's client address or scheme, so uvicorn's rewrite
    # of them from X-Forwarded-* (a middleware frame and an address parse per request)
    # is off; turn it on here if something comes to depend on them behind a proxy.
    options.setdefault("proxy_headers", False)
    return uvicorn.Config(
        app,
        http=GatewayHttpProtocol.configured(settings),
        **options,
    )


class GatewayServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: Starlette | None = None) -> None:
        super().__init__(config)
        self._gateway_app = app if app is not None else _find_app(config.app)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._gateway_app is not None:
            drain(self._gateway_app)
        await super().shutdown(sockets)


def _find_app(app: object) -> Starlette | None:
    if isinstance(app, Starlette) and hasattr(app.state, "gateway"):
        return app
    return None
