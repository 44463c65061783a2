"""Redis Cluster end to end: `gateway serve --redis-url redis+cluster://host:port` processes
on the real 3-master/3-replica cluster fixture.

Publish, subscribe, resume, fencing, fan-out over two gateways and lease expiry, then a
manual failover (`CLUSTER FAILOVER` on the replica of the master that owns the run's
slot) while the run streams. The producer retries 503s with idempotent accounting (it
reads `last_event_id` back before re-sending, see tests/fault_tools.HttpProducer); every
subscriber must end with exactly the published sequence.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import anyio
import httpx
import pytest

from tests.support.fault_tools import Follower, HttpProducer, poll
from tests.support.proxies import GatewayProcess
from tests.support.redis_servers import RedisCluster, RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.cluster]


def cluster_url(cluster: RedisCluster) -> str:
    return cluster.url.replace("redis://", "redis+cluster://", 1)


@pytest.fixture
def cluster_gateways(
    redis_cluster: RedisCluster, key_prefix: str
) -> Iterator[Callable[[], GatewayProcess]]:
    made: list[GatewayProcess] = []

    def start() -> GatewayProcess:
        gw = GatewayProcess(cluster_url(redis_cluster), heartbeat=0.5, key_prefix=key_prefix)
        made.append(gw)
        return gw.start()

    try:
        yield start
    finally:
        for gw in made:
            gw.close()


def log_key(key_prefix: str, run_id: str) -> str:
    return f"{key_prefix}{{{run_id}}}:log"


def owner_of(cluster: RedisCluster, key: str) -> tuple[RedisServer, RedisServer | None]:
    """(master, one of its replicas) serving `key`'s slot right now (from CLUSTER NODES)."""
    node = next(n for n in cluster.nodes if n.running)
    with node.client() as c:
        slot = int(c.execute_command("CLUSTER", "KEYSLOT", key))
        raw = c.execute_command("CLUSTER", "NODES")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    rows = [line.split() for line in text.splitlines() if line.strip()]
    by_port = {n.port: n for n in cluster.nodes}

    def port(row: list[str]) -> int:
        return int(row[1].split("@")[0].rsplit(":", 1)[1])

    for row in rows:
        flags = row[2].split(",")
        if "master" not in flags or "fail" in flags:
            continue
        for part in row[8:]:
            if part.startswith("["):
                continue  # a slot being migrated
            lo, _, hi = part.partition("-")
            if int(lo) <= slot <= int(hi or lo):
                replicas = [r for r in rows if r[3] == row[0] and "fail" not in r[2]]
                return by_port[port(row)], by_port[port(replicas[0])] if replicas else None
    raise AssertionError(f"slot {slot} not covered")


def raw_xrange(server: RedisServer, key: str) -> list[tuple[str, dict[bytes, bytes]]]:
    with server.client() as c:
        return [(i.decode(), f) for i, f in c.xrange(key)]


@pytest.mark.timeout(120)
async def test_cluster_publish_subscribe_resume_fence_fanout_and_lease_expiry(
    redis_cluster: RedisCluster,
    cluster_gateways: Callable[[], GatewayProcess],
    key_prefix: str,
) -> None:
    a, b = cluster_gateways(), cluster_gateways()
    async with (
        httpx.AsyncClient(base_url=a.url, timeout=10) as ca,
        httpx.AsyncClient(base_url=b.url, timeout=10) as cb,
    ):
        # Publish on A, fan out to 3 subscribers on each gateway.
        producer = await HttpProducer.claim(ca, tag="p1", lease_seconds=60)
        followers = [Follower(lambda c=c: c, producer.run_id) for c in (ca, cb) for _ in range(3)]
        async with anyio.create_task_group() as tg:
            for f in followers:
                tg.start_soon(f.run, 60.0)
            for seq in range(20):
                await producer.publish_seq(seq)
            # Resume mid-stream on the other gateway with Last-Event-ID.
            resumed = Follower(lambda: cb, producer.run_id)
            resumed.events = list((await _wait_for(followers[0], 10)).events[:10])
            tg.start_soon(resumed.run, 60.0)
            # Fencing: a takeover through B fences the first producer everywhere.
            takeover = await cb.post(
                "/v1/runs", json={"run_id": producer.run_id, "takeover": True, "lease_seconds": 1}
            )
            assert takeover.status_code == 201 and takeover.json()["epoch"] == 2
            stale = await producer.post_event(999)
            assert stale.status_code == 409 and stale.json()["error"] == "fenced"
            second = HttpProducer(cb, producer.run_id, takeover.json()["producer_token"], 2, "p2")
            for seq in range(20, 25):
                await second.publish_seq(seq)
            # Lease expiry: the second producer dies; a gateway appends producer_lost.
            with anyio.fail_after(15):
                for f in [*followers, resumed]:
                    await f.done.wait()
    ids = producer.ids + second.ids
    for f in [*followers, resumed]:
        assert f.ids == ids and f.seqs == list(range(25))
        assert f.terminal is not None and f.terminal.json()["status"] == "producer_lost"
    master, _ = owner_of(redis_cluster, log_key(key_prefix, producer.run_id))
    log = raw_xrange(master, log_key(key_prefix, producer.run_id))
    assert [i for i, _ in log[:-1]] == ids and log[-1][1] == {b"end": b"producer_lost"}


async def _wait_for(follower: Follower, n: int) -> Follower:
    await poll("events", lambda: _has(follower, n), 10)
    return follower


async def _has(follower: Follower, n: int) -> bool:
    return len(follower.events) >= n


@pytest.mark.timeout(180)
async def test_cluster_manual_failover_of_the_runs_master_while_streaming(
    redis_cluster: RedisCluster,
    cluster_gateways: Callable[[], GatewayProcess],
    key_prefix: str,
) -> None:
    a, b = cluster_gateways(), cluster_gateways()
    async with (
        httpx.AsyncClient(base_url=a.url, timeout=10) as ca,
        httpx.AsyncClient(base_url=b.url, timeout=10) as cb,
    ):
        producer = await HttpProducer.claim(ca, lease_seconds=120)
        key = log_key(key_prefix, producer.run_id)
        _old_master, replica = owner_of(redis_cluster, key)
        assert replica is not None
        followers = [Follower(lambda c=c: c, producer.run_id) for c in (ca, cb) for _ in range(2)]
        total = 150
        failover_done = anyio.Event()
        seq_at_failover: list[int] = []

        async def fail_over() -> None:
            with replica.client() as c:
                assert c.execute_command("CLUSTER", "FAILOVER") in (b"OK", "OK", True)

            def promoted() -> bool:
                return owner_of(redis_cluster, key)[0].port == replica.port

            deadline = time.monotonic() + 30
            while not await anyio.to_thread.run_sync(promoted):
                assert time.monotonic() < deadline, "the replica was not promoted"
                await anyio.sleep(0.05)
            await anyio.to_thread.run_sync(redis_cluster.wait_ok)
            failover_done.set()

        async with anyio.create_task_group() as tg:
            for f in followers:
                tg.start_soon(f.run, 150.0)
            for seq in range(total):
                if seq == 30:
                    seq_at_failover.append(seq)
                    tg.start_soon(fail_over)
                await producer.publish_seq(seq)
                await anyio.sleep(0.01)  # a realistic token pace, not synchronisation
            with anyio.fail_after(60):
                await failover_done.wait()
            for seq in range(total, total + 20):  # and it keeps working after the switch
                await producer.publish_seq(seq)
            await producer.end()
            with anyio.fail_after(30):
                for f in followers:
                    await f.done.wait()
    print(  # what the switch cost the producer (informational)
        f"failover: {len(producer.unavailable)} publish 503s, "
        f"{producer.applied_after_503} applied despite the 503"
    )
    new_master, _ = owner_of(redis_cluster, key)
    assert new_master.port == replica.port  # the run's slot really moved
    for f in followers:
        assert f.terminal is not None and f.terminal.json()["status"] == "success"
        assert f.ids == producer.ids, "loss, duplicate or reorder across the failover"
        assert f.seqs == list(range(total + 20))
    log = raw_xrange(new_master, key)
    assert [i for i, _ in log[:-1]] == producer.ids  # no event applied twice
    assert log[-1][1] == {b"end": b"success"}
