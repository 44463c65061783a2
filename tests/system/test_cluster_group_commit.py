"""Group commit on a Redis Cluster (`gateway/redis/group.py`, `on_a_cluster`): the write
scripts of many runs, on keys spread over every master, go out through the cluster
client's pipeline (one write per node), and each caller still gets exactly its own ids,
in its run's order; a script the nodes lost is loaded again and sent once more."""

from __future__ import annotations

import anyio
import pytest
from redis.cluster import RedisCluster as SyncCluster

from gateway.bridge.provider import open_bridge
from gateway.redis.bridge import RedisStreamBridge
from gateway.settings import Settings
from tests.support.redis_servers import RedisCluster
from tests.system.test_cluster_failover import cluster_url

pytestmark = [pytest.mark.anyio, pytest.mark.cluster, pytest.mark.timeout(90)]

RUNS = 30
EVENTS = 20


async def test_concurrent_runs_on_every_node_share_writes_and_keep_their_ids(
    redis_cluster: RedisCluster, key_prefix: str
) -> None:
    settings = Settings(redis_url=cluster_url(redis_cluster), redis_key_prefix=key_prefix)
    runs = [f"cg{i}" for i in range(RUNS)]
    async with open_bridge(settings) as bridge:
        assert isinstance(bridge, RedisStreamBridge)
        tokens = [(await bridge.claim(run, lease_seconds=60)).token for run in runs]
        for master in redis_cluster.masters:
            with master.client() as raw:
                raw.script_flush()  # (the first flight must load them again)
        group = bridge.calls.group
        acked: list[list[str]] = [[] for _ in runs]

        async def stream(index: int) -> None:
            for n in range(EVENTS):
                result = await bridge.publish(runs[index], "t", n, producer_token=tokens[index])
                acked[index].extend(result.ids)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for index in range(RUNS):
                    tg.start_soon(stream, index)
        batches, scripts = group.batches, group.scripts
    client = SyncCluster.from_url(redis_cluster.url)
    try:
        logs = [
            [entry_id.decode() for entry_id, _ in client.xrange(f"{key_prefix}{{{run}}}:log")]
            for run in runs
        ]
    finally:
        client.close()
    assert batches < scripts  # scripts went together
    for index in range(RUNS):
        assert acked[index] == logs[index]  # its own ids, in its order, nothing else
        assert len(logs[index]) == EVENTS
