"""A saturated connection pool serves its callers in turn: with far more concurrent
writers than connections, every write waits its turn and none is starved past the
command timeout (redis-py's pool alone lets a caller that just released a connection
take it straight back, ahead of the callers woken for it)."""

from __future__ import annotations

import anyio
import pytest

from gateway.bridge.provider import open_bridge
from gateway.settings import Settings

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

WRITERS = 40
WRITES = 250


async def test_writers_beyond_the_pool_size_all_get_their_turn(
    redis_url: str, key_prefix: str
) -> None:
    settings = Settings(
        redis_url=redis_url,
        redis_key_prefix=key_prefix,
        redis_max_connections=2,
        redis_command_timeout_seconds=0.5,
    )
    failures: list[BaseException] = []
    async with open_bridge(settings) as bridge:
        claims = [await bridge.claim(f"pool-{i}", lease_seconds=60) for i in range(WRITERS)]

        async def writer(index: int) -> None:
            token = claims[index].token
            for n in range(WRITES):
                try:
                    await bridge.publish(f"pool-{index}", "token", n, producer_token=token)
                except Exception as exc:  # the assertion below reports them
                    failures.append(exc)
                    return

        started = anyio.current_time()
        async with anyio.create_task_group() as tg:
            for index in range(WRITERS):
                tg.start_soon(writer, index)
        took = anyio.current_time() - started
    # The test only means something when the writes took longer than the timeout.
    assert took > settings.redis_command_timeout_seconds, took
    assert failures == []
