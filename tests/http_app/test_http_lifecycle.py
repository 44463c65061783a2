"""Graceful shutdown, subscriber-side backend failure, and auth wired into the routes."""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio
import httpx
import pytest

from gateway.http.edge.auth import mint_subscriber_token
from tests.support.http_server import ProducerClient, make_settings, serve
from tests.support.redis_servers import RedisServer
from tests.support.sse_client import Frame, iter_frames

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_graceful_shutdown_ends_sse_cleanly_and_resume_elsewhere(
    backend: str, request: pytest.FixtureRequest, key_prefix: str
) -> None:
    url = request.getfixturevalue("redis_url") if backend == "redis" else None
    settings = make_settings(backend, url, key_prefix)
    with serve(settings, backend) as a, serve(settings, backend) as b:
        async with httpx.AsyncClient(base_url=a.base_url, timeout=10) as ca:
            producer = await ProducerClient.claim(ca)
            ids = await producer.publish(*[("token", i) for i in range(3)])
            frames: list[Frame] = []
            with anyio.fail_after(10):
                async with ca.stream("GET", f"/v1/runs/{producer.run_id}/stream") as response:
                    async for frame in iter_frames(response):
                        frames.append(frame)
                        if frame.id == ids[-1]:
                            a.server.should_exit = True  # SIGTERM-equivalent
            # Ended cleanly: no terminal frame, every frame complete, nothing after the cut.
            assert [f.data_id for f in frames if f.data_id] == ids
            assert not any(f.event in ("end", "gap") for f in frames)
            assert frames[-1].comments and frames[-1].comments[0].startswith(b"shutdown")
        if backend == "memory":
            return  # the log lived in the stopped process
        async with httpx.AsyncClient(base_url=b.base_url, timeout=10) as cb:
            more = await ProducerClient(cb, producer.run_id, producer.token).publish(("token", 9))
            await ProducerClient(cb, producer.run_id, producer.token).end()
            async with cb.stream(
                "GET", f"/v1/runs/{producer.run_id}/stream", headers={"Last-Event-ID": ids[-1]}
            ) as response:
                rest = [f async for f in iter_frames(response)]
    assert [f.data_id for f in rest if f.data_id] == more
    assert rest[-1].event == "end"


async def test_subscriber_backend_failure_ends_with_unavailable_frame(
    redis_server_factory: Callable[..., RedisServer], key_prefix: str
) -> None:
    redis = redis_server_factory("--appendonly", "yes", "--appendfsync", "always")
    settings = make_settings("redis", redis.url, key_prefix)
    with serve(settings, "redis") as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as client:
            producer = await ProducerClient.claim(client, lease_seconds=120)
            ids = await producer.publish(("token", 0))
            frames: list[Frame] = []
            with anyio.fail_after(20):
                async with client.stream("GET", f"/v1/runs/{producer.run_id}/stream") as r:
                    async for frame in iter_frames(r):
                        frames.append(frame)
                        if frame.id == ids[0]:
                            redis.kill()
            last = frames[-1]
            assert last.event == "unavailable" and last.id is None
            assert last.json()["code"] == "backend_unavailable"
            srv.wait_open_sse(0)
            redis.restart()
            # The producer was never cancelled: it carries on once Redis is back.
            more = await producer.publish(("token", 1))
            run = (await client.get(f"/v1/runs/{producer.run_id}")).json()
            assert run["status"] == "running" and run["cancel_requested"] is False
            assert more[0] > ids[0]


async def test_readyz_reports_backend_down(
    redis_server_factory: Callable[..., RedisServer], key_prefix: str
) -> None:
    redis = redis_server_factory()
    with serve(make_settings("redis", redis.url, key_prefix), "redis") as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as client:
            assert (await client.get("/readyz")).status_code == 200
            redis.kill()
            response = await client.get("/readyz")
            assert response.status_code == 503 and "retry-after" in response.headers
            assert response.json()["error"] == "backend_unavailable"
            claim = await client.post("/v1/runs", json={})
            assert claim.status_code == 503 and claim.json()["error"] == "backend_unavailable"


SECRET = "s" * 40


async def test_auth_on_every_kind_of_route(key_prefix: str) -> None:
    settings = make_settings("memory", None, key_prefix, api_keys=("k1",), jwt_secret=SECRET)
    key = {"Authorization": "Bearer k1"}
    with serve(settings) as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as client:
            assert (await client.post("/v1/runs", json={})).status_code == 401
            assert (
                await client.post("/v1/runs", json={}, headers={"Authorization": "Bearer x"})
            ).status_code == 401
            a = (await client.post("/v1/runs", json={"session_id": "sa"}, headers=key)).json()
            b = (await client.post("/v1/runs", json={}, headers=key)).json()
            token_a = mint_subscriber_token(SECRET, runs=[a["run_id"]])
            by_session = mint_subscriber_token(SECRET, sessions=["sa"])
            expired = mint_subscriber_token(SECRET, runs=[a["run_id"]], now=time.time() - 7200)
            bearer = {"Authorization": f"Bearer {token_a}"}
            assert (await client.get(f"/v1/runs/{a['run_id']}", headers=bearer)).status_code == 200
            forbidden = await client.get(f"/v1/runs/{b['run_id']}", headers=bearer)
            assert forbidden.status_code == 403 and forbidden.json()["error"] == "forbidden"
            assert (await client.get("/v1/runs/unknown", headers=bearer)).status_code == 403
            assert (await client.get("/v1/runs/unknown", headers=key)).status_code == 404
            gone = await client.get(f"/v1/runs/{a['run_id']}", params={"access_token": expired})
            assert gone.status_code == 401 and gone.json()["error"] == "token_expired"
            assert (await client.get(f"/v1/runs/{a['run_id']}")).status_code == 401
            session_read = await client.get(
                f"/threads/sa/runs/{a['run_id']}", params={"access_token": by_session}
            )
            assert session_read.status_code == 200
            # A subscriber token never writes or deletes.
            assert (await client.post("/v1/runs", json={}, headers=bearer)).status_code == 403
            assert (
                await client.delete(f"/v1/runs/{a['run_id']}", headers=bearer)
            ).status_code == 403
            # The stream takes ?access_token= (EventSource cannot set headers).
            await client.post(
                f"/v1/runs/{a['run_id']}/end",
                json={"status": "success"},
                headers={**key, "X-Producer-Token": a["producer_token"]},
            )
            async with client.stream(
                "GET", f"/v1/runs/{a['run_id']}/stream", params={"access_token": token_a}
            ) as response:
                assert response.status_code == 200
                frames = [f async for f in iter_frames(response)]
            assert frames[-1].event == "end"
            async with client.stream(
                "GET", f"/v1/runs/{b['run_id']}/stream", params={"access_token": token_a}
            ) as response:
                assert response.status_code == 403
