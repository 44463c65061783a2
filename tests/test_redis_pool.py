"""A saturated connection pool serves its callers in turn: with far more concurrent
writers than connections, every write waits its turn and none is starved past the
command timeout (redis-py's pool alone lets a caller that just released a connection
take it straight back, ahead of the callers woken for it)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest

from gateway.bridge.provider import open_bridge
from gateway.sessions.provider import session_store_for
from gateway.settings import Settings
from gateway.values import End

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


async def test_every_caller_takes_a_turn_so_the_plain_pool_never_runs_out(
    redis_url: str, key_prefix: str
) -> None:
    """The pool is never waited on (it refuses a caller beyond its size at once): writers,
    readers replaying from Redis, run lookups and the session store, all at once on two
    connections, every one of them gets its turn and none is refused."""
    settings = Settings(
        redis_url=redis_url, redis_key_prefix=key_prefix, redis_max_connections=2
    )
    runs, events = 10, 40
    failures: list[BaseException] = []
    async with open_bridge(settings) as bridge:
        store = session_store_for(bridge, settings)
        tokens = [(await bridge.claim(f"mix-{i}", session_id=f"s-{i}")).token for i in range(runs)]

        async def writer(index: int) -> None:
            for n in range(events):
                await bridge.publish(f"mix-{index}", "e", n, producer_token=tokens[index])
            await bridge.publish_end(f"mix-{index}", "success", producer_token=tokens[index])

        async def reader(index: int) -> None:
            seen = 0
            async for item in bridge.subscribe(f"mix-{index}", "0-0"):
                if isinstance(item, End):
                    break
                seen += 1
            assert seen == events

        async def looker(index: int) -> None:
            for _ in range(events):
                await bridge.get_run(f"mix-{index}")
                await store.list_turns(f"s-{index}")

        async def guarded(job: Callable[[int], Awaitable[None]], index: int) -> None:
            try:
                await job(index)
            except Exception as exc:  # the assertion below reports them
                failures.append(exc)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for index in range(runs):
                    for job in (reader, reader, writer, looker):
                        tg.start_soon(guarded, job, index)
    assert failures == []
