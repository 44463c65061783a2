"""An overlap's reply costs Redis the same whatever the size of the events it names.

A numbered append that starts 1,000 numbers below the next expected one (a 60-byte
request) is answered from the run's record of recent ids (lua/publish.lua), never by
reading those events back from the log: measured with Redis's own accounting of the
script's time (`INFO commandstats`, `cmdstat_evalsha`) on a server of its own, with
1 KiB and with 128 KiB events. Reading them back cost ~1 s of Redis time at 128 KiB."""

from __future__ import annotations

from uuid import uuid4

import anyio
import pytest
from redis.asyncio import Redis

from gateway.bridge.provider import open_bridge
from gateway.settings import Settings
from tests.support.redis_servers import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

BACK = 1000  # the look-back limit: the furthest an overlap is answered
CALLS = 20


async def script_usec_per_overlap(url: str, event_bytes: int) -> float:
    """Redis time (µs) of one reply to a 1-event batch `BACK` numbers below the next."""
    settings = Settings(redis_url=url, redis_key_prefix=f"cost-{uuid4().hex[:8]}:")
    payload = "x" * event_bytes
    async with open_bridge(settings) as bridge:
        run_id = f"cost-{event_bytes}"
        tok = (await bridge.claim(run_id, lease_seconds=60)).token
        seq = 1
        while seq <= BACK:  # batches of varied sizes, as a streamed append makes them
            size = min(1 + seq % 7, BACK + 1 - seq)
            events = [("tok", {"n": n, "p": payload}) for n in range(seq, seq + size)]
            await bridge.publish_many(run_id, events, producer_token=tok, seq=seq)
            seq += size
        first = await bridge.publish_many(run_id, [("tok", 0)], producer_token=tok, seq=1)
        assert first.duplicate
        client = Redis.from_url(url)
        try:
            await client.config_resetstat()
            for _ in range(CALLS):
                again = await bridge.publish_many(run_id, [("tok", 0)], producer_token=tok, seq=1)
                assert again.duplicate and again.ids == first.ids
            stats = await client.info("commandstats")
        finally:
            await client.aclose()
    evalsha = stats["cmdstat_evalsha"]
    assert int(evalsha["calls"]) == CALLS
    return float(evalsha["usec"]) / CALLS


async def test_an_overlap_reply_costs_the_same_with_large_events(
    fresh_redis: RedisServer,
) -> None:
    with anyio.fail_after(100):
        small = await script_usec_per_overlap(fresh_redis.url, 1024)
        large = await script_usec_per_overlap(fresh_redis.url, 128 * 1024)
    # Reading the events back made it ~100x (and ~1 s); the record makes it equal, give
    # or take the noise of a shared machine.
    assert large < 3 * small + 100, (small, large)
