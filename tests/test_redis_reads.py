"""What a resume costs Redis: reconnecting with a cursor to a run that has ended reads
the log once (its own read from the cursor, which reaches the END), with no second read
to bring the shared feed up to date, since nothing will take from it."""

from __future__ import annotations

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
