"""`/metrics` moves as docs/operations.md says, and `/readyz` (drain, scripts), through a
real uvicorn server on the memory and the Redis bridge.

Synchronisation is by conditions, never sleeps: the server's open-SSE count
(`wait_open_sse`), a response's end, or a metric polled under a deadline.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from gateway.http.app import drain
from gateway.redis.scripts import lua_source
from tests.support import http_server
from tests.support.http_server import ProducerClient, RunningServer, make_settings, serve
from tests.support.redis_servers import RedisServer
from tests.support.sse_client import SSEParser, iter_frames, read_stream

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
gateway_server = http_server.gateway_server
client = http_server.client

BRIDGE_SCRIPTS = ("claim", "publish", "publish_end", "renew_lease", "read", "cancel")
SESSION_SCRIPTS = ("session_read", "session_delete", "session_index", "turn_read")
SESSION_STEPS = ("session_claim", "session_touch")  # run by the bridge


class Samples:
    """One scrape of `/metrics`: `value(name, **labels)` (0.0 when absent)."""

    def __init__(self, text: str) -> None:
        self.values: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = (sample.name, frozenset(sample.labels.items()))
                self.values[key] = sample.value

    def value(self, name: str, **labels: str) -> float:
        return self.values.get((name, frozenset(labels.items())), 0.0)


async def scrape(client: httpx.AsyncClient) -> Samples:
    response = await client.get("/metrics")
    assert response.status_code == 200
    return Samples(response.text)


async def until(
    client: httpx.AsyncClient, check: Callable[[Samples], bool], timeout: float = 10.0
) -> Samples:
    """Scrape until `check` holds (a condition with a deadline, not a fixed sleep)."""
    with anyio.fail_after(timeout):
        while True:
            samples = await scrape(client)
            if check(samples):
                return samples
            await anyio.sleep(0.02)


def delta(after: Samples, before: Samples, name: str, **labels: str) -> float:
    return after.value(name, **labels) - before.value(name, **labels)


def _h(producer: ProducerClient) -> dict[str, str]:
    return {"X-Producer-Token": producer.token}


# ------------------------------------------------------------------------ SSE metrics


async def test_open_gauge_bytes_out_delivered_and_lag(
    client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    producer = await ProducerClient.claim(client)
    ids = await producer.publish(("token", 1), ("token", 2), ("token", 3))
    before = await scrape(client)
    received = b""
    url = f"/v1/runs/{producer.run_id}/stream"
    async with client.stream("GET", url) as response:
        gateway_server.wait_open_sse(1)
        during = await scrape(client)
        assert during.value("gateway_sse_open_subscribers") == 1
        await producer.end()
        async for chunk in response.aiter_raw():
            received += chunk
    gateway_server.wait_open_sse(0)
    after = await scrape(client)
    frames = SSEParser().feed(received)
    assert [f.data_id for f in frames if f.data_id is not None] == ids and frames[-1].event == "end"
    assert after.value("gateway_sse_open_subscribers") == 0
    assert delta(after, before, "gateway_sse_bytes_out_total") == len(received)
    assert delta(after, before, "gateway_events_delivered_total") == 3
    assert delta(after, before, "gateway_sse_resumes_total", outcome="from_start") == 1
    lag_writes = delta(after, before, "gateway_sse_delivery_lag_seconds_count")
    assert 1 <= lag_writes <= 3  # one observation per write carrying events
    assert delta(after, before, "gateway_sse_delivery_lag_seconds_sum") >= 0


async def test_subscriber_gauge_returns_to_zero_after_disconnect(
    client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    producer = await ProducerClient.claim(client)
    await producer.publish(("token", 1))
    url = f"/v1/runs/{producer.run_id}/stream"
    result = await read_stream(client, url, stop=lambda frame: frame.data_id is not None)
    assert len(result.events) == 1
    gateway_server.wait_open_sse(0)
    assert (await scrape(client)).value("gateway_sse_open_subscribers") == 0


@pytest.mark.gateway_settings(max_events_per_run=3)
async def test_resume_outcomes_exact_malformed_and_gap_trimmed(client: httpx.AsyncClient) -> None:
    producer = await ProducerClient.claim(client)
    ids: list[str] = []
    for i in range(10):  # one by one, so Redis trims as it goes
        ids += await producer.publish(("token", i))
    await producer.end()
    url = f"/v1/runs/{producer.run_id}/stream"
    first = (await client.get(f"/v1/runs/{producer.run_id}")).json()["first_event_id"]

    async def resume(cursor: str) -> tuple[str | None, Samples]:
        before = await scrape(client)
        result = await read_stream(client, url, headers={"Last-Event-ID": cursor})
        assert result.terminal is not None
        return result.terminal.event, before

    cases = [
        (first, "end", "exact"),
        ("not-a-cursor", "end", "malformed_cursor"),
        (ids[0], "gap", "gap_trimmed"),
    ]
    for cursor, terminal, outcome in cases:
        event, before = await resume(cursor)
        assert event == terminal
        after = await scrape(client)
        moved = {
            name: delta(after, before, "gateway_sse_resumes_total", outcome=name)
            for name in ("exact", "gap_trimmed", "gap_stream_removed", "malformed_cursor")
        }
        assert moved == {name: (1 if name == outcome else 0) for name in moved}, cursor
        gaps = delta(after, before, "gateway_sse_gaps_total", reason="trimmed")
        assert gaps == (1 if outcome == "gap_trimmed" else 0)


@pytest.mark.gateway_settings(heartbeat_interval_seconds=10)
async def test_resume_outcome_gap_stream_removed(
    client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    producer = await ProducerClient.claim(client)
    ids = await producer.publish(("token", 1))
    before = await scrape(client)
    url = f"/v1/runs/{producer.run_id}/stream"
    async with client.stream("GET", url, headers={"Last-Event-ID": ids[-1]}) as response:
        gateway_server.wait_open_sse(1)  # waiting at the tail: no item yet (heartbeat 10 s)
        assert (await client.delete(f"/v1/runs/{producer.run_id}")).status_code == 204
        frames = [frame async for frame in iter_frames(response)]
    assert frames[-1].event == "gap" and frames[-1].json()["reason"] == "stream_removed"
    gateway_server.wait_open_sse(0)
    after = await scrape(client)
    assert delta(after, before, "gateway_sse_resumes_total", outcome="gap_stream_removed") == 1
    assert delta(after, before, "gateway_sse_resumes_total", outcome="exact") == 0
    assert delta(after, before, "gateway_sse_gaps_total", reason="stream_removed") == 1


async def test_drain_counts_and_readyz_503_while_draining(
    client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    producer = await ProducerClient.claim(client)
    await producer.publish(("token", 1))
    assert (await client.get("/readyz")).status_code == 200
    before = await scrape(client)
    url = f"/v1/runs/{producer.run_id}/stream"
    async with client.stream("GET", url) as response:
        gateway_server.wait_open_sse(1)

        async def start_drain() -> None:
            drain(gateway_server.server.config.app)

        gateway_server.call(start_drain)
        frames = [frame async for frame in iter_frames(response)]
    assert any(b"shutdown" in c for f in frames for c in f.comments)
    gateway_server.wait_open_sse(0)
    after = await scrape(client)
    assert delta(after, before, "gateway_sse_drained_total") == 1
    ready = await client.get("/readyz")
    assert ready.status_code == 503 and ready.json()["error"] == "draining"
    assert (await client.get("/healthz")).status_code == 200


# ---------------------------------------------------------------------- producer side


async def test_fenced_and_writes_after_end(client: httpx.AsyncClient) -> None:
    producer = await ProducerClient.claim(client)
    await producer.publish(("token", 1))
    before = await scrape(client)
    takeover = await client.post("/v1/runs", json={"run_id": producer.run_id, "takeover": True})
    assert takeover.status_code == 201
    url = f"/v1/runs/{producer.run_id}/events"
    stale = await client.post(url, json={"event": "a", "data": 1}, headers=_h(producer))
    assert stale.status_code == 409 and stale.json()["error"] == "fenced"
    after_fence = await scrape(client)
    assert delta(after_fence, before, "gateway_fenced_writes_total") == 1
    assert delta(after_fence, before, "gateway_writes_after_end_total") == 0

    owner = ProducerClient(client, producer.run_id, takeover.json()["producer_token"])
    await owner.end()
    late = await client.post(url, json={"event": "a", "data": 1}, headers=_h(owner))
    assert late.status_code == 409 and late.json()["error"] == "ended"
    reclaim = await client.post("/v1/runs", json={"run_id": producer.run_id})
    assert reclaim.status_code == 409 and reclaim.json()["error"] == "run_ended"  # not a write
    after = await scrape(client)
    assert delta(after, before, "gateway_writes_after_end_total") == 1
    assert delta(after, before, "gateway_fenced_writes_total") == 1
    assert delta(after, before, "gateway_events_published_total") == 0


async def test_recovery_end_counted(
    client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    producer = await ProducerClient.claim(client, lease_seconds=0.5)
    await producer.publish(("token", 1))
    before = await scrape(client)
    result = await read_stream(client, f"/v1/runs/{producer.run_id}/stream")  # until END
    assert result.terminal is not None and result.terminal.json()["status"] == "producer_lost"
    after = await until(client, lambda s: delta(s, before, "gateway_recovery_ends_total") >= 1)
    assert delta(after, before, "gateway_recovery_ends_total") == 1


@pytest.mark.parametrize(
    ("backend", "scan", "counted"),
    [("redis", True, True), ("redis", False, False), ("memory", True, False)],
)
async def test_legacy_scan_counted_only_when_it_runs(
    backend: str, scan: bool, counted: bool, request: pytest.FixtureRequest, key_prefix: str
) -> None:
    url = request.getfixturevalue("redis_url") if backend == "redis" else None
    settings = make_settings(backend, url, key_prefix, legacy_end_scan_enabled=scan)
    with serve(settings, backend) as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as client:
            producer = await ProducerClient.claim(client)
            await producer.publish(("token", 1))  # the tail is not an END
            before = await scrape(client)
            await producer.end()
            after_first = await scrape(client)
            await producer.end()  # the tail is the END now: no scan
            after_second = await scrape(client)
    scans = delta(after_first, before, "gateway_legacy_end_scans_total")
    timed = delta(after_first, before, "gateway_legacy_end_scan_seconds_count")
    assert (scans, timed) == ((1, 1) if counted else (0, 0))
    assert delta(after_second, after_first, "gateway_legacy_end_scans_total") == 0
    assert delta(after_second, after_first, "gateway_legacy_end_scan_seconds_count") == 0


# --------------------------------------------------------------------- backend errors


async def test_backend_unavailable_by_route_kind(
    redis_server_factory: Callable[..., RedisServer], key_prefix: str
) -> None:
    redis = redis_server_factory()
    with serve(make_settings("redis", redis.url, key_prefix), "redis") as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as client:
            producer = await ProducerClient.claim(client)
            before = await scrape(client)
            redis.kill()
            claim = await client.post("/v1/runs", json={})
            assert claim.status_code == 503
            status = await client.get(f"/v1/runs/{producer.run_id}")
            assert status.status_code == 503
            assert (await client.get("/readyz")).status_code == 503
            after = await scrape(client)
    moved = {
        kind: delta(after, before, "gateway_backend_unavailable_total", route_kind=kind)
        for kind in ("producer", "subscriber", "ops", "sse")
    }
    assert moved == {"producer": 1, "subscriber": 1, "ops": 1, "sse": 0}


async def test_notifier_reconnects_counted(redis_url: str, key_prefix: str) -> None:
    with serve(make_settings("redis", redis_url, key_prefix), "redis") as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as client:
            before = await scrape(client)
            assert before.value("gateway_redis_notifier_reconnects_total") == 0
            admin: Any = Redis.from_url(redis_url)
            try:
                killed = await admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
                assert killed >= 1
            finally:
                await admin.aclose()
            await until(client, lambda s: s.value("gateway_redis_notifier_reconnects_total") >= 1)


async def test_notifier_reconnects_is_zero_on_memory(key_prefix: str) -> None:
    with serve(make_settings("memory", None, key_prefix), "memory") as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as client:
            samples = await scrape(client)
    assert ("gateway_redis_notifier_reconnects_total", frozenset()) in samples.values


# ----------------------------------------------------------------------------- readyz


def _sha(name: str) -> str:
    return hashlib.sha1(lua_source(name).encode()).hexdigest()


async def test_readyz_reloads_flushed_scripts(redis_url: str, key_prefix: str) -> None:
    shas = [_sha(name) for name in BRIDGE_SCRIPTS + SESSION_SCRIPTS + SESSION_STEPS]
    admin: Any = Redis.from_url(redis_url)
    try:
        with serve(make_settings("redis", redis_url, key_prefix), "redis") as srv:
            async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as client:
                assert (await client.get("/readyz")).json() == {"status": "ready"}
                assert all(await admin.script_exists(*shas))
                await admin.script_flush()
                assert not any(await admin.script_exists(*shas))
                ready = await client.get("/readyz")
                assert ready.status_code == 200 and ready.json() == {"status": "ready"}
                assert all(await admin.script_exists(*shas))
                # and the writes keep working (they would also reload on NOSCRIPT)
                producer = await ProducerClient.claim(client)
                assert len(await producer.publish(("token", 1))) == 1
    finally:
        await admin.aclose()
