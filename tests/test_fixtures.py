"""The Redis test fixtures start real servers that behave like Redis."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import key_slot

from tests.support.redis_servers import ExternalRedis, RedisCluster, RedisServer


def test_redis_server_ping(redis_server: RedisServer | ExternalRedis) -> None:
    with redis_server.client() as client:
        assert client.ping() is True


@pytest.mark.anyio
async def test_redis_server_set_get(redis_url: str, key_prefix: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    try:
        key = f"{key_prefix}greeting"
        await client.set(key, "hello", ex=60)
        assert await client.get(key) == b"hello"
    finally:
        await client.aclose()


def test_key_prefix_is_unique(key_prefix: str) -> None:
    assert key_prefix.startswith("t") and key_prefix.endswith(":")
    assert len(key_prefix) == 10


@pytest.mark.cluster
@pytest.mark.anyio
async def test_redis_cluster_roundtrip(redis_cluster: RedisCluster, key_prefix: str) -> None:
    assert len(redis_cluster.nodes) == 6
    assert len(redis_cluster.masters) == 3
    assert len(redis_cluster.replicas) == 3
    client = AsyncRedisCluster.from_url(redis_cluster.url)
    try:
        keys = [f"{key_prefix}{{{tag}}}:k" for tag in ("a", "b", "c")]
        slots = {key_slot(k.encode()) for k in keys}
        assert len(slots) == 3
        for i, key in enumerate(keys):
            await client.set(key, f"v{i}", ex=60)
        for i, key in enumerate(keys):
            assert await client.get(key) == f"v{i}".encode()
        masters = client.get_primaries()
        assert len(masters) == 3
        # The three keys live on three different masters' slot ranges.
        owners = {client.get_node_from_key(k).name for k in keys}
        assert len(owners) == 3
    finally:
        await client.aclose()


@pytest.mark.anyio
async def test_fresh_redis_aof_survives_kill(fresh_redis: RedisServer) -> None:
    # Restart the private server with an always-fsynced AOF, write, SIGKILL, restart.
    fresh_redis.restart("--appendonly", "yes", "--appendfsync", "always")
    port = fresh_redis.port
    client = aioredis.Redis.from_url(fresh_redis.url)
    try:
        await client.set("durable", "yes")
        await client.rpush("list", "a", "b")
    finally:
        await client.aclose()

    fresh_redis.kill()
    assert not fresh_redis.running
    with pytest.raises(redis.ConnectionError):
        redis.Redis(port=port, socket_connect_timeout=1).ping()

    fresh_redis.restart()
    assert fresh_redis.port == port
    client = aioredis.Redis.from_url(fresh_redis.url)
    try:
        assert await client.get("durable") == b"yes"
        assert await client.lrange("list", 0, -1) == [b"a", b"b"]
    finally:
        await client.aclose()


def test_fresh_redis_without_aof_loses_data_on_kill(fresh_redis: RedisServer) -> None:
    with fresh_redis.client() as client:
        client.set("volatile", "1")
    fresh_redis.kill()
    fresh_redis.restart()
    with fresh_redis.client() as client:
        assert client.get("volatile") is None


def test_redis_server_factory(redis_server_factory) -> None:  # type: ignore[no-untyped-def]
    a = redis_server_factory()
    b = redis_server_factory("--maxmemory", "10mb")
    assert a.port != b.port
    with b.client() as client:
        assert client.config_get("maxmemory")["maxmemory"] == str(10 * 1024 * 1024)
    b.stop()
    assert not b.running
