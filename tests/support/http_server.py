"""A real uvicorn server on a free port, in a background thread, for HTTP tests.

    with serve(settings) as srv:           # srv.base_url, srv.state, srv.call(...)
        ...

The server runs `create_app(settings)` (its lifespan opens the bridge on the server's
own event loop) under `GatewayServer`, so leaving the block exercises the graceful
drain of SSE responses. `srv.call(fn)` runs `await fn()` on the server loop and returns
its result (for reading server-side state such as the open-subscription count).
`gateway_server` is the pytest fixture: parametrized over the memory and Redis bridges.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import pytest
import uvicorn

from gateway.http.app import create_app
from gateway.http.serve.server import GatewayServer, server_config
from gateway.http.state import GatewayState
from gateway.settings import Settings

T = TypeVar("T")
START_TIMEOUT = 20.0
STOP_TIMEOUT = 20.0
HEARTBEAT_SECONDS = 0.3


class _Server(GatewayServer):
    def __init__(self, config: uvicorn.Config, app: Any) -> None:
        super().__init__(config, app)
        self.ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        try:
            await super().startup(sockets)
        finally:
            self.ready.set()


@dataclass
class RunningServer:
    base_url: str
    settings: Settings
    server: _Server
    backend: str

    @property
    def state(self) -> GatewayState:
        state: GatewayState = self.server.config.app.state.gateway
        return state

    def call(self, fn: Callable[[], Awaitable[T]], timeout: float = 10.0) -> T:
        """Run `await fn()` on the server's event loop."""
        assert self.server.loop is not None

        async def run() -> T:
            return await fn()

        return asyncio.run_coroutine_threadsafe(run(), self.server.loop).result(timeout)

    def open_sse(self) -> int:
        async def count() -> int:
            return self.state.subscriptions.open_sse

        return self.call(count)

    def wait_open_sse(self, count: int, timeout: float = 5.0) -> None:
        """Block until the server has exactly `count` open SSE responses."""
        self.call(lambda: self.state.subscriptions.wait_open_sse(count), timeout)


@contextmanager
def serve(
    settings: Settings, backend: str = "memory", *, debug: bool = False
) -> Iterator[RunningServer]:
    app = create_app(settings)
    app.debug = debug  # a debug app serves every route through Starlette's whole stack
    config = server_config(
        app,
        settings,
        host="127.0.0.1",
        port=0,
        lifespan="on",
        log_level="warning",
        timeout_graceful_shutdown=5,
    )
    server = _Server(config, app)
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    try:
        if not server.ready.wait(START_TIMEOUT) or not server.started:
            raise RuntimeError("uvicorn did not start")
        port = server.servers[0].sockets[0].getsockname()[1]
        yield RunningServer(f"http://127.0.0.1:{port}", settings, server, backend)
    finally:
        server.should_exit = True
        thread.join(STOP_TIMEOUT)
        if thread.is_alive():
            server.force_exit = True
            thread.join(STOP_TIMEOUT)


def make_settings(backend: str, redis_url: str | None, key_prefix: str, **over: Any) -> Settings:
    values: dict[str, Any] = {
        "redis_url": redis_url if backend == "redis" else None,
        "redis_key_prefix": key_prefix,
        "heartbeat_interval_seconds": HEARTBEAT_SECONDS,
    }
    values.update(over)
    return Settings(**values)


@pytest.fixture(params=["memory", "redis"])
def gateway_server(request: pytest.FixtureRequest, key_prefix: str) -> Iterator[RunningServer]:
    """A running gateway on the memory bridge and on the Redis bridge."""
    backend = str(request.param)
    url = request.getfixturevalue("redis_url") if backend == "redis" else None
    overrides: dict[str, Any] = {}
    marker = request.node.get_closest_marker("gateway_settings")
    if marker is not None:
        overrides.update(marker.kwargs)
    with serve(make_settings(backend, url, key_prefix, **overrides), backend) as srv:
        yield srv


@pytest.fixture
async def client(gateway_server: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client for `gateway_server`."""
    async with httpx.AsyncClient(base_url=gateway_server.base_url, timeout=10) as c:
        yield c


# ----------------------------------------------------------------------------- producer


@dataclass
class ProducerClient:
    """The producer API through HTTP, for tests."""

    client: httpx.AsyncClient
    run_id: str
    token: str
    session_id: str | None = None

    @classmethod
    async def claim(cls, client: httpx.AsyncClient, **body: Any) -> ProducerClient:
        response = await client.post("/v1/runs", json=body)
        assert response.status_code == 201, response.text
        claim = response.json()
        return cls(client, claim["run_id"], claim["producer_token"], claim["session_id"])

    async def publish(self, *events: tuple[str, Any]) -> list[str]:
        if len(events) == 1:
            body: Any = {"event": events[0][0], "data": events[0][1]}
        else:
            body = {"events": [{"event": name, "data": data} for name, data in events]}
        response = await self.client.post(
            f"/v1/runs/{self.run_id}/events", json=body, headers={"X-Producer-Token": self.token}
        )
        assert response.status_code == 200, response.text
        ids: list[str] = response.json()["ids"]
        return ids

    async def end(self, status: str = "success", error: Any = None) -> Any:
        body: dict[str, Any] = {"status": status}
        if error is not None:
            body["error"] = error
        response = await self.client.post(
            f"/v1/runs/{self.run_id}/end", json=body, headers={"X-Producer-Token": self.token}
        )
        assert response.status_code == 200, response.text
        return response.json()
