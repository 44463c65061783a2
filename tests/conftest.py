"""Shared pytest fixtures: anyio backend and real Redis servers (never fakes).

Fixtures
- ``anyio_backend`` (session): "asyncio"; async tests use ``@pytest.mark.anyio``.
- ``redis_server`` (session): a ``RedisServer`` started for the test session, or an
  ``ExternalRedis`` when env ``REDIS_URL`` is set (that one is never flushed: isolate
  by ``key_prefix``), or, opt-in with ``REDIS_TESTCONTAINERS=1`` where a Docker engine
  is reachable, a testcontainers Redis. Do not stop/kill it; use ``fresh_redis`` for that.
- ``redis_url`` (session): ``redis_server.url``.
- ``redis_cluster`` (session, lazy): a 3-master/3-replica ``RedisCluster``; only
  started when a test asks for it. Mark such tests ``@pytest.mark.cluster``.
- ``fresh_redis`` (function): a private ``RedisServer`` the test may stop/kill/restart.
- ``redis_server_factory`` (function): ``factory(*extra_args) -> RedisServer`` (started);
  all servers it made are closed after the test.
- ``key_prefix`` (function): unique per test, e.g. ``"t1a2b3c4d:"``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from uuid import uuid4

import pytest

from tests.support.redis_servers import ExternalRedis, RedisCluster, RedisServer

# The slow end-to-end tests live in tests/system/ (real browsers, proxies, worker
# processes, fault injection, hostile clients, Node clients); a test that needs the Redis
# Cluster is one wherever it lives. `make test-fast` runs everything else
# (`-m "not system"`); CI runs all.
SYSTEM_DIR = Path(__file__).resolve().parent / "system"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SYSTEM_DIR in item.path.parents or item.get_closest_marker("cluster"):
            item.add_marker(pytest.mark.system)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer | ExternalRedis]:
    url = os.environ.get("REDIS_URL")
    if url:
        yield ExternalRedis(url)
        return
    if os.environ.get("REDIS_TESTCONTAINERS") == "1":
        # Opt-in, where a Docker engine is reachable (none is on the CI machines): the
        # design names testcontainers. `pip install testcontainers[redis]` first.
        from testcontainers.redis import RedisContainer

        with RedisContainer("redis:7") as container:
            host = container.get_container_host_ip()
            port = container.get_exposed_port(6379)
            yield ExternalRedis(f"redis://{host}:{port}/0")
        return
    server = RedisServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer | ExternalRedis) -> str:
    return redis_server.url


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    cluster = RedisCluster(masters=3, replicas=1)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def fresh_redis() -> Iterator[RedisServer]:
    server = RedisServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture
def redis_server_factory() -> Iterator[Callable[..., RedisServer]]:
    made: list[RedisServer] = []

    def factory(*extra_args: str) -> RedisServer:
        server = RedisServer(*extra_args)
        made.append(server)
        return server.start()

    try:
        yield factory
    finally:
        for server in made:
            server.close()


@pytest.fixture
def key_prefix() -> str:
    return f"t{uuid4().hex[:8]}:"


# ---------------------------------------------------------------------------------------
# Bridge fixtures (make_bridge, ...) go below this line — owned by the bridge engineer.
# ---------------------------------------------------------------------------------------

import contextlib  # noqa: E402  (kept in the bridge-fixture region)
from collections.abc import AsyncIterator  # noqa: E402
from typing import Any  # noqa: E402

BRIDGE_HEARTBEAT_SECONDS = 0.5  # small, so readers notice removal/close within a test


class BridgeFactory:
    """``make_bridge(**settings_overrides)``: an async context manager entering
    ``open_bridge(Settings(...))`` for this test's backend (``.backend``: "memory" or
    "redis"; ``.redis_url``: None on memory). Keys are namespaced by ``key_prefix``."""

    def __init__(self, backend: str, redis_url: str | None, key_prefix: str) -> None:
        self.backend = backend
        self.redis_url = redis_url
        self.key_prefix = key_prefix

    def settings(self, **overrides: Any) -> Any:
        from gateway.settings import Settings

        values: dict[str, Any] = {
            "redis_url": self.redis_url,
            "redis_key_prefix": self.key_prefix,
            "heartbeat_interval_seconds": BRIDGE_HEARTBEAT_SECONDS,
        }
        values.update(overrides)
        return Settings(**values)

    @contextlib.asynccontextmanager
    async def __call__(self, **overrides: Any) -> AsyncIterator[Any]:
        from gateway.bridge.provider import open_bridge

        async with open_bridge(self.settings(**overrides)) as bridge:
            yield bridge


@pytest.fixture(params=["memory", "redis"])
def make_bridge(request: pytest.FixtureRequest, key_prefix: str) -> BridgeFactory:
    backend = str(request.param)
    # Only the Redis backend needs (and starts) a redis-server.
    url = request.getfixturevalue("redis_url") if backend == "redis" else None
    return BridgeFactory(backend, url, key_prefix)


@pytest.fixture
async def bridge(make_bridge: BridgeFactory) -> AsyncIterator[Any]:
    async with make_bridge() as b:
        yield b
