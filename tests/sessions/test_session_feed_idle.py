"""An idle session feed costs Redis nothing per feed, and no crash can lose the news of a
turn: the claim's own first step (`session_claim.lua`) announces it, and a retirement's
step announces that, so feeds wait on the announcement and never poll."""

from __future__ import annotations

import contextlib

import anyio
import httpx
import pytest

from gateway.redis.session_hints import SessionHints
from tests.sessions.test_session_feed import assert_turn, open_feed, turn
from tests.support.http_server import make_settings, serve
from tests.support.redis_servers import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

FEEDS = 8
HEARTBEAT = 0.2


def command_calls(redis: RedisServer) -> dict[str, int]:
    with redis.client() as admin:
        stats = admin.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}
    for own in ("info", "config|resetstat", "hello"):  # this test's; a connection's handshake
        calls.pop(own, None)
    return calls


async def test_idle_feeds_send_redis_no_command_per_interval(
    fresh_redis: RedisServer, key_prefix: str
) -> None:
    settings = make_settings(
        "redis", fresh_redis.url, key_prefix, heartbeat_interval_seconds=HEARTBEAT
    )
    with serve(settings, "redis") as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as c:
            await turn(c, "idle", "idle-r1", ["a"])  # a session with an ended turn
            async with contextlib.AsyncExitStack() as stack:
                feeds = [
                    await stack.enter_async_context(open_feed(c, "idle")) for _ in range(FEEDS)
                ]
                with anyio.fail_after(20):
                    for feed in feeds:  # every feed has read the turns and waits
                        await feed.heartbeat()
                    with fresh_redis.client() as admin:
                        admin.config_resetstat()
                    for _ in range(5):  # five heartbeat intervals of every feed
                        for feed in feeds:
                            await feed.heartbeat()
                assert command_calls(fresh_redis) == {}  # not one command, whatever FEEDS


async def test_a_turn_reaches_the_feeds_though_its_gateway_announced_nothing(
    fresh_redis: RedisServer, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claiming gateway dies before its own announcement (here: it never makes it);
    a feed on another gateway opens the turn at once, not at a heartbeat (30 s)."""

    async def silent(self: SessionHints, session_id: str, stamp: str) -> None:
        return None

    settings = make_settings("redis", fresh_redis.url, key_prefix, heartbeat_interval_seconds=30)
    with serve(settings, "redis") as reader, serve(settings, "redis") as writer:
        async with (
            httpx.AsyncClient(base_url=reader.base_url, timeout=10) as r,
            httpx.AsyncClient(base_url=writer.base_url, timeout=10) as w,
            open_feed(r, "quiet") as feed,
        ):
            monkeypatch.setattr(SessionHints, "opened", silent)
            with anyio.fail_after(10):  # well under the 30 s heartbeat
                await turn(w, "quiet", "quiet-r1", ["a"])
                got = await feed.events(1)
            assert_turn(got[0], "quiet-r1")
