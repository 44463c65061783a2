"""Change notifications on a Redis Cluster are sharded pub/sub: one notification per
published event costs one cluster bus message per replica of the run's shard (classic
PUBLISH is copied to every node), and the listener follows the run's slot when it moves
(resharding, failover) so a follower keeps getting events live, without waiting for a
heartbeat poll.

In-process bridges on the real 3-master/3-replica cluster fixture; heartbeats are long
(30 s) so that a follower that lost its notifications would visibly stall.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from gateway.bridge.provider import open_bridge
from gateway.errors import BackendUnavailable
from gateway.settings import Settings
from gateway.values import End, StreamEvent, StreamItem
from tests.support.redis_servers import RedisCluster, RedisServer
from tests.system.test_cluster_failover import cluster_url, log_key, owner_of

pytestmark = [pytest.mark.anyio, pytest.mark.cluster]

HEARTBEAT = 30.0  # longer than any wait below: deliveries come from notifications
LIVE = 5.0  # a notified follower gets each event well within this


def bus_counters(cluster: RedisCluster) -> dict[str, int]:
    """Publish messages sent over the cluster bus, summed over the running nodes (CLUSTER
    INFO lists a message type's counter only once it is non-zero)."""
    totals = {"publish": 0, "publishshard": 0}
    for node in cluster.nodes:
        if not node.running:
            continue
        with node.client() as c:
            raw = c.execute_command("CLUSTER", "INFO")
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        for line in text.splitlines():
            name, _, value = line.partition(":")
            for kind in totals:
                if name == f"cluster_stats_messages_{kind}_sent":
                    totals[kind] += int(value)
    return totals


def log_reads(cluster: RedisCluster) -> int:
    """read.lua's XINFO STREAM calls on every node: one per read of a log."""
    total = 0
    for node in cluster.nodes:
        if not node.running:
            continue
        with node.client() as c:
            stats = c.info("commandstats")
        total += int(stats.get("cmdstat_xinfo|stream", {}).get("calls", 0))
    return total


async def pushed_live(cluster: RedisCluster, follower: Follower, publish: Any) -> None:
    """After a move of the run's slot: the follower gets the next event (reading the log
    once or twice, as a resubscription asks), then 10 more live from their notifications
    alone (a follower that lost them would stall until a heartbeat, or poll)."""
    await follower.has(await publish(1))
    before = await anyio.to_thread.run_sync(log_reads, cluster)
    for n in range(2, 12):
        await follower.has(await publish(n))
    reads = await anyio.to_thread.run_sync(log_reads, cluster) - before
    assert reads <= 1, f"{reads} reads of the log for 10 notified events"


class Follower:
    """One subscription, read into a list by a task."""

    def __init__(self) -> None:
        self.items: list[StreamItem] = []
        self.attached = anyio.Event()

    @property
    def ids(self) -> list[str]:
        return [item.id for item in self.items if isinstance(item, StreamEvent)]

    async def run(self, bridge: Any, run_id: str) -> None:
        batches = bridge.subscribe_batches(run_id, heartbeat_interval=HEARTBEAT)
        self.attached.set()
        async for batch in batches:
            self.items.extend(batch)
            if isinstance(batch[-1], End):
                return

    async def has(self, event_id: str) -> None:
        with anyio.fail_after(LIVE):
            while event_id not in self.ids:
                await anyio.sleep(0.01)


@asynccontextmanager
async def followed_run(
    cluster: RedisCluster, key_prefix: str, run_id: str
) -> AsyncIterator[tuple[Any, Follower, Callable[[int], Awaitable[str]]]]:
    """A bridge, a follower of `run_id` parked at its tail, and `publish(n) -> id`."""
    settings = Settings(
        redis_url=cluster_url(cluster),
        redis_key_prefix=key_prefix,
        heartbeat_interval_seconds=HEARTBEAT,
    )
    async with open_bridge(settings) as bridge, anyio.create_task_group() as tg:
        token = (await bridge.claim(run_id, lease_seconds=300)).token
        follower = Follower()

        async def publish(n: int) -> str:
            result = await bridge.publish(run_id, "e", n, producer_token=token)
            return str(result.ids[-1])

        first = await publish(0)
        tg.start_soon(follower.run, bridge, run_id)
        await follower.has(first)  # attached and caught up: it follows the tail now
        yield bridge, follower, publish
        await bridge.publish_end(run_id, "success", producer_token=token)
        with anyio.fail_after(LIVE):
            while not (follower.items and isinstance(follower.items[-1], End)):
                await anyio.sleep(0.01)


@pytest.mark.timeout(120)
async def test_one_shard_message_per_published_event_and_no_classic_publish(
    redis_cluster: RedisCluster, key_prefix: str
) -> None:
    events = 40
    async with followed_run(redis_cluster, key_prefix, "counted") as (_, follower, publish):
        before = bus_counters(redis_cluster)
        for n in range(1, events + 1):
            await follower.has(await publish(n))  # each delivered live, by its notification
        after = bus_counters(redis_cluster)
    replicas = redis_cluster.n_replicas  # a shard message goes to each replica of the shard
    assert after["publishshard"] - before["publishshard"] == events * replicas
    assert after["publish"] - before["publish"] == 0
    assert len(follower.ids) == events + 1


def node_id(node: RedisServer) -> str:
    with node.client() as c:
        return str(c.execute_command("CLUSTER", "MYID").decode())


def migrate_slot(cluster: RedisCluster, key: str, source: RedisServer, target: RedisServer) -> None:
    """Move `key`'s slot, with its keys, from `source` to `target` (what resharding does)."""
    with source.client() as c:
        slot = int(c.execute_command("CLUSTER", "KEYSLOT", key))
    source_id, target_id = node_id(source), node_id(target)
    with target.client() as c:
        c.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
    with source.client() as c:
        c.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        while keys := c.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            c.execute_command("MIGRATE", target.host, target.port, "", 0, 5000, "KEYS", *keys)
    for node in (target, source, *cluster.masters):
        with node.client() as c:
            c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
    cluster.wait_ok()


@pytest.mark.timeout(120)
async def test_a_follower_keeps_getting_events_live_after_its_slot_is_migrated(
    redis_cluster: RedisCluster, key_prefix: str
) -> None:
    key = log_key(key_prefix, "migrated")
    async with followed_run(redis_cluster, key_prefix, "migrated") as (_, follower, publish):
        source, _ = owner_of(redis_cluster, key)
        target = next(m for m in redis_cluster.masters if m.port != source.port)
        await anyio.to_thread.run_sync(migrate_slot, redis_cluster, key, source, target)
        assert owner_of(redis_cluster, key)[0].port == target.port
        await pushed_live(redis_cluster, follower, publish)
    assert len(follower.ids) == 12


@pytest.mark.timeout(120)
async def test_a_follower_keeps_getting_events_live_after_a_failover(
    redis_cluster: RedisCluster, key_prefix: str
) -> None:
    key = log_key(key_prefix, "failed-over")
    async with followed_run(redis_cluster, key_prefix, "failed-over") as (_, follower, publish):
        _, replica = owner_of(redis_cluster, key)
        assert replica is not None
        with replica.client() as c:
            c.execute_command("CLUSTER", "FAILOVER")
        with anyio.fail_after(30):
            while owner_of(redis_cluster, key)[0].port != replica.port:
                await anyio.sleep(0.05)
        await anyio.to_thread.run_sync(redis_cluster.wait_ok)
        await pushed_live(redis_cluster, follower, publish)
    assert len(follower.ids) == 12


@pytest.mark.timeout(120)
async def test_a_follower_keeps_getting_events_live_after_its_connection_is_killed(
    redis_cluster: RedisCluster, key_prefix: str
) -> None:
    async with followed_run(redis_cluster, key_prefix, "killed") as (bridge, follower, publish):
        reconnects = bridge.notifier_reconnects
        killed = 0
        for node in redis_cluster.nodes:
            with node.client() as c:
                killed += int(c.execute_command("CLIENT", "KILL", "TYPE", "pubsub"))
        assert killed >= 1
        with anyio.fail_after(LIVE):
            while bridge.notifier_reconnects == reconnects:
                await anyio.sleep(0.01)
        await pushed_live(redis_cluster, follower, publish)
    assert len(follower.ids) == 12


@pytest.mark.timeout(150)
async def test_a_follower_keeps_getting_events_live_after_its_master_is_killed(
    redis_cluster: RedisCluster, key_prefix: str
) -> None:
    """The listener's connection to the run's master drops with it and cannot be made
    again: the listener has the slot map learned again, and subscribes on the promoted
    replica, within seconds of the promotion."""
    key = log_key(key_prefix, "killed-master")
    master, replica = owner_of(redis_cluster, key)
    assert replica is not None
    try:
        async with followed_run(redis_cluster, key_prefix, "killed-master") as (
            bridge,
            follower,
            publish,
        ):
            master.kill()

            def promoted() -> bool:
                try:
                    return owner_of(redis_cluster, key)[0].port == replica.port
                except AssertionError:
                    return False  # the master is marked failed, the replica not yet promoted

            with anyio.fail_after(60):
                while not await anyio.to_thread.run_sync(promoted):
                    await anyio.sleep(0.1)
            # The notifier's listener, failing to reach the dead master, has the slot
            # map (which the command client shares) learned again from the other nodes.
            with anyio.fail_after(10):
                while True:  # a read: the bridge re-sends it until the cluster answers
                    with contextlib.suppress(BackendUnavailable):
                        await bridge.get_run("killed-master")
                        break
                    await anyio.sleep(0.1)
            await pushed_live(redis_cluster, follower, publish)
        assert len(follower.ids) == 12
    finally:
        # Back as a replica of the promoted node: the fixture's shape for later tests.
        await anyio.to_thread.run_sync(master.restart)
        await anyio.to_thread.run_sync(redis_cluster.wait_ok)
