"""What a lone token costs Redis, in commands (`INFO commandstats` on a server of its own:
EVALSHA and every command its script runs): the fence (TIME, HMGET), the XADD, the
record's one HSET and the notification; a turn record's text waits in the log until a
fold is due, so it adds none (and every read of the record still has it). The
END check reads the run's record, not the log's tail, unless the legacy END scan is on;
and a run whose record says it ended, or whose log was removed, is still answered right
by that check."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from uuid import uuid4

import anyio
import pytest
from redis.asyncio import Redis

from gateway.bridge.base import StreamBridge
from gateway.bridge.provider import open_bridge
from gateway.errors import StreamEnded
from gateway.sessions.provider import session_store_for
from gateway.settings import Settings
from gateway.values import End, StreamEvent
from tests.support.redis_servers import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

TOKENS = 20


@asynccontextmanager
async def bridge_on(url: str, legacy_scan: bool) -> AsyncIterator[StreamBridge]:
    settings = Settings(
        redis_url=url,
        redis_key_prefix=f"b-{uuid4().hex[:8]}:",
        legacy_end_scan_enabled=legacy_scan,
    )
    async with open_bridge(settings) as bridge:
        yield bridge


async def commands_per_token(
    url: str, *, session: bool, numbered: bool, legacy_scan: bool = False
) -> dict[str, float]:
    """Commands per lone token after the first (which finds the log), by name."""
    async with bridge_on(url, legacy_scan) as bridge:
        run_id = f"r-{uuid4().hex[:8]}"
        claim = await bridge.claim(run_id, session_id="s-1" if session else None)
        token = claim.token

        async def one(n: int) -> None:
            await bridge.publish_many(
                run_id,
                [("token", {"text": "x"})],
                producer_token=token,
                seq=n if numbered else None,
            )

        await one(1)
        client = Redis.from_url(url)
        try:
            before = await client.info("commandstats")
            for n in range(2, TOKENS + 2):
                await one(n)
            after = await client.info("commandstats")
        finally:
            await client.aclose()
    counts: dict[str, float] = {}
    for name, stats in after.items():
        calls = int(stats["calls"]) - int(before.get(name, {}).get("calls", 0))
        if name == "cmdstat_info":
            calls -= 1  # the test's own
        if calls:
            counts[name.removeprefix("cmdstat_")] = calls / TOKENS
    return counts


async def test_a_lone_token_costs_six_commands(fresh_redis: RedisServer) -> None:
    with anyio.fail_after(50):
        for numbered in (False, True):
            counts = await commands_per_token(fresh_redis.url, session=False, numbered=numbered)
            assert counts == {
                "evalsha": 1,
                "time": 1,
                "hmget": 1,
                "xadd": 1,
                "hset": 1,
                "spublish": 1,
            }, numbered


async def test_a_turn_record_costs_a_token_no_command(fresh_redis: RedisServer) -> None:
    # its text waits in the log until a fold is due (turn_fold.lua: every 64 entries)
    with anyio.fail_after(50):
        counts = await commands_per_token(fresh_redis.url, session=True, numbered=True)
    assert counts == {
        "evalsha": 1,
        "time": 1,
        "hmget": 1,
        "xadd": 1,
        "hset": 1,
        "spublish": 1,
    }


async def test_the_deferred_text_is_in_every_read(fresh_redis: RedisServer) -> None:
    settings = Settings(redis_url=fresh_redis.url, redis_key_prefix=f"b-{uuid4().hex[:8]}:")
    with anyio.fail_after(50):
        async with open_bridge(settings) as bridge:
            store = session_store_for(bridge, settings)
            run_id = f"r-{uuid4().hex[:8]}"
            token = (await bridge.claim(run_id, session_id="s-2")).token
            text = ""

            async def token_of(n: int) -> None:
                nonlocal text
                piece = f"{n} "
                await bridge.publish(run_id, "token", {"text": piece}, producer_token=token)
                text += piece

            for n in range(100):  # one fold at 64 pending entries, 36 left pending
                await token_of(n)
            (turn,) = await store.list_turns("s-2")
            assert turn["text"] == text
            for n in range(100, 120):  # a read after every token folds it
                await token_of(n)
                await bridge.publish(run_id, "tok", n, producer_token=token)  # no text
                (turn,) = await store.list_turns("s-2")
                assert turn["text"] == text
            for n in range(120, 130):  # pending when the log is removed
                await token_of(n)
            await bridge.cleanup(run_id)  # the log removed: its text stays in the record
            (turn,) = await store.list_turns("s-2")
            assert turn["text"] == text


async def test_text_a_log_loses_before_its_fold_marks_the_record_truncated(
    fresh_redis: RedisServer,
) -> None:
    """A log removed outside the scripts (a `DEL` by hand, eviction) takes the text still
    pending in it: the record's next read says it is truncated rather than pass off
    the folded text as the whole answer. Without the count check it would not."""
    prefix = f"b-{uuid4().hex[:8]}:"
    settings = Settings(redis_url=fresh_redis.url, redis_key_prefix=prefix)
    with anyio.fail_after(50):
        async with open_bridge(settings) as bridge:
            store = session_store_for(bridge, settings)
            run_id = f"r-{uuid4().hex[:8]}"
            token = (await bridge.claim(run_id, session_id="s-4")).token
            await bridge.publish(run_id, "token", {"text": "kept "}, producer_token=token)
            (turn,) = await store.list_turns("s-4")  # folded by this read
            assert turn["text"] == "kept " and not turn["truncated"]
            for n in range(5):  # pending: no fold is due yet
                await bridge.publish(run_id, "token", {"text": f"{n} "}, producer_token=token)
            with fresh_redis.client() as raw:
                assert raw.delete(f"{prefix}{{{run_id}}}:log") == 1
            (turn,) = await store.list_turns("s-4")
            assert turn["text"] == "kept "
            assert turn["truncated"] is True


async def test_the_legacy_scan_keeps_the_tail_read(fresh_redis: RedisServer) -> None:
    with anyio.fail_after(50):
        counts = await commands_per_token(
            fresh_redis.url, session=False, numbered=False, legacy_scan=True
        )
    assert counts.get("xrevrange") == 1
    assert sum(counts.values()) == 7


async def _read_all(bridge: StreamBridge, run_id: str, after: str | None) -> list[Any]:
    items: list[Any] = []
    async for item in bridge.subscribe(run_id, last_event_id=after):
        items.append(item)
        if not isinstance(item, StreamEvent):
            break
    return items


@pytest.mark.parametrize("legacy_scan", [False, True], ids=["scan-off", "scan-on"])
async def test_the_record_answers_end_and_a_removed_log(
    fresh_redis: RedisServer, legacy_scan: bool
) -> None:
    with anyio.fail_after(50):
        async with bridge_on(fresh_redis.url, legacy_scan=legacy_scan) as bridge:
            run_id = f"r-{uuid4().hex[:8]}"
            token = (await bridge.claim(run_id)).token
            first = await bridge.publish(run_id, "token", 1, producer_token=token)
            # the log removed under the live producer: the next id follows every id
            # handed out, and a reader resuming at the old one gets a gap, not a skip
            await bridge.cleanup(run_id)
            second = await bridge.publish(run_id, "token", 2, producer_token=token)
            assert tuple(map(int, second.ids[0].split("-"))) > tuple(
                map(int, first.ids[0].split("-"))
            )
            end = await bridge.publish_end(run_id, "success", producer_token=token)
            with pytest.raises(StreamEnded):
                await bridge.publish(run_id, "token", 3, producer_token=token)
            items = await _read_all(bridge, run_id, second.ids[0])
            assert isinstance(items[-1], End) and items[-1].id == end.id
            # the ended run's log gone (expired, evicted), its record kept: still ended
            # (a guard: the scripts before 7c8cfca refused this too, with another END id,
            # which the bridge does not pass on)
            with fresh_redis.client() as raw:
                (log,) = [k for k in raw.keys(f"*{{{run_id}}}:log")]
                assert raw.delete(log) == 1
            with pytest.raises(StreamEnded):
                await bridge.publish(run_id, "token", 4, producer_token=token)
