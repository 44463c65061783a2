"""`min_replicas_acked`: a write is acknowledged only once Redis replicas hold it (`WAIT`
on the write's own connection), else 503 `backend_unavailable`. A real primary and a real
replica (`--replicaof`); the replica is stopped (SIGSTOP), detached or promoted."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import httpx
import pytest
from pydantic import ValidationError

from gateway.bridge.provider import open_bridge
from gateway.cli import ConfigError, build_settings
from gateway.errors import BackendUnavailable
from gateway.redis.bridge import RedisStreamBridge
from gateway.redis.keys import run_keys
from gateway.settings import Settings
from tests.http_app.test_http_append_stream import Duplex, line
from tests.support.http_server import ProducerClient, serve
from tests.support.redis_servers import RedisServer
from tests.support.replication import detach, promote, start_replica, stopped, wait_in_sync

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

TIMEOUT = 0.5  # replica_ack_timeout_seconds where a write is to fail


@pytest.fixture
def pair(
    redis_server_factory: Callable[..., RedisServer],
) -> Iterator[tuple[RedisServer, RedisServer]]:
    master = redis_server_factory()
    replica = start_replica(master)
    try:
        yield master, replica
    finally:
        replica.close()


def acked(url: str, prefix: str, **over: Any) -> Settings:
    values: dict[str, Any] = {
        "redis_url": url,
        "redis_key_prefix": prefix,
        "min_replicas_acked": 1,
        "replica_ack_timeout_seconds": TIMEOUT,
    }
    return Settings(**(values | over))


def logged(server: RedisServer, prefix: str, run_id: str) -> list[str]:
    """The ids in a run's log on `server` (a replica answers reads)."""
    with server.client() as raw:
        return [entry_id.decode() for entry_id, _ in raw.xrange(run_keys(prefix, run_id).log)]


async def test_a_publish_returns_once_the_replica_holds_it(
    pair: tuple[RedisServer, RedisServer], key_prefix: str
) -> None:
    master, replica = pair
    async with open_bridge(acked(master.url, key_prefix, replica_ack_timeout_seconds=3)) as bridge:
        claim = await bridge.claim("r")
        for n in range(20):
            ids = (await bridge.publish("r", "token", n, producer_token=claim.token)).ids
            assert ids[0] in logged(replica, key_prefix, "r")  # read right after the reply
        # With the replica stopped, the reply waits for it (it would come at once if the
        # primary's copy were enough), and comes once it has caught up.
        replies: list[str] = []
        answered = anyio.Event()

        async def publish() -> None:
            reply = await bridge.publish("r", "token", "late", producer_token=claim.token)
            replies.extend(reply.ids)
            answered.set()

        async with anyio.create_task_group() as tasks:
            with stopped(replica):
                tasks.start_soon(publish)
                with anyio.move_on_after(0.3):
                    await answered.wait()
                assert not answered.is_set(), "acknowledged before the replica held it"
        assert replies and replies[0] in logged(replica, key_prefix, "r")


async def test_writes_no_replica_confirms_fail_503_within_the_timeout(
    pair: tuple[RedisServer, RedisServer], key_prefix: str
) -> None:
    master, replica = pair
    async with open_bridge(acked(master.url, key_prefix)) as bridge:
        assert isinstance(bridge, RedisStreamBridge)
        claim = await bridge.claim("r")
        token = claim.token
        writes: dict[str, Callable[[], Any]] = {
            "publish": lambda: bridge.publish("r", "token", 1, producer_token=token),
            "publish_many": lambda: bridge.publish_many(
                "r", [("token", 2), ("token", 3)], producer_token=token, seq=1
            ),
            "renew_lease": lambda: bridge.renew_lease("r", producer_token=token),
            "request_cancel": lambda: bridge.request_cancel("r"),
            "claim": lambda: bridge.claim("other"),
            "cut_lease": lambda: bridge.cut_lease("r", producer_token=token, stream="s", grace=1),
        }
        with stopped(replica):
            for what, write in writes.items():
                started = time.monotonic()
                with pytest.raises(BackendUnavailable) as refused:
                    await write()
                took = time.monotonic() - started
                assert TIMEOUT * 0.9 <= took < TIMEOUT + 2, (what, took)
                assert "reached 0 of the 1 Redis replicas" in str(refused.value), what
                assert "not acknowledged" in str(refused.value)
        assert bridge.replica_ack_failures == len(writes)
        # The replica back: the same numbered batch (a safe retry) is answered, with the
        # ids the first try gave its events.
        wait_in_sync(master, replica)
        again = await bridge.publish_many(
            "r", [("token", 2), ("token", 3)], producer_token=token, seq=1
        )
        assert again.already_applied == 2
        assert set(again.ids) <= set(logged(replica, key_prefix, "r"))


async def test_a_reply_that_writes_nothing_waits_for_the_replicas_too(
    pair: tuple[RedisServer, RedisServer], key_prefix: str
) -> None:
    """An END repeated through another process after the first one failed 503:
    deduplicated, so it writes nothing, and is still answered only once the replica holds
    the END. (`WAIT` alone would answer at once: it waits for the connection's own last
    write, which the replica had.)"""
    master, replica = pair
    settings = acked(master.url, key_prefix)
    async with open_bridge(settings) as first, open_bridge(settings) as second:
        claim = await first.claim("r")
        await second.renew_lease("r", producer_token=claim.token)  # its connection's write
        with stopped(replica):
            with pytest.raises(BackendUnavailable):
                await first.publish_end("r", "success", producer_token=claim.token)
            with pytest.raises(BackendUnavailable):
                await second.publish_end("r", "success", producer_token=claim.token)
        result = await second.publish_end("r", "success", producer_token=claim.token)
        assert result.deduplicated
        assert result.id in logged(replica, key_prefix, "r")


async def test_a_promoted_replica_holds_every_acknowledged_event(
    pair: tuple[RedisServer, RedisServer], key_prefix: str
) -> None:
    master, replica = pair
    async with open_bridge(acked(master.url, key_prefix)) as bridge:
        claim = await bridge.claim("r")
        acknowledged: list[str] = []
        for n in range(5):
            reply = await bridge.publish("r", "token", n, producer_token=claim.token)
            acknowledged.extend(reply.ids)
        detach(replica)  # a partition: nothing more reaches it
        with pytest.raises(BackendUnavailable):
            await bridge.publish("r", "token", "lost", producer_token=claim.token)
    promote(replica)  # the failover
    on_promoted = logged(replica, key_prefix, "r")
    assert on_promoted == acknowledged  # every acknowledged event, and only those
    assert logged(master, key_prefix, "r")[:-1] == acknowledged  # the unacknowledged one


async def test_http_publish_503_names_the_replicas(
    pair: tuple[RedisServer, RedisServer], key_prefix: str
) -> None:
    master, replica = pair
    with serve(acked(master.url, key_prefix), "redis") as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as client:
            producer = await ProducerClient.claim(client)
            run, headers = producer.run_id, {"X-Producer-Token": producer.token}
            ids = await producer.publish(("token", 1))
            assert ids[0] in logged(replica, key_prefix, run)
            with stopped(replica):
                refused = await client.post(
                    f"/v1/runs/{run}/events", json={"event": "token", "data": 2}, headers=headers
                )
            assert refused.status_code == 503, refused.text
            assert refused.headers["retry-after"] == "1"
            body = refused.json()
            assert body["error"] == "backend_unavailable"
            assert "reached 0 of the 1 Redis replicas" in body["detail"], body
            metrics = (await client.get("/metrics")).text
            assert "gateway_redis_unreplicated_writes_total 1.0" in metrics


async def test_a_streamed_append_acks_only_replicated_lines(
    pair: tuple[RedisServer, RedisServer], key_prefix: str
) -> None:
    """Each ack line comes once the replica holds its lines; a group no replica confirms
    ends the stream with the error line, and the resent line is answered once it is."""
    master, replica = pair
    with serve(acked(master.url, key_prefix), "redis") as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as client:
            producer = await ProducerClient.claim(client)
            run = producer.run_id
            async with Duplex(srv, producer, seq=1) as duplex:
                duplex.send(line(1))
                first = await duplex.reply()
                assert first["ids"][0] in logged(replica, key_prefix, run)
                with stopped(replica):
                    duplex.send(line(2))
                    failed = await duplex.reply()
                duplex.close_body()
            assert failed["error"] == "backend_unavailable", failed
            assert "reached 0 of the 1 Redis replicas" in failed["detail"]
            assert failed["applied"] == 1
            wait_in_sync(master, replica)
            async with Duplex(srv, producer, seq=2) as duplex:  # resent from the first unacked
                duplex.send(line(2))
                again = await duplex.reply()
                duplex.close_body()
                assert (await duplex.reply())["done"] is True
            assert logged(replica, key_prefix, run)[1:] == again["ids"]


async def test_removals_are_answered_once_the_replica_has_them(
    pair: tuple[RedisServer, RedisServer], key_prefix: str
) -> None:
    """A run's removal and a session's deletion (plain commands, no script's WAIT behind
    them) are answered once the replica has them too, or 503."""
    master, replica = pair
    with serve(acked(master.url, key_prefix), "redis") as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as client:
            run = await ProducerClient.claim(client)
            await run.publish(("token", 1))
            turn = await ProducerClient.claim(client, session_id="s")
            await turn.publish(("token", 1))
            await turn.end()
            with stopped(replica):
                run_refused = await client.delete(f"/v1/runs/{run.run_id}")
                session_refused = await client.delete("/v1/sessions/s")
            for refused in (run_refused, session_refused):
                assert refused.status_code == 503, refused.text
                assert "reached 0 of the 1 Redis replicas" in refused.json()["detail"]
            wait_in_sync(master, replica)
            assert (await client.delete(f"/v1/runs/{run.run_id}")).status_code == 204
            assert logged(replica, key_prefix, run.run_id) == []
            assert (await client.delete("/v1/sessions/s")).status_code == 200
            with replica.client() as raw:
                assert not raw.exists(run_keys(key_prefix, turn.run_id).turn)


def test_the_setting_is_refused_without_one_redis_server() -> None:
    with pytest.raises(ValidationError, match="needs the Redis bridge"):
        Settings(min_replicas_acked=1)
    with pytest.raises(ConfigError, match="memory bridge has no replicas"):
        build_settings({"min_replicas_acked": 1})
    with pytest.raises(ValidationError, match="not supported on a Redis Cluster"):
        Settings(redis_url="redis+cluster://127.0.0.1:7000", min_replicas_acked=1)
    with pytest.raises(ValidationError, match="less than redis_command_timeout_seconds"):
        Settings(
            redis_url="redis://127.0.0.1:6379",
            min_replicas_acked=1,
            replica_ack_timeout_seconds=5,
            redis_command_timeout_seconds=5,
        )
    with pytest.raises(ValidationError):
        Settings(redis_url="redis://127.0.0.1:6379", min_replicas_acked=-1)
    assert Settings(redis_url="redis+cluster://127.0.0.1:7000").min_replicas_acked == 0


def test_the_setting_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_MIN_REPLICAS_ACKED", "2")
    monkeypatch.setenv("GATEWAY_REPLICA_ACK_TIMEOUT_SECONDS", "0.25")
    settings = Settings(redis_url="redis://127.0.0.1:6379")
    assert (settings.min_replicas_acked, settings.replica_ack_timeout_seconds) == (2, 0.25)
