"""What one published event costs the cluster in change notifications.

Starts a local Redis Cluster (3 masters, `--replicas` replicas each), opens a gateway
bridge on it, follows one run with a subscriber and publishes N events and the END one
by one. Every publish script notifies the run's followers; the figure is the cluster bus
messages that notification cost, summed over every node from its `CLUSTER INFO`
counters before and after: `cluster_stats_messages_publish_sent` (classic PUBLISH, which
the node copies to every other node) and `cluster_stats_messages_publishshard_sent`
(SPUBLISH, copied only to the replicas of the shard that owns the channel's slot).

The subscriber must receive every event (checked), so notifications did reach it.

Run: .venv/bin/python bench/cluster_notifications.py [--quick] [--replicas R]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from _common import ROOT  # noqa: F401  (puts the repository on sys.path)

from gateway import Settings, open_bridge
from gateway.values import End, StreamEvent
from tests.support.redis_servers import RedisCluster, RedisServer

COUNTERS = ("cluster_stats_messages_publish_sent", "cluster_stats_messages_publishshard_sent")


def bus_counters(nodes: list[RedisServer]) -> dict[str, int]:
    """The publish counters summed over the nodes (CLUSTER INFO omits a zero counter)."""
    totals = dict.fromkeys(COUNTERS, 0)
    for node in nodes:
        with node.client() as c:
            raw = c.execute_command("CLUSTER", "INFO")
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        for line in text.splitlines():
            name, _, value = line.partition(":")
            if name in totals:
                totals[name] += int(value)
    return totals


async def measure(cluster: RedisCluster, events: int) -> tuple[dict[str, int], float]:
    url = cluster.url.replace("redis://", "redis+cluster://", 1)
    settings = Settings(redis_url=url, redis_key_prefix="bench:", heartbeat_interval_seconds=30)
    async with open_bridge(settings) as bridge:
        claim = await bridge.claim("notified", lease_seconds=600)
        received = 0
        attached = asyncio.Event()

        async def follow() -> None:
            nonlocal received
            batches = bridge.subscribe_batches("notified", heartbeat_interval=30)
            attached.set()
            async for batch in batches:
                received += sum(1 for item in batch if isinstance(item, StreamEvent))
                if isinstance(batch[-1], End):
                    return

        follower = asyncio.create_task(follow())
        await attached.wait()
        await asyncio.sleep(0.2)  # the follower is parked at the tail, subscribed
        before = bus_counters(cluster.nodes)
        start = time.perf_counter()
        for i in range(events):
            await bridge.publish("notified", "token", {"i": i}, producer_token=claim.token)
        await bridge.publish_end("notified", "success", producer_token=claim.token)
        await asyncio.wait_for(follower, 30)
        elapsed = time.perf_counter() - start
        after = bus_counters(cluster.nodes)
    if received != events:
        raise SystemExit(f"the follower received {received} of {events} events")
    return {name: after[name] - before[name] for name in COUNTERS}, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 events instead of 2,000")
    parser.add_argument("--replicas", type=int, default=1, help="replicas per master (1)")
    args = parser.parse_args()
    events = 200 if args.quick else 2_000
    with RedisCluster(3, args.replicas) as cluster:
        delta, elapsed = asyncio.run(measure(cluster, events))
    scripts = events + 1  # every event's publish and the END each notify once
    classic, shard = (delta[name] for name in COUNTERS)
    nodes = 3 * (1 + args.replicas)
    print(f"cluster: 3 masters x {args.replicas} replica(s) ({nodes} nodes)")
    print(f"published: {events} events + END ({scripts} notifications) in {elapsed:.2f} s")
    print(f"bus messages: {classic} publish, {shard} publishshard")
    print(f"notification messages per published event: {(classic + shard) / scripts:.2f}")


if __name__ == "__main__":
    main()
