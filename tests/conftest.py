"""Shared pytest fixtures: anyio backend and real Redis servers (never fakes).

Fixtures
- ``anyio_backend`` (session): "asyncio"; async tests use ``@pytest.mark.anyio``.
- ``redis_server`` (session): a ``RedisServer`` started for the test session, or an
  ``ExternalRedis`` when env ``REDIS_URL`` is set (that one is never flushed: isolate
  by ``key_prefix``). Do not stop/kill it; use ``fresh_redis`` for that.
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
from uuid import uuid4

import pytest

from tests.redis_servers import ExternalRedis, RedisCluster, RedisServer


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer | ExternalRedis]:
    url = os.environ.get("REDIS_URL")
    if url:
        yield ExternalRedis(url)
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
