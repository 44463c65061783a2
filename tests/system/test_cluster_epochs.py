"""Run epochs on a Redis Cluster: a write that runs on another server than the run's last
write moves the run's epoch on (lua/entry_id.lua), also where the cluster client routes
the script, so that ids lost in a failover can never be handed out again.

On one server the gateway passes the server's identity, learned as its connection
connected; on a cluster the script asks the server it runs on (`group.ASK_SERVER`). Here
a manual `CLUSTER FAILOVER` promotes the replica of the run's master: the next append
runs there, and must open a new epoch (ids of at least `EPOCH_SPAN` in their sequence
part) and record the new master's identity.
"""

from __future__ import annotations

import time

import anyio
import pytest

from gateway.bridge.provider import open_bridge
from gateway.cursor import EPOCH_SPAN, parse_cursor
from gateway.errors import BackendUnavailable
from gateway.settings import Settings
from tests.support.redis_servers import RedisCluster, RedisServer
from tests.system.test_cluster_failover import cluster_url, owner_of

pytestmark = [pytest.mark.anyio, pytest.mark.cluster, pytest.mark.timeout(90)]


def run_id_of(server: RedisServer) -> str:
    with server.client() as c:
        return str(c.info("server")["run_id"])


def record(server: RedisServer, key: str) -> dict[bytes, bytes]:
    with server.client() as c:
        return dict(c.hgetall(key))


async def test_a_write_after_a_cluster_failover_opens_a_new_epoch(
    redis_cluster: RedisCluster, key_prefix: str
) -> None:
    settings = Settings(
        redis_url=cluster_url(redis_cluster),
        redis_key_prefix=key_prefix,
        lease_seconds=120,
        redis_command_timeout_seconds=3,
    )
    meta = f"{key_prefix}{{ep}}:meta"
    async with open_bridge(settings) as bridge:
        claim = await bridge.claim("ep")
        first = (await bridge.publish("ep", "t", 0, producer_token=claim.token)).ids[0]
        master, replica = owner_of(redis_cluster, meta)
        assert replica is not None
        # The script learned its server on the cluster: the record names the master.
        stored = record(master, meta)
        assert stored[b"srv"].decode() == run_id_of(master)
        assert stored.get(b"ep", b"0") == b"0" and parse_cursor(first)[1] < EPOCH_SPAN

        with replica.client() as c:
            c.execute_command("CLUSTER", "FAILOVER")
        deadline = time.monotonic() + 30
        while owner_of(redis_cluster, meta)[0].port != replica.port:
            assert time.monotonic() < deadline, "the replica was not promoted"
            await anyio.sleep(0.05)
        await anyio.to_thread.run_sync(redis_cluster.wait_ok)

        with anyio.fail_after(30):
            while True:
                try:
                    after = await bridge.publish("ep", "t", 1, producer_token=claim.token)
                    break
                except BackendUnavailable:
                    await anyio.sleep(0.1)  # the client relearning the slot map
    moved = record(replica, meta)
    assert moved[b"srv"].decode() == run_id_of(replica)
    assert moved[b"ep"] == b"1"
    assert parse_cursor(after.ids[0])[1] >= EPOCH_SPAN
    assert after.ids[0] != first
