"""A saturated connection pool serves its callers in turn: with far more concurrent
writers than connections, every write waits its turn and none is starved past the
command timeout (redis-py's pool alone lets a caller that just released a connection
take it straight back, ahead of the callers woken for it)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import httpx
import pytest
from redis.asyncio import Redis

from gateway.bridge.base import StreamBridge
from gateway.bridge.provider import open_bridge
from gateway.sessions.provider import session_store_for
from gateway.settings import Settings
from gateway.values import End
from tests.support.http_server import make_settings, serve
from tests.support.redis_servers import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

WRITERS = 40
WRITES = 600


async def test_writers_beyond_the_pool_size_all_get_their_turn(
    redis_url: str, key_prefix: str
) -> None:
    settings = Settings(
        redis_url=redis_url,
        redis_key_prefix=key_prefix,
        redis_max_connections=2,
        redis_command_timeout_seconds=0.25,
        group_commit=False,  # (the passes are under test: one per write, not per batch)
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
    settings = Settings(redis_url=redis_url, redis_key_prefix=key_prefix, redis_max_connections=2)
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


async def test_a_script_cut_off_on_its_kept_connection_leaves_no_reply_for_the_next(
    redis_url: str, key_prefix: str
) -> None:
    """Scripts keep their connection between turns. One cancelled while Redis holds it
    (paused writes) must not leave its reply to be read as the next script's: the next
    publish, on the same connection (the last one given back is the next one taken),
    must get its own id back."""
    settings = Settings(redis_url=redis_url, redis_key_prefix=key_prefix, redis_max_connections=2)
    raw = Redis.from_url(redis_url)
    try:
        async with open_bridge(settings) as bridge:
            token = (await bridge.claim("cut-1")).token
            first = await bridge.publish("cut-1", "e", 0, producer_token=token)
            await raw.client_pause(10_000, all=False)  # holds writes, and so scripts
            try:
                with anyio.move_on_after(0.3) as waited:
                    await bridge.publish("cut-1", "e", 1, producer_token=token)
                assert waited.cancelled_caught  # it was cut off while Redis held it
            finally:
                await raw.client_unpause()
            with anyio.fail_after(10):
                after = await bridge.publish("cut-1", "e", 2, producer_token=token)
            log = await raw.xrange(f"{key_prefix}{{cut-1}}:log")
        # The cut-off publish may or may not have run (its connection was closed while
        # Redis held it, which here discards it); either way the next publish's reply
        # is its own: the id of the entry holding 2.
        data = [entry[1][b"d"] for entry in log]
        assert data in ([b"0", b"2"], [b"0", b"1", b"2"])
        assert after.ids == (log[-1][0].decode(),)
        assert first.ids == (log[0][0].decode(),)
    finally:
        await raw.aclose()


async def test_a_connection_the_server_closed_is_never_used_again(
    redis_server_factory: Callable[..., RedisServer], key_prefix: str
) -> None:
    """A connection the server closed while it was idle (a restart, the server's idle
    `timeout`; here CLIENT KILL) is replaced before a command goes out on it, whether a
    script kept it or the pool hands it out: the write succeeds, where sending it on the
    dead connection would fail it with a 503 (a write is never re-sent after it may
    have run), and so do a readiness ping and a session read (neither is retried)."""
    server = redis_server_factory()
    settings = Settings(redis_url=server.url, redis_key_prefix=key_prefix)
    raw = Redis.from_url(server.url)
    try:
        async with open_bridge(settings) as bridge:
            store = session_store_for(bridge, settings)
            token = (await bridge.claim("closed-1", session_id="closed-s")).token
            await bridge.publish("closed-1", "e", 0, producer_token=token)
            await bridge.ping()
            await store.list_turns("closed-s")
            # Every command connection, not the notifier's (pub/sub) nor this one. The
            # server closes them before it answers, so their end has reached the
            # gateway's loop by the time this returns.
            killed = await raw.client_kill_filter(_type="normal", skipme=True)
            assert killed >= 2  # a kept one and a pooled one
            with anyio.fail_after(10):
                result = await bridge.publish("closed-1", "e", 1, producer_token=token)
                await bridge.ping()
                await store.list_turns("closed-s")
            log = await raw.xrange(f"{key_prefix}{{closed-1}}:log")
        assert [entry[1][b"d"] for entry in log] == [b"0", b"1"]
        assert result.ids == (log[1][0].decode(),)
    finally:
        await raw.aclose()


async def test_connections_follow_the_load_one_follower_and_a_producer_hold_four(
    fresh_redis: RedisServer, key_prefix: str
) -> None:
    """The pool opens connections as concurrency needs them (a burst may open many, up to
    its size) and closes those unused for `redis_idle_connection_seconds`: a gateway
    whose load is one producer and one follower holds at most 4 Redis connections (its
    scripts' and client calls', and the notifier's pub/sub one), counted by the server
    (CLIENT LIST; the server is this test's alone)."""
    settings = Settings(
        redis_url=fresh_redis.url, redis_key_prefix=key_prefix, redis_idle_connection_seconds=0.3
    )
    raw = Redis.from_url(fresh_redis.url, client_name="test-admin")

    async def held() -> int:
        return sum(1 for c in await raw.client_list() if c.get("name") != "test-admin")

    try:
        async with open_bridge(settings) as bridge:
            ended = (await bridge.claim("burst", lease_seconds=60)).token
            for n in range(5):
                await bridge.publish("burst", "e", n, producer_token=ended)
            await bridge.publish_end("burst", "success", producer_token=ended)

            async def resume() -> None:
                async for item in bridge.subscribe("burst", "0-0"):
                    if isinstance(item, End):
                        return

            # A burst: 40 resumes and 40 run lookups at once.
            async with anyio.create_task_group() as tg:
                for _ in range(40):
                    tg.start_soon(resume)
                    tg.start_soon(bridge.get_run, "burst")
            burst = await held()
            assert burst > 8, burst  # it opened what the burst needed

            token = (await bridge.claim("steady", lease_seconds=60)).token
            got: list[str] = []

            async def follow() -> None:
                async for item in bridge.subscribe("steady"):
                    if isinstance(item, End):
                        return
                    got.append(item.id)  # type: ignore[union-attr]

            sent: list[str] = []
            samples: list[int] = []
            with anyio.fail_after(20):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(follow)
                    # The steady load until the burst's connections are closed, then on.
                    while len(samples) < 10:
                        for _ in range(10):
                            ids = (await bridge.publish("steady", "e", 0, producer_token=token)).ids
                            sent.extend(ids)
                            await anyio.sleep(0.005)  # the producer's pace, not a wait
                        count = await held()
                        if count <= 4 or samples:
                            samples.append(count)
                    await bridge.publish_end("steady", "success", producer_token=token)
        assert max(samples) <= 4, (burst, samples)
        assert got == sent
    finally:
        await raw.aclose()


async def publish(bridge: StreamBridge, run_id: str, token: str, value: int) -> None:
    await bridge.publish(run_id, "e", value, producer_token=token)


async def test_closing_idle_connections_gives_their_places_back_to_the_pool(
    fresh_redis: RedisServer, key_prefix: str
) -> None:
    """Connections a burst opened and the load no longer uses are closed, and the pool
    gets each one's place back: bursts and quiet spells, one after another, never leave
    a caller without a connection (redis-py's MaxConnectionsError, a 503). Before, a kept
    connection was closed while the pool still counted it as handed out, so after one
    burst and one quiet spell the next burst found the pool full."""
    idle = 0.2
    settings = Settings(
        redis_url=fresh_redis.url,
        redis_key_prefix=key_prefix,
        redis_max_connections=4,
        redis_idle_connection_seconds=idle,
    )
    raw = Redis.from_url(fresh_redis.url, client_name="test-admin")
    try:
        async with open_bridge(settings) as bridge:
            runs = [f"idle-{n}" for n in range(8)]
            tokens = [(await bridge.claim(run_id, lease_seconds=60)).token for run_id in runs]
            with anyio.fail_after(20):
                for cycle in range(4):
                    # A burst: more scripts at once than the pool has connections, so
                    # every one of its 4 places is opened.
                    async with anyio.create_task_group() as tg:
                        for run_id, token in zip(runs, tokens, strict=True):
                            tg.start_soon(publish, bridge, run_id, token, cycle)
                    # A quiet spell longer than the idle limit (the feature is a time
                    # limit: this waits it out), then one call, whose turn's end closes
                    # the connections left unused.
                    await anyio.sleep(idle * 1.5)
                    assert await bridge.get_run(runs[0]) is not None
            held = [c for c in await raw.client_list() if c.get("name") != "test-admin"]
            assert len(held) <= 3, held  # the bursts' connections were closed meanwhile
            for run_id in runs:
                info = await bridge.get_run(run_id)
                assert info is not None and info.last_event_id is not None
    finally:
        await raw.aclose()


def test_a_gateway_serving_one_follower_and_one_producer_holds_four_connections(
    fresh_redis: RedisServer, key_prefix: str
) -> None:
    """The same over HTTP: a gateway (its bridge, session store and notifier) that served
    a burst of lookups, then one SSE follower and one producer POSTing tokens, holds at
    most 4 Redis connections (CLIENT LIST on a private server; this test's own clients
    are left out)."""
    settings = make_settings(
        "redis", fresh_redis.url, key_prefix, redis_idle_connection_seconds=0.3
    )

    async def steady(base_url: str, raw: Redis) -> tuple[list[int], int, int]:
        async def held() -> int:
            return sum(1 for c in await raw.client_list() if c.get("name") != "test-admin")

        async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
            claimed = await http.post("/v1/runs", json={"run_id": "http-steady"})
            headers = {"X-Producer-Token": claimed.json()["producer_token"]}
            received = 0

            async def follow() -> None:
                nonlocal received
                async with http.stream("GET", "/v1/runs/http-steady/stream") as response:
                    async for line in response.aiter_lines():
                        if line.startswith("event: end"):
                            return
                        received += line.startswith("event: token")

            sent, samples = 0, []
            async with anyio.create_task_group() as tg:
                tg.start_soon(follow)
                while len(samples) < 10:
                    for _ in range(10):
                        await http.post(
                            "/v1/runs/http-steady/events",
                            json={"event": "token", "data": sent},
                            headers=headers,
                        )
                        sent += 1
                        await anyio.sleep(0.005)  # the producer's pace, not a wait
                    count = await held()
                    if count <= 4 or samples:
                        samples.append(count)
                await http.post(
                    "/v1/runs/http-steady/end", json={"status": "success"}, headers=headers
                )
        return samples, sent, received

    async def run() -> tuple[list[int], int, int]:
        raw = Redis.from_url(fresh_redis.url, client_name="test-admin")
        try:
            with anyio.fail_after(30):
                return await steady(server.base_url, raw)
        finally:
            await raw.aclose()

    with serve(settings, "redis") as server, fresh_redis.client() as admin:

        async def burst() -> None:
            # On the server's loop, all at once: each takes a connection of its own.
            async with anyio.create_task_group() as tg:
                for _ in range(40):
                    tg.start_soon(server.state.bridge.get_run, "nothing-here")

        server.call(burst)
        opened = len(admin.client_list()) - 1  # (this client's own)
        samples, sent, received = anyio.run(run)
    assert opened > 4, opened  # the burst needed more than the steady load does
    assert max(samples) <= 4, (opened, samples)
    assert received == sent


async def test_a_storm_of_cold_resumes_opens_a_few_connections_not_the_pool(
    fresh_redis: RedisServer, key_prefix: str
) -> None:
    """100 resumes of 100 runs at once on a fresh process: a script turn that finds no
    idle connection while `CONNECTING_AT_ONCE` are being opened waits for the next one
    given back, so the reads pipeline on a few connections instead of opening the whole
    pool (64, each three handshake round trips); every resume is still exact."""
    settings = Settings(redis_url=fresh_redis.url, redis_key_prefix=key_prefix)
    runs = 100
    async with open_bridge(settings) as writer:
        ended: dict[str, list[str]] = {}
        for index in range(runs):
            token = (await writer.claim(f"storm-{index}", lease_seconds=60)).token
            written = await writer.publish_many(
                f"storm-{index}", [("e", n) for n in range(30)], producer_token=token
            )
            await writer.publish_end(f"storm-{index}", "success", producer_token=token)
            ended[f"storm-{index}"] = list(written.ids)
    raw = Redis.from_url(fresh_redis.url, client_name="test-admin")
    try:
        async with open_bridge(settings) as bridge:  # the fresh process
            got: dict[str, list[str]] = {}

            async def resume(run_id: str) -> None:
                ids: list[str] = []
                async for item in bridge.subscribe(run_id, ended[run_id][9]):
                    if isinstance(item, End):
                        break
                    ids.append(item.id)  # type: ignore[union-attr]
                got[run_id] = ids

            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    for run_id in ended:
                        tg.start_soon(resume, run_id)
            held = sum(1 for c in await raw.client_list() if c.get("name") != "test-admin")
    finally:
        await raw.aclose()
    assert got == {run_id: ids[10:] for run_id, ids in ended.items()}
    assert held <= 16, held  # the notifier's + the storm's; the pool holds 64
