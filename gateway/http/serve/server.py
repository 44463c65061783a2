"""`GatewayServer`: a uvicorn server that drains SSE responses when it shuts down.

uvicorn waits for open connections to finish before it runs the lifespan shutdown, and
it never tells a streaming response that the server is exiting. This subclass drains
the gateway app first (SSE responses end cleanly, `/wait` answers 202), so clients
reconnect elsewhere with `Last-Event-ID` and uvicorn's graceful wait completes at once.

It also ticks once a second instead of ten times: uvicorn's main loop wakes every 0.1 s
to see whether it was told to exit (and once a second to refresh the `Date` header).
Those wake-ups were most of an idle process's CPU and, at 100 tokens/s, about a
twentieth of a streamed token's; here setting `should_exit` wakes the loop at once.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any, Final

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


# uvicorn's tick counter counts tenths of a second (`on_tick` refreshes the `Date` header
# when it is a multiple of 10): one tick of ours is ten of its.
TICK_SECONDS: Final = 1.0
_TICKS_PER_TICK: Final = 10
_TICK_WRAP: Final = 864_000  # where uvicorn wraps its counter


class GatewayServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: Starlette | None = None) -> None:
        self._should_exit = False
        # The main loop's current wait, set while it waits (a signal handler or another
        # thread may ask the server to exit: `call_soon_threadsafe`).
        self._tick: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
        super().__init__(config)
        self._gateway_app = app if app is not None else _find_app(config.app)

    @property
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._should_exit = value
        tick = self._tick
        if value and tick is not None:
            loop, waiter = tick
            if not loop.is_closed():
                loop.call_soon_threadsafe(_wake, waiter)

    async def main_loop(self) -> None:
        """uvicorn's main loop, one tick a second, woken early by `should_exit`."""
        loop = asyncio.get_running_loop()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + _TICKS_PER_TICK) % _TICK_WRAP
            waiter: asyncio.Future[None] = loop.create_future()
            self._tick = (loop, waiter)
            timer = loop.call_later(TICK_SECONDS, _wake, waiter)
            try:
                if not self._should_exit:  # (set before this wait could be woken)
                    await waiter
            finally:
                self._tick = None
                timer.cancel()
            should_exit = await self.on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._gateway_app is not None:
            drain(self._gateway_app)
        await super().shutdown(sockets)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _find_app(app: object) -> Starlette | None:
    if isinstance(app, Starlette) and hasattr(app.state, "gateway"):
        return app
    return None
