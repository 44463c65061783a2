"""The redis-py hooks the gateway relies on beyond its documented API (gateway/redis/compat.py)
still have the shape relied on: a release that moves one fails here, by name."""

from __future__ import annotations

import inspect

import pytest
from redis.asyncio import Connection, ConnectionPool, Redis
from redis.asyncio.client import PubSub
from redis.driver_info import DriverInfo

from gateway.redis.compat import take_free
from gateway.redis.wire import CheckedPool

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(20)]


def params(function: object) -> set[str]:
    return set(inspect.signature(function).parameters)  # type: ignore[arg-type]


def test_connection_hooks_keep_their_shape() -> None:
    assert {"args"} <= params(Connection.pack_command)
    assert {"command", "check_health"} <= params(Connection.send_packed_command)
    assert {"timeout", "disconnect_on_error", "push_request"} <= params(Connection.read_response)
    assert callable(Connection.can_read_destructive) or callable(Connection.can_read)
    assert callable(Connection.should_reconnect)


def test_pubsub_hooks_keep_their_shape() -> None:
    assert "push_handler_func" in params(Redis.pubsub) | params(PubSub.__init__)
    assert callable(PubSub.handle_message)
    DriverInfo()  # constructible with no arguments


async def test_a_pubsub_exposes_its_connection(redis_url: str) -> None:
    client = Redis.from_url(redis_url)
    pubsub = client.pubsub()
    try:
        assert pubsub.connection is None  # made by its first subscribe
        await pubsub.subscribe("compat-probe")
        assert pubsub.connection is not None
    finally:
        await pubsub.aclose()
        await client.aclose()


async def test_take_free_takes_only_free_connections(redis_url: str) -> None:
    pool = CheckedPool.from_url(redis_url, max_connections=4)
    client = Redis(connection_pool=pool)
    try:
        first = await pool.get_connection()  # type: ignore[no-untyped-call]
        second = await pool.get_connection()  # type: ignore[no-untyped-call]
        await pool.release(first)  # free; `second` stays in use
        taken = await take_free(pool, lambda connection: True)
        assert taken == [first]
        assert await take_free(pool, lambda connection: True) == []
        await pool.release(second)
        assert await take_free(pool, lambda connection: False) == []
        for connection in (first, second):
            await connection.disconnect()
    finally:
        await client.aclose()
        await pool.disconnect()


async def test_the_private_pool_fields_exist() -> None:
    pool = ConnectionPool()
    assert isinstance(pool._available_connections, list)
    async with pool._lock:
        pass
