"""The per-process change notifier (Redis sharded pub/sub) never loses a run: a feed
attached while the pub/sub connection is down (reconnecting) is subscribed once it is back.

"While down" is a state the test creates, not a timing it hopes for: the notifier's real
client (to a real Redis) fails its SSUBSCRIBE calls, as a dropped connection does, until
the test lets them through.
"""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest
from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from gateway.redis.keys import run_keys
from gateway.redis.notifier import Notifier, OneServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


class FailingPubSub(PubSub):
    down: asyncio.Event  # set: SSUBSCRIBE fails

    async def ssubscribe(self, *args: Any, **kwargs: Any) -> None:
        if self.down.is_set():
            raise redis_errors.ConnectionError("connection lost (test)")
        await super().ssubscribe(*args, **kwargs)


class FlakyRedis(Redis):
    down: asyncio.Event

    def pubsub(self, **kwargs: Any) -> PubSub:
        pubsub = FailingPubSub(self.connection_pool, **kwargs)
        pubsub.down = self.down
        return pubsub


async def test_a_feed_attached_while_the_connection_is_down_is_subscribed_when_back(
    redis_url: str, key_prefix: str
) -> None:
    down = asyncio.Event()

    def connect() -> Redis:
        client = FlakyRedis.from_url(redis_url)
        client.down = down
        return client

    notifier = Notifier(OneServer(connect), window=64)
    keys = run_keys(key_prefix, "late-run")
    warm = run_keys(key_prefix, "warm-run")
    async with (
        Redis.from_url(redis_url) as raw,
        anyio.create_task_group() as tg,
    ):
        await tg.start(notifier.run)
        async with notifier.attach(warm, "0-0") as other:
            # Once this feed hears a notification, the listener has nothing to retry and
            # waits for the next message: a failed SSUBSCRIBE must not wait for one.
            other.stale = False
            with anyio.fail_after(5):
                while not other.stale:
                    await raw.spublish(warm.log, b"")
                    await anyio.sleep(0.05)
            down.set()
            async with notifier.attach(keys, "0-0") as feed:  # its SSUBSCRIBE fails
                down.clear()
                feed.stale = False
                for _ in range(2):  # (re-subscribing marks it stale once: then notifications)
                    with anyio.fail_after(5):
                        while not feed.stale:
                            await raw.spublish(keys.log, b"")
                            await anyio.sleep(0.05)
                    feed.stale = False
        tg.cancel_scope.cancel()
