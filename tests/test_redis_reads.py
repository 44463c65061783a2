"""What a resume costs Redis: reconnecting with a cursor to a run that has ended reads
the log once (its own read from the cursor, which reaches the END), with no second read
to bring the shared feed up to date, since nothing will take from it."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from gateway.bridge.provider import open_bridge
from gateway.settings import Settings
from gateway.values import End, StreamEvent
from tests.redis_servers import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def test_a_resume_of_an_ended_run_reads_the_log_once(
    fresh_redis: RedisServer, key_prefix: str
) -> None:
    settings = Settings(redis_url=fresh_redis.url, redis_key_prefix=key_prefix)
    async with open_bridge(settings) as bridge:
        claim = await bridge.claim("resumed", lease_seconds=60)
        ids = [
            (await bridge.publish("resumed", "token", n, producer_token=claim.token)).ids[0]
            for n in range(30)
        ]
        await bridge.publish_end("resumed", "success", producer_token=claim.token)
        with fresh_redis.client() as raw:
            raw.config_resetstat()
            got: list[str] = []
            subscription = bridge.subscribe("resumed", ids[9])
            async for item in subscription:
                if isinstance(item, End):
                    break
                assert isinstance(item, StreamEvent)
                got.append(item.id)
            await subscription.aclose()
            stats = raw.info("commandstats")
    assert got == ids[10:]
    # read.lua runs XINFO STREAM once per read (EVALSHA may count twice: NOSCRIPT, load).
    assert stats["cmdstat_xinfo|stream"]["calls"] == 1, stats["cmdstat_xinfo|stream"]


async def test_a_follower_waiting_for_a_runs_first_event_does_not_poll(
    fresh_redis: RedisServer, key_prefix: str
) -> None:
    settings = Settings(
        redis_url=fresh_redis.url, redis_key_prefix=key_prefix, heartbeat_interval_seconds=30
    )
    async with open_bridge(settings) as bridge:
        claim = await bridge.claim("quiet", lease_seconds=60)
        subscription = bridge.subscribe("quiet")
        first = asyncio.ensure_future(anext(subscription))
        with fresh_redis.client() as raw:
            raw.config_resetstat()
            await asyncio.sleep(0.5)  # the span observed: a follower with nothing to read
            reads = raw.info("commandstats").get("cmdstat_xinfo|stream", {}).get("calls", 0)
        assert not first.done()
        ids = (await bridge.publish("quiet", "token", 1, producer_token=claim.token)).ids
        with anyio.fail_after(5):
            item = await first
        await subscription.aclose()
    assert isinstance(item, StreamEvent) and item.id == ids[0]
    assert reads <= 2, reads  # its first look (and the feed's), then it waits
