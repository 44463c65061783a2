"""What a resume costs Redis: reconnecting with a cursor to a run that has ended reads
the log once (its own read from the cursor, which reaches the END, with no tail lookup
before it), with no second read
to bring the shared feed up to date, since nothing will take from it, and subscribes to
no notifications, since nothing can follow an END. A reader of an ended log that finds
something to wait for after all (the log removed and written again) subscribes then."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import anyio
import httpx
import pytest

from gateway.bridge.base import StreamBridge
from gateway.bridge.provider import open_bridge
from gateway.redis.fanout import SHARED_READ_SECONDS
from gateway.redis.keys import run_keys
from gateway.settings import Settings
from gateway.values import End, StreamEvent
from tests.support.http_server import make_settings, serve
from tests.support.redis_servers import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


def _quiet(server: RedisServer, key_prefix: str) -> Settings:
    # Heartbeats 30 s apart: a reader that did not subscribe would hear of a change only
    # at its next heartbeat's check, long after each test's timeout.
    return Settings(
        redis_url=server.url, redis_key_prefix=key_prefix, heartbeat_interval_seconds=30
    )


async def _ended_run(bridge: StreamBridge, run_id: str, events: int) -> list[str]:
    """A run of `events` token events and its END; the events' ids."""
    claim = await bridge.claim(run_id, lease_seconds=60)
    ids = [
        (await bridge.publish(run_id, "token", n, producer_token=claim.token)).ids[0]
        for n in range(events)
    ]
    await bridge.publish_end(run_id, "success", producer_token=claim.token)
    return ids


async def _subscribed(server: RedisServer, channel: str) -> None:
    """Until a reader has subscribed `channel` (a state of the server: polled)."""
    with server.client() as raw:
        while not raw.pubsub_shardnumsub(channel)[0][1]:
            await asyncio.sleep(0.01)


async def _next_written_while_waiting(
    server: RedisServer, key_prefix: str, bridge: StreamBridge, sub: Any, run_id: str, token: str
) -> tuple[str, Any]:
    """Ask for the subscription's next item; once its reader waits subscribed (so only a
    notification can bring it), publish one event; the event's id and the item."""
    waiting = asyncio.ensure_future(anext(sub))
    await _subscribed(server, run_keys(key_prefix, run_id).log)
    (written,) = (await bridge.publish(run_id, "token", "later", producer_token=token)).ids
    return written, await waiting


async def test_a_resume_of_an_ended_run_reads_the_log_once(
    fresh_redis: RedisServer, key_prefix: str
) -> None:
    settings = Settings(redis_url=fresh_redis.url, redis_key_prefix=key_prefix)
    async with open_bridge(settings) as bridge:
        ids = await _ended_run(bridge, "resumed", 30)
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
    assert "cmdstat_ssubscribe" not in stats and "cmdstat_sunsubscribe" not in stats, stats
    # ... and that read is the whole resume: no tail lookup before it.
    assert "cmdstat_xrevrange" not in stats, stats["cmdstat_xrevrange"]


async def test_a_reader_of_an_ended_log_written_again_subscribes_and_follows_it(
    fresh_redis: RedisServer, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _quiet(fresh_redis, key_prefix)
    async with open_bridge(settings) as bridge:
        await _ended_run(bridge, "again", 1)
        written: list[str] = []
        reads = bridge._reads  # type: ignore[attr-defined]
        tail = reads.tail

        async def tail_then_rewrite(keys: object) -> object:
            # The reader saw the END; then the run's keys vanish (expiry, eviction) and a
            # producer starts the run afresh, before the reader's first read.
            newest = await tail(keys)
            with fresh_redis.client() as raw:
                raw.delete(*raw.keys(f"{key_prefix}*"))
            fresh = await bridge.claim("again", lease_seconds=60)
            written.append(fresh.token)
            result = await bridge.publish("again", "token", 1, producer_token=fresh.token)
            written.extend(result.ids)
            return newest

        follow = bridge.notifier.follow

        async def write_then_follow(feed: object) -> None:
            # Written before the reader's subscription: no notification of it is heard.
            unheard = await bridge.publish("again", "token", 2, producer_token=written[0])
            written.extend(unheard.ids)
            await follow(feed)  # type: ignore[arg-type]

        monkeypatch.setattr(reads, "tail", tail_then_rewrite)
        monkeypatch.setattr(bridge.notifier, "follow", write_then_follow)
        # A malformed cursor: the one reader that looks at the tail before its first read
        # (an ended log is replayed through its END, an active one followed from its tail).
        subscription = bridge.subscribe("again", "not-a-cursor")
        with anyio.fail_after(5):
            first = await anext(subscription)
            monkeypatch.setattr(reads, "tail", tail)
            second = await anext(subscription)  # read once more after subscribing
            later, third = await _next_written_while_waiting(
                fresh_redis, key_prefix, bridge, subscription, "again", written[0]
            )
        await subscription.aclose()
    assert isinstance(first, StreamEvent) and first.id == written[1]
    assert isinstance(second, StreamEvent) and second.id == written[2]
    assert isinstance(third, StreamEvent) and third.id == later


@pytest.mark.parametrize("cursor", [None, "first"])
async def test_a_reader_subscribes_after_its_first_read_and_misses_nothing_before(
    fresh_redis: RedisServer, key_prefix: str, monkeypatch: pytest.MonkeyPatch, cursor: str | None
) -> None:
    """A reader's first read tells whether the log ended; one that goes on following
    subscribes after it, and reads once more, so what was appended between its read
    and its subscription (no notification of it is heard) is delivered too."""
    settings = _quiet(fresh_redis, key_prefix)
    async with open_bridge(settings) as bridge:
        claim = await bridge.claim("live", lease_seconds=60)
        ids = [
            (await bridge.publish("live", "token", n, producer_token=claim.token)).ids[0]
            for n in range(2)
        ]
        follow = bridge.notifier.follow
        unheard: list[str] = []

        async def write_then_follow(feed: object) -> None:
            result = await bridge.publish("live", "token", 2, producer_token=claim.token)
            unheard.extend(result.ids)
            await follow(feed)  # type: ignore[arg-type]

        monkeypatch.setattr(bridge.notifier, "follow", write_then_follow)
        subscription = bridge.subscribe("live", ids[0] if cursor else None)
        got: list[str] = []
        with anyio.fail_after(5):
            while len(got) < (2 if cursor else 3):
                item = await anext(subscription)
                assert isinstance(item, StreamEvent)
                got.append(item.id)
            monkeypatch.setattr(bridge.notifier, "follow", follow)
            later, last = await _next_written_while_waiting(
                fresh_redis, key_prefix, bridge, subscription, "live", claim.token
            )
        await subscription.aclose()
    assert got == (ids[1:] if cursor else ids) + unheard
    assert isinstance(last, StreamEvent) and last.id == later


async def test_a_follower_joining_the_feed_of_an_ended_logs_reader_subscribes_it(
    fresh_redis: RedisServer, key_prefix: str
) -> None:
    # One process: a reader of the ended log holds the run's feed (unsubscribed) when the
    # log is removed and the run starts afresh; a live follower joins that feed.
    settings = _quiet(fresh_redis, key_prefix)
    async with open_bridge(settings) as bridge:
        ids = await _ended_run(bridge, "shared", 2)
        resumed = bridge.subscribe("shared", ids[0])
        with anyio.fail_after(5):
            held = await anext(resumed)  # it holds the feed until it reads on
        with fresh_redis.client() as raw:
            raw.delete(*raw.keys(f"{key_prefix}*"))
        fresh = await bridge.claim("shared", lease_seconds=60)
        start = (await bridge.publish("shared", "token", 10, producer_token=fresh.token)).ids
        follower = bridge.subscribe("shared", start[0])
        with anyio.fail_after(5):
            live, got = await _next_written_while_waiting(
                fresh_redis, key_prefix, bridge, follower, "shared", fresh.token
            )
        await follower.aclose()
        await resumed.aclose()
    assert isinstance(held, StreamEvent) and held.id == ids[1]
    assert isinstance(got, StreamEvent) and got.id == live


async def test_a_follower_waiting_for_a_runs_first_event_does_not_poll(
    fresh_redis: RedisServer, key_prefix: str
) -> None:
    settings = _quiet(fresh_redis, key_prefix)
    async with open_bridge(settings) as bridge:
        claim = await bridge.claim("quiet", lease_seconds=60)
        subscription = bridge.subscribe("quiet")
        first = asyncio.ensure_future(anext(subscription))
        with fresh_redis.client() as raw:
            raw.config_resetstat()
            await asyncio.sleep(0.5)  # the span observed: a follower with nothing to read
            # One transaction per read (`reads.Reads.read`).
            reads = raw.info("commandstats").get("cmdstat_exec", {}).get("calls", 0)
        assert not first.done()
        ids = (await bridge.publish("quiet", "token", 1, producer_token=claim.token)).ids
        with anyio.fail_after(5):
            item = await first
        await subscription.aclose()
    assert isinstance(item, StreamEvent) and item.id == ids[0]
    # Its first look, the feed's once subscribed, its own again (the first found no log,
    # so its position is not yet checked), then it waits: a poller would read on.
    assert reads <= 3, reads


async def test_a_malformed_cursor_s_first_read_is_checked_against_the_floor(
    redis_server: RedisServer, key_prefix: str
) -> None:
    """Issue #25 item 8: a malformed cursor starts at the log's live tail (a lookup of its
    own); a trim past that tail before the reader's first read is a gap, never a silent
    skip. The reader's two steps (its view's placement, its first read) are taken by hand
    so the trim lands between them."""
    from gateway.bridge import rules
    from gateway.redis.bridge import RedisStreamBridge

    settings = Settings(
        redis_url=redis_server.url, redis_key_prefix=key_prefix, max_events_per_run=3
    )
    with anyio.fail_after(20):
        async with open_bridge(settings) as bridge:
            assert isinstance(bridge, RedisStreamBridge)
            claim = await bridge.claim("malformed-floor", lease_seconds=60)
            for n in range(2):
                await bridge.publish("malformed-floor", "token", n, producer_token=claim.token)
            keys = run_keys(key_prefix, "malformed-floor")
            view = bridge._view(keys)
            # The reader's first step: placed at the log's tail.
            async with view.attached(rules.parse_start("not-a-cursor")) as (phase, position):
                assert phase is rules.Phase.SEEN and position is not None
                for n in range(2, 7):  # meanwhile: appends that trim past that tail
                    await bridge.publish("malformed-floor", "token", n, producer_token=claim.token)
                read = await view.read(position, seen=True)  # its first read
                _, decided = rules.decide(phase, position, read)
            assert isinstance(decided, rules.Missed), decided  # behind the floor: a gap


async def test_a_cold_resume_of_an_ended_run_is_one_transaction_of_plain_commands(
    fresh_redis: RedisServer, key_prefix: str
) -> None:
    """A gateway that never saw the run (a fresh process behind a load balancer) resumes
    it in one round trip: one MULTI ... EXEC with the run record's status, the log's
    bounds and the missed entries; no script (a script's reply converts every entry to a
    Lua table and back: several times the XRANGE's own cost), no subscription, no other
    command. Counted by Redis itself (INFO commandstats), so the count is exact."""
    settings = Settings(redis_url=fresh_redis.url, redis_key_prefix=key_prefix)
    async with open_bridge(settings) as writer:
        ids = await _ended_run(writer, "cold", 300)
    async with open_bridge(settings) as bridge:  # the fresh process
        with fresh_redis.client() as raw:
            raw.config_resetstat()
            got: list[str] = []
            subscription = bridge.subscribe("cold", ids[99])
            async for item in subscription:
                if isinstance(item, End):
                    break
                assert isinstance(item, StreamEvent)
                got.append(item.id)
            await subscription.aclose()
            stats = raw.info("commandstats")
    assert got == ids[100:]
    calls = {name.removeprefix("cmdstat_"): value["calls"] for name, value in stats.items()}
    # What a new pool connection sends once, before its first command, is not the
    # resume's: redis-py's handshake (HELLO, CLIENT SETINFO where Redis knows it) and the
    # bridge's INFO server (which server the connection reached: lua/entry_id.lua).
    for handshake in ("hello", "client|setinfo", "info", "config|resetstat"):
        calls.pop(handshake, None)
    assert calls == {"multi": 1, "hmget": 1, "xinfo|stream": 1, "xrange": 1, "exec": 1}, calls


async def test_a_cold_sse_resume_costs_one_round_trip_record_bounds_and_entries(
    fresh_redis: RedisServer, key_prefix: str
) -> None:
    """Over HTTP the route checks the run (404/403) before it streams: the run record
    and the subscription's first read come from one transaction (`open_stream`), so a
    gateway that never saw the run answers a resume of an ended run with one round trip
    to Redis: no lookup before the read, no script, no subscription."""
    settings = make_settings("redis", fresh_redis.url, key_prefix)
    async with open_bridge(settings) as writer:
        ids = await _ended_run(writer, "cold-http", 50)
    with serve(settings, "redis") as server, fresh_redis.client() as raw:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as http:
            await http.get("/healthz")  # the server is up; its startup calls are done
            raw.config_resetstat()
            got: list[str] = []
            with anyio.fail_after(10):
                headers = {"Last-Event-ID": ids[19]}
                async with http.stream("GET", "/v1/runs/cold-http/stream", headers=headers) as r:
                    assert r.status_code == 200
                    async for line in r.aiter_lines():
                        if line.startswith("id: "):
                            got.append(line[4:])
                        if line.startswith("event: end"):
                            break
            stats = raw.info("commandstats")
    assert got[: len(ids) - 20] == ids[20:]
    calls = {name.removeprefix("cmdstat_"): value["calls"] for name, value in stats.items()}
    for handshake in ("hello", "client|setinfo", "info", "config|resetstat"):
        calls.pop(handshake, None)
    expected = {"multi": 1, "hmget": 1, "xinfo|stream": 1, "xrevrange": 1, "time": 1, "xrange": 1}
    assert calls == {**expected, "exec": 1}, calls


async def test_a_cold_resume_of_a_live_run_has_its_replay_before_it_subscribes(
    fresh_redis: RedisServer, key_prefix: str
) -> None:
    """On a gateway that never saw the run, the replay of a live run comes from the
    one transaction (`open_stream`) with no subscription before it: when its first batch
    is handed over, the run's channel has no subscriber yet and nothing but that
    transaction reached Redis. The reader subscribes when it asks for more, and then
    follows the run."""
    settings = _quiet(fresh_redis, key_prefix)
    async with open_bridge(settings) as writer:
        claim = await writer.claim("warm", lease_seconds=60)
        ids = [
            (await writer.publish("warm", "token", n, producer_token=claim.token)).ids[0]
            for n in range(20)
        ]
        async with open_bridge(settings) as bridge:  # the fresh process
            channel = run_keys(key_prefix, "warm").log
            with fresh_redis.client() as raw:
                raw.config_resetstat()
                info, subscribe = await bridge.open_stream("warm", ids[4])
                batches = subscribe()
                with anyio.fail_after(5):
                    first = await anext(batches)
                stats = raw.info("commandstats")
                subscribers = raw.pubsub_shardnumsub(channel)[0][1]
            assert info is not None and info.last_event_id == ids[-1]
            assert [item.id for item in first] == ids[5:]  # type: ignore[union-attr]
            assert subscribers == 0
            calls = {name.removeprefix("cmdstat_") for name in stats}
            assert calls - {"hello", "client|setinfo", "info", "config|resetstat"} == {
                "multi",
                "hmget",
                "xinfo|stream",
                "xrevrange",
                "time",
                "xrange",
                "exec",
            }, stats
            try:
                with anyio.fail_after(5):
                    nxt = asyncio.ensure_future(anext(batches))
                    await _subscribed(fresh_redis, channel)
                    (later,) = (
                        await writer.publish("warm", "token", 20, producer_token=claim.token)
                    ).ids
                    got = [item for item in await nxt if isinstance(item, StreamEvent)]
            finally:
                await batches.aclose()
    assert [item.id for item in got] == [later]


async def test_a_crowd_opening_one_run_at_one_position_shares_one_transaction(
    fresh_redis: RedisServer, key_prefix: str
) -> None:
    """Clients of one run reconnecting together with the same cursor (after a deploy)
    share one `open_stream` transaction and its decoded entries, as readers of one feed
    share a read: 50 at once cost Redis one EXEC, and each gets the exact replay."""
    settings = Settings(redis_url=fresh_redis.url, redis_key_prefix=key_prefix)
    async with open_bridge(settings) as writer:
        ids = await _ended_run(writer, "crowd", 100)
    async with open_bridge(settings) as bridge:
        with fresh_redis.client() as raw:
            raw.config_resetstat()
            replays: list[list[str]] = []

            async def reconnect() -> None:
                _, subscribe = await bridge.open_stream("crowd", ids[49])
                got: list[str] = []
                batches = subscribe()
                async for batch in batches:
                    got += [item.id for item in batch if isinstance(item, StreamEvent)]
                    if isinstance(batch[-1], End):
                        break
                await batches.aclose()
                replays.append(got)

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    for _ in range(50):
                        tg.start_soon(reconnect)
            stats = raw.info("commandstats")
    assert replays == [ids[50:]] * 50
    assert stats["cmdstat_exec"]["calls"] == 1, stats["cmdstat_exec"]
    assert stats["cmdstat_xrange"]["calls"] == 1, stats["cmdstat_xrange"]


async def test_a_shared_open_of_an_ended_run_is_let_go_once_it_can_no_longer_be_shared(
    fresh_redis: RedisServer, key_prefix: str
) -> None:
    """`open_stream` keeps the read of an ended run for `SHARED_READ_SECONDS` so that a
    crowd reconnecting at once shares it, and no longer: before, it stayed referenced
    until 256 later opens pushed it out, up to 256 reads of 512 decoded events each per
    process, held however quiet the process."""
    settings = Settings(redis_url=fresh_redis.url, redis_key_prefix=key_prefix)
    async with open_bridge(settings) as writer:
        await _ended_run(writer, "let-go", 50)
    async with open_bridge(settings) as bridge:

        def held() -> int:
            gc.collect()
            return sum(1 for o in gc.get_objects() if type(o) is StreamEvent)

        before = held()
        with anyio.fail_after(10):
            _, subscribe = await bridge.open_stream("let-go", None)
            batches = subscribe()
            async for batch in batches:
                if isinstance(batch[-1], End):
                    break
            await batches.aclose()
            del subscribe, batches, batch
            with anyio.move_on_after(SHARED_READ_SECONDS * 3):
                while held() > before:
                    await asyncio.sleep(0.05)  # (a time-based expiry: polled)
        assert held() <= before
