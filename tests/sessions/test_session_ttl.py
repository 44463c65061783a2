"""How long a session's keys live on Redis (redis/session_keys.py): at least the run
keys' TTL plus the ended TTL after the newest claim or turn move, none while a turn is
parked, and a session whose turns are gone stops being listed. Through a real server
and a real redis-server; the short-TTL case on both backends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest
import redis.asyncio as aioredis

from gateway.redis.session_keys import session_keys
from tests.support.http_server import make_settings, serve

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

TIMEOUT = 15.0


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


async def claim(client: httpx.AsyncClient, session_id: str) -> tuple[str, dict[str, str]]:
    response = await client.post("/v1/runs", json={"session_id": session_id})
    assert response.status_code == 201, response.text
    body = response.json()
    return body["run_id"], {"X-Producer-Token": body["producer_token"]}


async def post(client: httpx.AsyncClient, path: str, headers: dict[str, str], body: Any) -> None:
    response = await client.post(path, json=body, headers=headers)
    assert response.status_code == 200, response.text


async def ttls(redis: aioredis.Redis, prefix: str, session_id: str) -> tuple[int, int]:
    keys = session_keys(prefix, session_id)
    return int(await redis.pttl(keys.meta)), int(await redis.pttl(keys.order))


async def test_session_keys_expire_unless_a_turn_is_parked(
    redis_url: str, key_prefix: str, redis_client: aioredis.Redis
) -> None:
    settings = make_settings("redis", redis_url, key_prefix)
    bound = int((settings.stream_ttl_seconds + settings.ended_ttl_seconds) * 1000)
    with serve(settings, "redis") as srv, anyio.fail_after(TIMEOUT):
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as client:
            run_id, headers = await claim(client, "ttl-1")
            for left in await ttls(redis_client, key_prefix, "ttl-1"):
                assert 0 < left <= bound, left  # a new session's keys expire
            events = f"/v1/runs/{run_id}/events"
            # Parked on the operator: the session's keys stay while it waits.
            await post(client, events, headers, {"event": "state", "data": "input-required"})
            assert await ttls(redis_client, key_prefix, "ttl-1") == (-1, -1)
            # A second turn of the session ends while the first is still parked.
            other, other_headers = await claim(client, "ttl-1")
            await post(client, f"/v1/runs/{other}/end", other_headers, {"status": "success"})
            assert await ttls(redis_client, key_prefix, "ttl-1") == (-1, -1)
            # The parked one moves on and ends: the keys expire again.
            await post(client, events, headers, {"event": "state", "data": "running"})
            await post(client, f"/v1/runs/{run_id}/end", headers, {"status": "success"})
            for left in await ttls(redis_client, key_prefix, "ttl-1"):
                assert 0 < left <= bound, left
            # Retired: the index goes, the tombstone stays ("for good").
            retired = await client.delete("/v1/sessions/ttl-1")
            assert retired.status_code == 200, retired.text
            keys = session_keys(key_prefix, "ttl-1")
            assert await ttls(redis_client, key_prefix, "ttl-1") == (-2, -2)
            assert int(await redis_client.pttl(keys.tomb)) == -1


async def test_keys_left_without_ttl_get_one_at_the_next_claim(
    redis_url: str, key_prefix: str, redis_client: aioredis.Redis
) -> None:
    """A gateway before this rule left every session's keys without TTL."""
    settings = make_settings("redis", redis_url, key_prefix)
    with serve(settings, "redis") as srv, anyio.fail_after(TIMEOUT):
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as client:
            await claim(client, "ttl-old")
            keys = session_keys(key_prefix, "ttl-old")
            await redis_client.persist(keys.meta)
            await redis_client.persist(keys.order)
            await claim(client, "ttl-old")
            for left in await ttls(redis_client, key_prefix, "ttl-old"):
                assert left > 0, left


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_a_session_whose_turns_are_gone_is_not_listed(
    backend: str, request: pytest.FixtureRequest, key_prefix: str
) -> None:
    url = request.getfixturevalue("redis_url") if backend == "redis" else None
    settings = make_settings(
        backend, url, key_prefix, stream_ttl_seconds=1.0, ended_ttl_seconds=0.5
    )
    with serve(settings, backend) as srv, anyio.fail_after(TIMEOUT):
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as client:
            run_id, headers = await claim(client, "ttl-gone")
            await post(client, f"/v1/runs/{run_id}/end", headers, {"status": "success"})

            async def listed() -> bool:
                response = await client.get("/v1/sessions")
                assert response.status_code == 200, response.text
                return "ttl-gone" in {row["session_id"] for row in response.json()["sessions"]}

            assert await listed()
            while await listed():  # until the keys expire (the deadline above bounds it)
                await anyio.sleep(0.1)
            turns = await client.get("/v1/sessions/ttl-gone/turns")
            assert turns.status_code == 200 and turns.json()["turns"] == []
