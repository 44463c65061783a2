"""Real eviction: a Redis with `--maxmemory` and `volatile-lru` evicts run logs and run
records while producers keep writing. Readers reconnecting with old cursors get the
exact events after their cursor or a gap; never a silent skip. Readiness and the
startup log say the policy is unsafe."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import pytest

from gateway.bridge.provider import open_bridge
from gateway.errors import BackendUnavailable, ProducerFenced
from gateway.settings import Settings
from gateway.values import End, Heartbeat, StreamEvent, StreamGap
from tests.support.http_server import make_settings, serve
from tests.support.redis_servers import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

RUNS = 60
ROUNDS = 8
BATCH = 10
PAYLOAD = "x" * 2_000


async def _read_after(bridge: Any, run_id: str, cursor: str) -> list[Any]:
    """Items after `cursor` until a terminal item or the reader idles (caught up)."""
    out: list[Any] = []
    it = bridge.subscribe(run_id, cursor, heartbeat_interval=0.3)
    try:
        async for item in it:
            if isinstance(item, Heartbeat):
                return out
            out.append(item)
            if isinstance(item, End | StreamGap):
                return out
    finally:
        await it.aclose()
    return out


async def test_readers_of_evicted_logs_get_gaps_never_silent_partials(
    redis_server_factory: Callable[..., RedisServer], key_prefix: str
) -> None:
    server = redis_server_factory("--maxmemory", "4mb", "--maxmemory-policy", "volatile-lru")
    settings = Settings(redis_url=server.url, redis_key_prefix=key_prefix, max_events_per_run=50)
    accepted: dict[str, list[str]] = {}
    async with open_bridge(settings) as bridge:
        tokens = {}
        for n in range(RUNS):
            run_id = f"ev-{n}"
            tokens[run_id] = (await bridge.claim(run_id)).token
            accepted[run_id] = []
        with anyio.fail_after(90):
            for _ in range(ROUNDS):
                for run_id, token in list(tokens.items()):
                    batch = [("e", {"p": PAYLOAD}) for _ in range(BATCH)]
                    try:
                        result = await bridge.publish_many(run_id, batch, producer_token=token)
                    except (ProducerFenced, BackendUnavailable):
                        del tokens[run_id]  # its record was evicted (or Redis is full)
                        continue
                    accepted[run_id] += result.ids
        with server.client() as raw:
            evicted = int(raw.info("stats")["evicted_keys"])
        assert evicted > 0, "the test needs real evictions"

        checked = gaps = 0
        with anyio.fail_after(60):
            for run_id, log in accepted.items():
                if await bridge.get_run(run_id) is None:
                    continue  # log and record evicted: the run is unknown (HTTP 404)
                for cursor in log[:: max(1, len(log) // 4)][:4]:
                    items = await _read_after(bridge, run_id, cursor)
                    start = log.index(cursor) + 1
                    events = [i.id for i in items if isinstance(i, StreamEvent)]
                    assert events == log[start : start + len(events)], (
                        f"{run_id}: a silent skip after {cursor}: {events[:3]}..."
                    )
                    if items and isinstance(items[-1], StreamGap):
                        gaps += 1
                    elif start + len(events) < len(log):
                        # Caught up short of what was written: only a gap may say so.
                        raise AssertionError(f"{run_id}: partial replay after {cursor}")
                    checked += 1
        assert checked > 0 and gaps > 0


async def test_readiness_and_startup_warn_of_an_evicting_redis(
    redis_server_factory: Callable[..., RedisServer],
    key_prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = redis_server_factory("--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru")
    caplog.set_level(logging.WARNING)
    with serve(make_settings("redis", server.url, key_prefix), "redis") as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as client:
            body = (await client.get("/readyz")).json()
    assert body["status"] == "ready"
    assert [w["maxmemory_policy"] for w in body["warnings"]] == [["allkeys-lru"]]
    assert any("maxmemory-policy" in r.getMessage() for r in caplog.records)


async def test_readiness_has_no_warning_under_noeviction(redis_url: str, key_prefix: str) -> None:
    with serve(make_settings("redis", redis_url, key_prefix), "redis") as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as client:
            body = (await client.get("/readyz")).json()
    assert body == {"status": "ready"}
