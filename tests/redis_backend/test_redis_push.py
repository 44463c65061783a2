"""Notifications carry what was appended: a gateway whose readers are caught up delivers
new events without reading the log from Redis (one read at attach, none per change).
A notification that does not follow the local copy (a gap in what was heard) still
makes readers read, so nothing is skipped."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

from gateway.bridge.provider import open_bridge
from gateway.settings import Settings
from gateway.values import Heartbeat, StreamEvent
from tests.support.redis_servers import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


def xinfo_calls(server: RedisServer) -> int:
    """read.lua's XINFO STREAM: one per read of a log (publishing never calls it)."""
    with server.client() as raw:
        stats = raw.info("commandstats")
    return int(stats.get("cmdstat_xinfo|stream", stats.get("cmdstat_xinfo", {})).get("calls", 0))


async def test_caught_up_readers_take_pushed_events_without_reading(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    server = redis_server_factory()
    settings = Settings(redis_url=server.url, heartbeat_interval_seconds=5)
    async with open_bridge(settings) as bridge:
        token = (await bridge.claim("r")).token
        first = (await bridge.publish("r", "e", 0, producer_token=token)).ids
        it = bridge.subscribe("r")
        with anyio.fail_after(10):
            assert isinstance(await anext(it), StreamEvent)  # replayed: caught up now
            before = xinfo_calls(server)
            ids = list(first)
            for n in range(1, 51):
                ids += (await bridge.publish("r", "e", n, producer_token=token)).ids
                item = await anext(it)
                assert isinstance(item, StreamEvent) and item.id == ids[-1]
        reads = xinfo_calls(server) - before
        await it.aclose()
    assert reads <= 2, f"{reads} reads of the log for 50 pushed events"


async def test_a_notification_missed_by_the_feed_makes_it_read(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    server = redis_server_factory()
    settings = Settings(redis_url=server.url, heartbeat_interval_seconds=0.3)
    async with open_bridge(settings) as bridge:
        token = (await bridge.claim("r")).token
        ids = list((await bridge.publish("r", "e", 0, producer_token=token)).ids)
        it = bridge.subscribe("r")
        with anyio.fail_after(10):
            assert isinstance(await anext(it), StreamEvent)
            # Appended behind the notifier's back: no notification for these two.
            with server.client() as raw:
                log = "gw:{r}:log"
                ids.append(raw.xadd(log, {"e": "e", "d": "1"}).decode())
                ids.append(raw.xadd(log, {"e": "e", "d": "2"}).decode())
            ids += (await bridge.publish("r", "e", 3, producer_token=token)).ids
            got = []
            while len(got) < 3:
                item = await anext(it)
                if not isinstance(item, Heartbeat):
                    got.append(item.id)  # type: ignore[union-attr]
        await it.aclose()
    assert got == ids[1:]
