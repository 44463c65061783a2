"""Group commit (`gateway/redis/group.py`) on a real Redis: the write scripts of many runs
that arrive while others are on the wire go out together, and each caller still gets
exactly its own reply or its own error; a flushed script is loaded and sent again; every
event is appended once, in its run's order."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from gateway.bridge.provider import open_bridge
from gateway.errors import BackendUnavailable, ProducerFenced
from gateway.redis.bridge import RedisStreamBridge
from gateway.settings import Settings
from gateway.timing.deadlines import DEADLINE_RESOLUTION
from tests.support.redis_servers import RedisServer
from tests.support.stall import stalled

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

RUNS = 40
EVENTS = 25


def _settings(server: RedisServer, key_prefix: str, **extra: Any) -> Settings:
    return Settings(redis_url=server.url, redis_key_prefix=key_prefix, **extra)


async def _stream_all(bridge: RedisStreamBridge, tokens: list[str]) -> list[list[str]]:
    """Every run appends EVENTS events, one at a time (a streamed append's pace), all runs
    at once; the ids each was acknowledged."""
    acked: list[list[str]] = [[] for _ in tokens]

    async def run(index: int) -> None:
        for n in range(EVENTS):
            result = await bridge.publish(f"g{index}", "t", n, producer_token=tokens[index])
            acked[index].extend(result.ids)

    async with anyio.create_task_group() as tg:
        for index in range(len(tokens)):
            tg.start_soon(run, index)
    return acked


async def test_concurrent_runs_share_writes_and_each_gets_its_own_ids(
    fresh_redis: RedisServer, key_prefix: str
) -> None:
    async with open_bridge(_settings(fresh_redis, key_prefix)) as bridge:
        assert isinstance(bridge, RedisStreamBridge)
        tokens = [(await bridge.claim(f"g{i}", lease_seconds=60)).token for i in range(RUNS)]
        await bridge.ensure_scripts()  # (so that no NOSCRIPT reply is counted below)
        with fresh_redis.client() as raw:
            raw.config_resetstat()
        group = bridge.calls.group
        batches, scripts = group.batches, group.scripts
        with anyio.fail_after(30):
            acked = await _stream_all(bridge, tokens)
        batches, scripts = group.batches - batches, group.scripts - scripts
        with fresh_redis.client() as raw:
            calls = raw.info("commandstats")["cmdstat_evalsha"]["calls"]
            logs = [
                [entry_id.decode() for entry_id, _ in raw.xrange(f"{key_prefix}{{g{i}}}:log")]
                for i in range(RUNS)
            ]
    assert scripts == RUNS * EVENTS == calls  # each write sent once
    assert batches < scripts  # and many of them together
    for index in range(RUNS):
        assert acked[index] == logs[index]  # its own ids, in its order, nothing else
        assert len(acked[index]) == EVENTS


async def test_one_refused_write_in_a_batch_is_that_caller_s_alone(
    fresh_redis: RedisServer, key_prefix: str
) -> None:
    async with open_bridge(_settings(fresh_redis, key_prefix)) as bridge:
        tokens = [(await bridge.claim(f"g{i}", lease_seconds=60)).token for i in range(RUNS)]
        tokens[7] = "not-the-token"
        outcomes: list[object] = [None] * RUNS

        async def one(index: int) -> None:
            try:
                outcomes[index] = await bridge.publish(
                    f"g{index}", "t", 0, producer_token=tokens[index]
                )
            except ProducerFenced as exc:
                outcomes[index] = exc

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for index in range(RUNS):
                    tg.start_soon(one, index)
    assert isinstance(outcomes[7], ProducerFenced)
    assert all(not isinstance(o, Exception) for i, o in enumerate(outcomes) if i != 7)


async def test_a_flushed_script_is_loaded_again_within_the_flight(
    fresh_redis: RedisServer, key_prefix: str
) -> None:
    async with open_bridge(_settings(fresh_redis, key_prefix)) as bridge:
        assert isinstance(bridge, RedisStreamBridge)
        tokens = [(await bridge.claim(f"g{i}", lease_seconds=60)).token for i in range(RUNS)]
        with fresh_redis.client() as raw:
            raw.script_flush()
        with anyio.fail_after(30):
            acked = await _stream_all(bridge, tokens)
        with fresh_redis.client() as raw:
            lengths = [raw.xlen(f"{key_prefix}{{g{i}}}:log") for i in range(RUNS)]
    assert [len(ids) for ids in acked] == lengths == [EVENTS] * RUNS


async def test_off_every_script_goes_alone(fresh_redis: RedisServer, key_prefix: str) -> None:
    settings = _settings(fresh_redis, key_prefix, group_commit=False)
    async with open_bridge(settings) as bridge:
        assert isinstance(bridge, RedisStreamBridge)
        tokens = [(await bridge.claim(f"g{i}", lease_seconds=60)).token for i in range(4)]
        with anyio.fail_after(30):
            acked = await _stream_all(bridge, tokens)
        assert bridge.calls.group.batches == 0
    assert [len(ids) for ids in acked] == [EVENTS] * 4


async def test_a_lone_write_is_sent_by_its_caller(
    fresh_redis: RedisServer, key_prefix: str
) -> None:
    """One producer, nothing else on the wire: every write goes out at once from its
    caller's task (no hand-off to a flyer), so a lone chat pays nothing for grouping."""
    async with open_bridge(_settings(fresh_redis, key_prefix)) as bridge:
        assert isinstance(bridge, RedisStreamBridge)
        token = (await bridge.claim("lone", lease_seconds=60)).token
        group = bridge.calls.group
        alone, batches = group.alone, group.batches
        with anyio.fail_after(20):
            for n in range(10):
                await bridge.publish("lone", "t", n, producer_token=token)
        assert group.alone - alone == group.batches - batches == 10


async def test_a_stalled_batch_fails_its_callers_and_leaves_the_wire_at_its_deadline(
    redis_server_factory: Callable[..., RedisServer], key_prefix: str
) -> None:
    """Redis stops answering with writes of many runs on the wire: each caller gets
    BackendUnavailable within the command timeout, and the batches in flight are given
    up then too (their flyers free for what comes next), not when Redis wakes."""
    server = redis_server_factory("--enable-debug-command", "yes")
    timeout, runs = 0.5, 8
    settings = _settings(server, key_prefix, redis_command_timeout_seconds=timeout)
    async with open_bridge(settings) as bridge:
        assert isinstance(bridge, RedisStreamBridge)
        tokens = [(await bridge.claim(f"s{i}", lease_seconds=60)).token for i in range(runs)]
        await bridge.ensure_scripts()
        group = bridge.calls.group
        failed: list[float] = []

        async def publish(index: int) -> None:
            started = time.monotonic()
            with pytest.raises(BackendUnavailable):
                await bridge.publish(f"s{index}", "t", index, producer_token=tokens[index])
            failed.append(time.monotonic() - started)

        with stalled(server, 5.0):
            batches = group.batches
            with anyio.fail_after(3):
                async with anyio.create_task_group() as tg:
                    for index in range(runs):
                        tg.start_soon(publish, index)
            assert group.batches - batches >= 2  # one sent alone, the rest together
            with anyio.fail_after(1):  # (Redis sleeps on: only the deadline frees it)
                while group.on_wire:
                    await anyio.sleep(DEADLINE_RESOLUTION)
    assert len(failed) == runs
    assert max(failed) < timeout + 1.0, failed
