"""Faults with exact accounting: every subscriber ends with exactly the published
sequence (no loss, no duplicate, no reorder) or with an explicit gap/end, never a hang.

Real processes only: `gateway serve` processes (tests/proxies.GatewayProcess), haproxy
from deploy/haproxy.cfg (tests/proxies.Proxy) for the multi-gateway tests, on
real redis-servers that the tests kill and restart.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator

import anyio
import anyio.abc
import httpx
import pytest

from tests.support.fault_relay import FaultRelay
from tests.support.fault_tools import Follower, HttpProducer, metric, poll
from tests.support.proxies import GatewayProcess, Proxy
from tests.support.redis_servers import RedisServer

pytestmark = [pytest.mark.anyio]

AOF_ALWAYS = ("--appendonly", "yes", "--appendfsync", "always")


@pytest.fixture
def gateways() -> Iterator[Callable[..., GatewayProcess]]:
    """`gateways(redis_url, key_prefix, **kw)` starts one; all are stopped after the test."""
    made: list[GatewayProcess] = []

    def start(redis_url: str, key_prefix: str, **kw: object) -> GatewayProcess:
        gw = GatewayProcess(redis_url, key_prefix=key_prefix, **kw)  # type: ignore[arg-type]
        made.append(gw)
        return gw.start()

    try:
        yield start
    finally:
        for gw in made:
            gw.close()


def raw_log(
    redis: RedisServer, key_prefix: str, run_id: str
) -> list[tuple[str, dict[bytes, bytes]]]:
    with redis.client() as c:
        return [(i.decode(), f) for i, f in c.xrange(f"{key_prefix}{{{run_id}}}:log")]


def assert_exact(follower: Follower, producer_ids: list[str], seqs: list[int]) -> None:
    assert follower.ids == producer_ids, "loss, duplicate or reorder"
    assert follower.seqs == seqs
    assert len(set(follower.ids)) == len(follower.ids)


# ------------------------------------------------------------------------ Redis outage


@pytest.mark.timeout(90)
async def test_redis_unreachable_10s_then_exact_resume(
    redis_server_factory: Callable[..., RedisServer],
    gateways: Callable[..., GatewayProcess],
    key_prefix: str,
) -> None:
    """Redis down ~10 s: 503 backend_unavailable + Retry-After, /readyz not ready, no run
    cancelled, subscribers reconnect; afterwards delivery resumes exactly and promptly
    (the notifier reconnected: wake-ups well under one heartbeat)."""
    redis = redis_server_factory(*AOF_ALWAYS)
    heartbeat = 3.0
    gw = gateways(redis.url, key_prefix, heartbeat=heartbeat)
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as client:
        producer = await HttpProducer.claim(client, lease_seconds=120)
        for seq in range(5):
            await producer.publish_seq(seq)
        follower = Follower(lambda: client, producer.run_id)
        async with anyio.create_task_group() as tg:
            tg.start_soon(follower.run, 80.0)
            await poll("caught up", lambda: _has(follower, 5), 10)

            redis.kill()
            outage_until = time.monotonic() + 10.0
            seen_503 = ready_503 = 0
            while time.monotonic() < outage_until:  # the fault lasts 10 s; probe it meanwhile
                response = await producer.post_event(999)
                assert response.status_code == 503, response.text
                assert response.json()["error"] == "backend_unavailable"
                assert response.headers["retry-after"] == "1"
                seen_503 += 1
                ready = await client.get("/readyz")
                assert ready.status_code == 503 and ready.json()["error"] == "backend_unavailable"
                ready_503 += 1
                assert (await client.get("/healthz")).status_code == 200
                await anyio.sleep(0.25)
            assert seen_503 >= 5 and ready_503 >= 5
            redis.restart()

            await poll("ready again", lambda: _ready(client), 15)
            # Every 503 above was refused before reaching Redis: nothing was applied.
            info = (await client.get(f"/v1/runs/{producer.run_id}")).json()
            assert info["last_event_id"] == producer.ids[-1]
            assert info["cancel_requested"] is False and info["status"] == "running"
            await poll("subscriber back", lambda: _open_sse(client, 1), 20)
            # Wake-ups come from the reconnected notifier, not the heartbeat fallback.
            latencies = []
            for seq in range(5, 15):
                sent = time.monotonic()
                entry_id = await producer.publish_seq(seq)
                await poll(
                    "delivered",
                    lambda entry_id=entry_id: _arrived(follower, entry_id),
                    heartbeat + 5,
                )
                latencies.append(follower.arrivals[entry_id] - sent)
            result = await producer.end()
            assert result["deduplicated"] is False
            with anyio.fail_after(20):
                await follower.done.wait()
    assert follower.terminal is not None and follower.terminal.json()["status"] == "success"
    assert_exact(follower, producer.ids, list(range(15)))
    assert follower.connections >= 2  # it had to reconnect (or kept going, at least once)
    # The last wake-ups were immediate (the notifier is back); a heartbeat is 3 s.
    assert max(latencies[-5:]) < 1.0, latencies


async def _has(follower: Follower, n: int) -> bool:
    return len(follower.events) >= n


async def _arrived(follower: Follower, entry_id: str) -> bool:
    return entry_id in follower.arrivals


async def _ready(client: httpx.AsyncClient) -> bool:
    try:
        return (await client.get("/readyz")).status_code == 200
    except httpx.TransportError:
        return False


async def _open_sse(client: httpx.AsyncClient, n: int) -> bool:
    return await metric(client, "gateway_sse_open_subscribers") == n


# --------------------------------------------------------------- Redis restarts (AOF or not)


@pytest.mark.timeout(60)
async def test_redis_killed_and_restarted_with_aof_resumes_exactly(
    redis_server_factory: Callable[..., RedisServer],
    gateways: Callable[..., GatewayProcess],
    key_prefix: str,
) -> None:
    """kill -9 mid-stream while the producer keeps publishing; AOF (fsync always) brings
    everything back: subscribers end with exactly the published sequence."""
    redis = redis_server_factory(*AOF_ALWAYS)
    gw = gateways(redis.url, key_prefix, heartbeat=0.5)
    total = 60
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as client:
        producer = await HttpProducer.claim(client, lease_seconds=120)
        followers = [Follower(lambda: client, producer.run_id) for _ in range(3)]
        async with anyio.create_task_group() as tg:
            await producer.publish_seq(0)
            for f in followers:
                tg.start_soon(f.run, 50.0)
            for seq in range(1, total):
                if seq == total // 2:
                    redis.kill()
                    redis.restart()
                await producer.publish_seq(seq)
                await anyio.sleep(0.01)  # a realistic token pace, not synchronisation
            await producer.end()
            with anyio.fail_after(30):
                for f in followers:
                    await f.done.wait()
        run = (await client.get(f"/v1/runs/{producer.run_id}")).json()
    assert run["cancel_requested"] is False and run["status"] == "success"
    for f in followers:
        assert f.terminal is not None and f.terminal.json()["status"] == "success"
        assert_exact(f, producer.ids, list(range(total)))
    log = raw_log(redis, key_prefix, producer.run_id)
    assert [i for i, _ in log][:-1] == producer.ids  # no duplicate in Redis either


@pytest.mark.timeout(60)
async def test_redis_restarted_without_persistence_is_an_explicit_gap_never_a_hang(
    redis_server_factory: Callable[..., RedisServer],
    gateways: Callable[..., GatewayProcess],
    key_prefix: str,
) -> None:
    redis = redis_server_factory()  # no AOF, no RDB: a restart loses everything
    gw = gateways(redis.url, key_prefix, heartbeat=0.5)
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as client:
        producer = await HttpProducer.claim(client, lease_seconds=120)
        for seq in range(3):
            await producer.publish_seq(seq)
        followers = [Follower(lambda: client, producer.run_id) for _ in range(3)]
        async with anyio.create_task_group() as tg:
            for f in followers:
                tg.start_soon(f.run, 30.0)
            await poll("caught up", lambda: _all_have(followers, 3), 10)
            redis.kill()
            redis.restart()
            with anyio.fail_after(15):  # never a hang
                for f in followers:
                    await f.done.wait()
        # The producer learns it too: its run is gone, so its token is refused.
        response = await producer.post_event(3)
        assert response.status_code == 409 and response.json()["error"] == "fenced"
    print("outcomes:", [f.terminal.event if f.terminal else f.status for f in followers])
    for f in followers:
        assert f.seqs == [0, 1, 2]
        if f.terminal is not None:  # saw the removal while attached
            gap = f.terminal.json()
            assert f.terminal.event == "gap" and gap["reason"] == "stream_removed"
            assert gap["requested_event_id"] == producer.ids[-1]
        else:  # its read failed first (`unavailable`); the rejoin finds no such run
            assert f.status == 404


@pytest.mark.timeout(30)
async def test_lost_record_of_a_claimed_run_without_events_is_a_gap_not_endless_heartbeats(
    redis_server_factory: Callable[..., RedisServer],
    gateways: Callable[..., GatewayProcess],
    key_prefix: str,
) -> None:
    """The subscriber attached before the first event (no log yet, only the run record);
    Redis restarts empty. The record it saw is gone: an explicit gap, not a wait forever."""
    redis = redis_server_factory()
    gw = gateways(redis.url, key_prefix, heartbeat=0.5)
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as client:
        producer = await HttpProducer.claim(client, lease_seconds=120)
        follower = Follower(lambda: client, producer.run_id)
        async with anyio.create_task_group() as tg:
            tg.start_soon(follower.run, 20.0)
            await poll("attached", lambda: _open_sse(client, 1), 10)
            redis.kill()
            redis.restart()
            with anyio.fail_after(10):
                await follower.done.wait()
    assert follower.events == []
    if follower.terminal is not None:
        gap = follower.terminal.json()
        assert follower.terminal.event == "gap" and gap["reason"] == "stream_removed"
    else:  # a read failed during the restart; the rejoin finds no such run
        assert follower.status == 404


async def _all_have(followers: list[Follower], n: int) -> bool:
    return all(len(f.events) >= n for f in followers)


# ------------------------------------------------------------------ producer lost (3 GWs)


@pytest.mark.timeout(60)
async def test_dead_producer_gets_one_producer_lost_end_with_three_gateways_racing(
    redis_server: RedisServer,
    gateways: Callable[..., GatewayProcess],
    key_prefix: str,
) -> None:
    heartbeat, lease = 0.5, 1.0
    gws = [gateways(redis_server.url, key_prefix, heartbeat=heartbeat) for _ in range(3)]
    clients = [httpx.AsyncClient(base_url=g.url, timeout=10) for g in gws]
    try:
        producer = await HttpProducer.claim(clients[0], lease_seconds=lease)
        followers = [Follower(lambda c=c: c, producer.run_id) for c in clients for _ in range(2)]
        async with anyio.create_task_group() as tg:
            for f in followers:
                tg.start_soon(f.run, 30.0)
            await poll("attached", lambda: _all_open(clients, 2), 10)
            for seq in range(5):
                await producer.publish_seq(seq)
            died = time.monotonic()  # the producer stops here, holding its lease
            with anyio.fail_after(15):
                for f in followers:
                    await f.done.wait()
        for f in followers:
            assert f.terminal is not None and f.terminal.event == "end"
            assert f.terminal.json()["status"] == "producer_lost"
            assert_exact(f, producer.ids, list(range(5)))
        # Within about one heartbeat after the lease ran out (plus scheduling slack).
        latest = max(f.done_at for f in followers)
        assert latest - died < lease + heartbeat + 1.5, latest - died
        log = raw_log(redis_server, key_prefix, producer.run_id)
        ends = [fields for _, fields in log if b"end" in fields]
        assert ends == [{b"end": b"producer_lost"}], ends  # appended exactly once
        assert [i for i, _ in log][:-1] == producer.ids
        recovered = [await metric(c, "gateway_recovery_ends_total") for c in clients]
        assert sum(recovered) == 1, recovered
    finally:
        for c in clients:
            await c.aclose()


async def _all_open(clients: list[httpx.AsyncClient], n: int) -> bool:
    return all([await metric(c, "gateway_sse_open_subscribers") == n for c in clients])


# ---------------------------------------------------------------------- zombie producer


@pytest.mark.timeout(60)
async def test_zombie_producer_after_takeover_is_fenced_and_never_interleaves(
    redis_server: RedisServer,
    gateways: Callable[..., GatewayProcess],
    key_prefix: str,
) -> None:
    gws = [gateways(redis_server.url, key_prefix, heartbeat=0.5) for _ in range(3)]
    clients = [httpx.AsyncClient(base_url=g.url, timeout=10) for g in gws]
    try:
        old = await HttpProducer.claim(clients[0], tag="old", lease_seconds=60)
        followers = [Follower(lambda c=c: c, old.run_id) for c in clients]
        async with anyio.create_task_group() as tg:
            for f in followers:
                tg.start_soon(f.run, 40.0)
            for seq in range(5):
                await old.publish_seq(seq)
            takeover = await clients[1].post(
                "/v1/runs", json={"run_id": old.run_id, "takeover": True, "lease_seconds": 60}
            )
            assert takeover.status_code == 201, takeover.text
            assert takeover.json()["epoch"] == old.epoch + 1
            new = HttpProducer(clients[2], old.run_id, takeover.json()["producer_token"], 2, "new")
            zombie = HttpProducer(clients[0], old.run_id, old.token, old.epoch, "old")

            async def zombie_writes() -> None:
                for seq in range(100, 130):
                    response = await zombie.post_event(seq)
                    assert response.status_code == 409, response.text
                    assert response.json()["error"] == "fenced"
                    zombie.fenced.append(response)
                    lease = await clients[0].post(
                        f"/v1/runs/{old.run_id}/lease", json={}, headers=zombie.headers
                    )
                    assert lease.status_code == 409 and lease.json()["error"] == "fenced"

            async with anyio.create_task_group() as writers:
                writers.start_soon(zombie_writes)
                for seq in range(5, 35):
                    await new.publish_seq(seq)
            assert len(zombie.fenced) == 30
            zombie_end = await clients[0].post(
                f"/v1/runs/{old.run_id}/end", json={"status": "error"}, headers=zombie.headers
            )
            assert zombie_end.status_code == 409 and zombie_end.json()["error"] == "fenced"
            await new.end()
            with anyio.fail_after(15):
                for f in followers:
                    await f.done.wait()
        log = raw_log(redis_server, key_prefix, old.run_id)
        events = [(i, f) for i, f in log if b"e" in f]
        takeover_point = old.ids[-1]
        after = [f for i, f in events if i > takeover_point]
        assert all(b'"by":"new"' in f[b"d"] for f in after), "a zombie write got through"
        assert [i for i, _ in events] == old.ids + new.ids
        assert log[-1][1] == {b"end": b"success"}
        for f in followers:
            assert f.terminal is not None and f.terminal.json()["status"] == "success"
            assert_exact(f, old.ids + new.ids, list(range(35)))
    finally:
        for c in clients:
            await c.aclose()


# ---------------------------------------------------- 3 gateways behind haproxy (deploy/)


class Fleet:
    """3 gateway processes on one Redis behind haproxy; a fresh client per connection."""

    def __init__(self, gws: list[GatewayProcess], proxy: Proxy) -> None:
        self.gws = gws
        self.proxy = proxy
        self.clients: list[httpx.AsyncClient] = []

    def client(self) -> httpx.AsyncClient:
        """A new client: its own connection, so haproxy balances it on its own."""
        c = httpx.AsyncClient(base_url=self.proxy.url, timeout=10)
        self.clients.append(c)
        return c

    async def open_sse(self) -> list[float]:
        return [
            await anyio.to_thread.run_sync(g.metric, "gateway_sse_open_subscribers")
            for g in self.gws
            if g.running
        ]

    async def aclose(self) -> None:
        for c in self.clients:
            await c.aclose()


@pytest.fixture
async def fleet(
    redis_server: RedisServer, gateways: Callable[..., GatewayProcess], key_prefix: str
) -> AsyncIterator[Fleet]:
    gws = [gateways(redis_server.url, key_prefix, heartbeat=0.5) for _ in range(3)]
    with Proxy("haproxy", [g.url for g in gws]) as proxy:
        fleet = Fleet(gws, proxy)
        try:
            await poll("haproxy sees the gateways", lambda: _lb_ready(fleet), 15)
            yield fleet
        finally:
            await fleet.aclose()


async def _lb_ready(fleet: Fleet) -> bool:
    try:
        return (await fleet.client().get("/readyz")).status_code == 200
    except httpx.TransportError:
        return False


def followers_for(fleet: Fleet, run_id: str, n: int) -> list[Follower]:
    client = fleet.client()
    return [Follower(lambda: client, run_id) for _ in range(n)]


async def _spread(fleet: Fleet, n: int) -> bool:
    counts = await fleet.open_sse()
    return sum(counts) == n and all(c > 0 for c in counts)


@pytest.mark.timeout(90)
async def test_three_gateways_behind_haproxy_any_gateway_serves_any_run(fleet: Fleet) -> None:
    runs = 3
    producers = [await HttpProducer.claim(fleet.client(), lease_seconds=60) for _ in range(runs)]
    followers = {p.run_id: followers_for(fleet, p.run_id, 4) for p in producers}
    everyone = [f for fs in followers.values() for f in fs]
    async with anyio.create_task_group() as tg:
        for f in everyone:
            tg.start_soon(f.run, 60.0)
        await poll("subscribers on every gateway", lambda: _spread(fleet, len(everyone)), 15)
        for seq in range(40):
            for p in producers:
                await p.publish_seq(seq)
        for p in producers:
            await p.end()
        with anyio.fail_after(20):
            for f in everyone:
                await f.done.wait()
    for p in producers:
        for f in followers[p.run_id]:
            assert f.terminal is not None and f.terminal.json()["status"] == "success"
            assert_exact(f, p.ids, list(range(40)))
    delivered = [
        await anyio.to_thread.run_sync(g.metric, "gateway_events_delivered_total")
        for g in fleet.gws
    ]
    assert all(d > 0 for d in delivered), delivered  # every gateway served streams
    assert sum(delivered) == len(everyone) * 40


@pytest.mark.timeout(90)
@pytest.mark.parametrize("how", ["kill", "sigterm"])
async def test_gateway_lost_mid_stream_clients_continue_exactly_through_haproxy(
    fleet: Fleet, how: str
) -> None:
    """kill -9: clients see the connection drop; SIGTERM: the stream ends cleanly after a
    `: shutdown` comment. Either way they rejoin through haproxy with Last-Event-ID and
    end with exactly the published sequence."""
    producer = await HttpProducer.claim(fleet.client(), lease_seconds=60)
    followers = followers_for(fleet, producer.run_id, 9)
    total = 120
    async with anyio.create_task_group() as tg:
        for f in followers:
            tg.start_soon(f.run, 70.0)
        await poll("subscribers on every gateway", lambda: _spread(fleet, len(followers)), 15)
        victim = fleet.gws[1]
        for seq in range(total):
            if seq == total // 2:
                if how == "kill":
                    victim.kill()
                else:
                    code = await anyio.to_thread.run_sync(victim.terminate)
                    assert code == 0, victim.log()
            await producer.publish_seq(seq)
            await anyio.sleep(0.01)  # a realistic token pace, not synchronisation
        await producer.end()
        with anyio.fail_after(30):
            for f in followers:
                await f.done.wait()
    moved = [f for f in followers if f.connections > 1]
    assert moved, "no subscriber was on the lost gateway"
    for f in followers:
        assert f.terminal is not None and f.terminal.json()["status"] == "success"
        assert_exact(f, producer.ids, list(range(total)))
        assert all(1000 <= r <= 3000 for r in f.retries)
    if how == "sigterm":
        # A clean end, no dropped connection, a `retry:` hint per connection, jittered.
        for f in moved:
            assert f.shutdown_comments == 1 and f.drops == 0
        hints = [r for f in followers for r in f.retries]
        assert len(set(hints)) > 1, hints
    else:
        assert all(f.drops + f.unavailable_frames >= 1 for f in moved)


# ------------------------------------------- a write whose reply is lost is never re-sent


@pytest.mark.timeout(30)
async def test_a_publish_whose_reply_is_lost_is_reported_unavailable_not_applied_twice(
    redis_server: RedisServer, key_prefix: str
) -> None:
    """redis-py re-sends a command after a ConnectionError by default: for publish.lua
    that would append the event twice. The bridge must surface BackendUnavailable (HTTP
    503) instead, with the event applied exactly once."""
    from gateway.bridge.provider import open_bridge
    from gateway.errors import BackendUnavailable
    from gateway.settings import Settings

    dropper = FaultRelay(("127.0.0.1", redis_server.port))
    async with anyio.create_task_group() as tg:
        await tg.start(dropper.serve)
        settings = Settings(
            redis_url=f"redis://127.0.0.1:{dropper.port}",
            redis_key_prefix=key_prefix,
            heartbeat_interval_seconds=0.5,
        )
        async with open_bridge(settings) as bridge:
            claim = await bridge.claim("lost-reply", lease_seconds=30)
            await bridge.publish("lost-reply", "token", {"seq": 0}, producer_token=claim.token)
            dropper.armed = True
            with pytest.raises(BackendUnavailable):
                await bridge.publish("lost-reply", "token", {"seq": 1}, producer_token=claim.token)
            assert dropper.cut == 1
            # The producer's read-back: the write did happen, once.
            info = await bridge.get_run("lost-reply")
            assert info is not None and info.retained_events == 2
            await bridge.publish("lost-reply", "token", {"seq": 2}, producer_token=claim.token)
        tg.cancel_scope.cancel()
    with redis_server.client() as c:
        entries = c.xrange(f"{key_prefix}{{lost-reply}}:log")
    assert [f[b"d"] for _, f in entries] == [b'{"seq":0}', b'{"seq":1}', b'{"seq":2}']
