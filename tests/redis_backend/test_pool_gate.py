"""The passes' accounting of the Redis pool (`gateway/redis/pool.py`), on a real Redis.

redis-py's pool counts every connection it handed out against its size until it is
released. The passes keep connections for scripts checked out of it, and promise that a
caller holding a pass always finds a connection. Each test below breaks that promise
on a small pool before the fix it names: a kept connection out of both the passes' lists
and the pool's free list (closed, given back late, or being opened) left the pool full
for a caller with a pass, which then got redis-py's MaxConnectionsError (a 503).
The tests drive the passes through the bridge and read the passes' own counters only to
time a step; what they assert is what a caller sees.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable

import anyio
import pytest

from gateway.bridge.provider import open_bridge
from gateway.redis.bridge import RedisStreamBridge
from gateway.redis.pool import PoolGate
from gateway.redis.wire import pack
from gateway.settings import Settings

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

IDLE = 0.2  # the idle limit of these tests' pools (seconds)


def settings(redis_url: str, key_prefix: str, size: int, idle: float = IDLE) -> Settings:
    return Settings(
        redis_url=redis_url,
        redis_key_prefix=key_prefix,
        redis_max_connections=size,
        redis_idle_connection_seconds=idle,
    )


async def until(condition: object) -> None:
    """Until `condition()` holds, checking once per loop iteration (it changes only when
    another task runs)."""
    with anyio.fail_after(10):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0)


async def outcome(call: Awaitable[object]) -> str:
    try:
        await call
    except Exception as exc:  # what a caller would get
        return f"{type(exc).__name__}: {exc}"
    return "ok"


async def kept_idle(gate: PoolGate, count: int) -> None:
    """Open `count` kept connections at once (script passes), then leave them idle."""
    opened = asyncio.Event()
    inside = 0

    async def one() -> None:
        nonlocal inside
        async with gate.connection() as held:
            await held.execute(pack("PING"))
            inside += 1
            if inside == count:
                opened.set()
            await opened.wait()

    async with anyio.create_task_group() as tg:
        for _ in range(count):
            tg.start_soon(one)


@pytest.fixture
async def bridge4(redis_url: str, key_prefix: str) -> AsyncIterator[RedisStreamBridge]:
    async with open_bridge(settings(redis_url, key_prefix, 4)) as bridge:
        assert isinstance(bridge, RedisStreamBridge)
        yield bridge


async def test_a_caller_cancelled_while_its_turn_closes_idle_connections_loses_none(
    bridge4: RedisStreamBridge,
) -> None:
    """A pass's end closes the connections unused for the idle limit. When that pass's
    caller is cancelled meanwhile (an SSE client gone), every one of them still goes
    back to the pool: bursts after it get every connection the pool has."""
    gate = bridge4.gate
    runs = [f"cancel-{n}" for n in range(8)]
    tokens = [(await bridge4.claim(run_id, lease_seconds=60)).token for run_id in runs]
    outcomes: list[str] = []

    async def publish(index: int, value: int) -> None:
        call = bridge4.publish(runs[index], "e", value, producer_token=tokens[index])
        outcomes.append(await outcome(call))

    for cycle in range(3):
        outcomes.clear()
        async with anyio.create_task_group() as tg:  # a burst: every connection opened
            for index in range(8):
                tg.start_soon(publish, index, cycle)
        assert outcomes == ["ok"] * 8, (cycle, outcomes)
        await anyio.sleep(IDLE * 1.5)  # a quiet spell past the idle limit (time is the input)
        with anyio.CancelScope() as scope:

            async def cancel_while_closing() -> None:
                await until(lambda: gate._checking)
                scope.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_while_closing)
                tg.start_soon(publish, 0, 100 + cycle)
        assert scope.cancelled_caught


async def test_a_client_call_while_a_script_opens_a_connection_finds_one(
    redis_url: str, key_prefix: str
) -> None:
    """A connection being opened for a script is the pool's already: a client call
    that starts then counts it, and gives an idle kept connection back to make room."""
    async with open_bridge(settings(redis_url, key_prefix, 2, idle=60.0)) as bridge:
        assert isinstance(bridge, RedisStreamBridge)
        gate = bridge.gate
        await bridge.claim("opening", lease_seconds=60)
        first_may_end = asyncio.Event()

        async def holding() -> None:
            async with gate.connection() as held:
                await held.execute(pack("PING"))
                await first_may_end.wait()

        async def opening() -> None:
            async with gate.connection() as held:
                await held.execute(pack("PING"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(holding)
            await until(lambda: gate._kept == 1)
            tg.start_soon(opening)
            await until(lambda: gate._connecting == 1)
            first_may_end.set()  # its connection is idle while the other is being opened
            await until(lambda: gate._idle)
            assert await outcome(bridge.get_run("opening")) == "ok"


async def test_calls_ready_while_idle_connections_go_back_find_a_connection(
    redis_url: str, key_prefix: str
) -> None:
    """Idle connections given back to the pool are counted as handed out until the pool
    has them: a call that runs in between (ready in the same loop iteration) waits for
    that, instead of finding the pool full."""
    async with open_bridge(settings(redis_url, key_prefix, 2)) as bridge:
        assert isinstance(bridge, RedisStreamBridge)
        gate = bridge.gate
        loop = asyncio.get_running_loop()
        token = (await bridge.claim("ready", lease_seconds=60)).token
        for calls in (
            lambda: [bridge.ping()],  # a client call
            lambda: [  # two writes: one takes the idle kept connection, one opens one
                bridge.publish("ready", "e", 1, producer_token=token),
                bridge.publish("ready", "e", 2, producer_token=token),
            ],
        ):
            await kept_idle(gate, 2)
            await anyio.sleep(IDLE * 1.5)  # both idle past the limit (time is the input)
            tasks = []
            async with gate.connection() as held:  # takes one; its end closes the other
                await held.execute(pack("PING"))
                tasks = [loop.create_task(outcome(call)) for call in calls()]
            assert await asyncio.gather(*tasks) == ["ok"] * len(tasks)
