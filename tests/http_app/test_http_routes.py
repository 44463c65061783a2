"""Every JSON route and status code of docs/protocol.md §3, on both bridges."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import orjson
import pytest

from tests.support import http_server
from tests.support.http_server import ProducerClient, RunningServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]
gateway_server = http_server.gateway_server
client = http_server.client


def _error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == code and isinstance(body["detail"], str) and body["detail"]


def _h(producer: ProducerClient) -> dict[str, str]:
    return {"X-Producer-Token": producer.token}


# ------------------------------------------------------------------------------ claim


async def test_claim_generates_run_id_and_stores_session(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/runs",
        json={
            "session_id": "chat-1",
            "lease_seconds": 5,
            "input_message": {"messageId": "m1", "role": "user", "parts": []},
            "metadata": {"k": "v"},
        },
    )
    assert response.status_code == 201
    body = response.json()
    assert len(body["run_id"]) == 32 and body["session_id"] == "chat-1"
    assert body["epoch"] >= 1 and body["producer_token"] and body["lease_expires_at"] > 0
    run = (await client.get(f"/v1/runs/{body['run_id']}")).json()
    assert run["session_id"] == "chat-1" and run["status"] == "running"


async def test_claim_empty_body_is_fine(client: httpx.AsyncClient) -> None:
    empty = {"Content-Type": "application/json"}
    assert (await client.post("/v1/runs", headers=empty)).status_code == 201


async def test_claim_conflicts(client: httpx.AsyncClient) -> None:
    producer = await ProducerClient.claim(client, run_id="r-owned")
    _error(await client.post("/v1/runs", json={"run_id": "r-owned"}), 409, "run_owned")
    taken = await client.post("/v1/runs", json={"run_id": "r-owned", "takeover": True})
    assert taken.status_code == 201
    # The old token is fenced now.
    stale = await client.post(
        "/v1/runs/r-owned/events", json={"event": "x", "data": 1}, headers=_h(producer)
    )
    _error(stale, 409, "fenced")
    fresh = ProducerClient(client, "r-owned", taken.json()["producer_token"])
    await fresh.end()
    _error(await client.post("/v1/runs", json={"run_id": "r-owned"}), 409, "run_ended")


@pytest.mark.parametrize(
    "body",
    [
        {"run_id": "-starts-with-dash"},
        {"run_id": "x" * 129},
        {"run_id": "sp ace"},
        {"run_id": 12},
        {"session_id": "bad/slash"},
        {"lease_seconds": 0},
        {"lease_seconds": -1},
        {"lease_seconds": "10"},
        {"lease_seconds": True},
        {"lease_seconds": 10**9},
        {"takeover": "yes"},
        {"input_message": "hello"},
        {"metadata": [1]},
        {"unknown": 1},
    ],
)
async def test_claim_bad_input_422(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    _error(await client.post("/v1/runs", json=body), 422, "invalid_input")


@pytest.mark.parametrize("raw", [b"{", b"nope", b'{"a": NaN}', b"\xff\xfe", b'"\\ud800"'])
async def test_invalid_json_400(client: httpx.AsyncClient, raw: bytes) -> None:
    response = await client.post(
        "/v1/runs", content=raw, headers={"Content-Type": "application/json"}
    )
    _error(response, 400, "invalid_json")


async def test_non_object_body_422(client: httpx.AsyncClient) -> None:
    _error(await client.post("/v1/runs", json=[1, 2]), 422, "invalid_input")


# ----------------------------------------------------------------------------- events


async def test_publish_single_and_batch(client: httpx.AsyncClient) -> None:
    producer = await ProducerClient.claim(client)
    one = await client.post(
        f"/v1/runs/{producer.run_id}/events", json={"event": "a", "data": 1}, headers=_h(producer)
    )
    assert one.status_code == 200
    assert one.json() == {"ids": [one.json()["ids"][0]], "cancel_requested": False}
    batch = await client.post(
        f"/v1/runs/{producer.run_id}/events",
        json={"events": [{"event": "b", "data": [1]}, {"event": "c"}]},
        headers=_h(producer),
    )
    ids = batch.json()["ids"]
    assert len(ids) == 2 and ids[0] > one.json()["ids"][0]
    run = (await client.get(f"/v1/runs/{producer.run_id}")).json()
    assert run["retained_events"] == 3 and run["last_event_id"] == ids[-1]


@pytest.mark.parametrize(
    "body",
    [
        {"event": "has space", "data": 1},
        {"event": "has:colon", "data": 1},
        {"event": "", "data": 1},
        {"event": "x" * 65, "data": 1},
        {"event": "caf\u00e9", "data": 1},
        {"event": 5, "data": 1},
        {"data": 1},
        {"event": "a", "data": 1, "extra": 2},
        {"events": []},
        {"events": {"event": "a"}},
        {"events": [1]},
        {"events": [{"event": "ok"}], "event": "a"},
        {
            "event": "deep",
            "data": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
        },
    ],
)
async def test_publish_bad_input_422(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    producer = await ProducerClient.claim(client)
    if body.get("event") == "deep":
        nested: Any = []
        for _ in range(300):  # deeper than orjson encodes
            nested = [nested]
        body = {"event": "deep", "data": nested}
    response = await client.post(
        f"/v1/runs/{producer.run_id}/events", json=body, headers=_h(producer)
    )
    _error(response, 422, "invalid_input")


async def test_publish_token_and_state_errors(client: httpx.AsyncClient) -> None:
    producer = await ProducerClient.claim(client)
    url = f"/v1/runs/{producer.run_id}/events"
    _error(await client.post(url, json={"event": "a"}), 422, "missing_producer_token")
    wrong = await client.post(url, json={"event": "a"}, headers={"X-Producer-Token": "nope"})
    _error(wrong, 409, "fenced")
    unknown = await client.post(
        "/v1/runs/never-claimed/events", json={"event": "a"}, headers=_h(producer)
    )
    _error(unknown, 409, "fenced")
    _error(
        await client.post("/v1/runs/-x/events", json={"event": "a"}, headers=_h(producer)),
        422,
        "invalid_input",
    )
    await producer.end()
    _error(await client.post(url, json={"event": "a"}, headers=_h(producer)), 409, "ended")
    lease = await client.post(f"/v1/runs/{producer.run_id}/lease", json={}, headers=_h(producer))
    _error(lease, 409, "ended")


@pytest.mark.gateway_settings(max_body_bytes=2048, max_event_bytes=256, max_batch_events=3)
async def test_limits_413(client: httpx.AsyncClient) -> None:
    producer = await ProducerClient.claim(client)
    url = f"/v1/runs/{producer.run_id}/events"
    big_body = {"event": "a", "data": "x" * 4096}
    _error(await client.post(url, json=big_body, headers=_h(producer)), 413, "too_large")
    big_event = {"event": "a", "data": "x" * 300}
    _error(await client.post(url, json=big_event, headers=_h(producer)), 413, "too_large")
    grown = {"event": "a", "data": orjson.Fragment(b"[" + b",".join([b"1e5"] * 60) + b"]")}
    response = await client.post(
        url,
        content=orjson.dumps(grown),
        headers={**_h(producer), "Content-Type": "application/json"},
    )
    _error(response, 413, "too_large")  # 240 bytes sent, but 600 once encoded
    batch = {"events": [{"event": "a", "data": i} for i in range(4)]}
    _error(await client.post(url, json=batch, headers=_h(producer)), 413, "too_large")
    # Chunked upload without Content-Length is bounded too.

    async def chunks() -> Any:
        for _ in range(10):
            yield b" " * 512

    response = await client.post(
        url, content=chunks(), headers={**_h(producer), "Content-Type": "application/json"}
    )
    _error(response, 413, "too_large")
    ok = {"events": [{"event": "a", "data": "x" * 200} for _ in range(3)]}
    assert (await client.post(url, json=ok, headers=_h(producer))).status_code == 200


# ------------------------------------------------------------------------- end, lease


async def test_end_and_dedup(client: httpx.AsyncClient) -> None:
    producer = await ProducerClient.claim(client)
    first = await producer.end("error", {"message": "boom"})
    assert first["id"] and first["deduplicated"] is False
    again = await producer.end("success")
    assert again == {"id": first["id"], "deduplicated": True}
    run = (await client.get(f"/v1/runs/{producer.run_id}")).json()
    assert run["status"] == "error" and run["error"] == {"message": "boom"}


@pytest.mark.parametrize(
    "body",
    [
        {"status": "done"},
        {},
        {"status": 1},
        {"status": "error", "error": "text"},
        {"status": "success", "x": 1},
    ],
)
async def test_end_bad_input_422(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    producer = await ProducerClient.claim(client)
    response = await client.post(f"/v1/runs/{producer.run_id}/end", json=body, headers=_h(producer))
    _error(response, 422, "invalid_input")


async def test_lease_renewal(client: httpx.AsyncClient) -> None:
    producer = await ProducerClient.claim(client, lease_seconds=5)
    url = f"/v1/runs/{producer.run_id}/lease"
    response = await client.post(url, json={"lease_seconds": 60}, headers=_h(producer))
    assert response.status_code == 200
    body = response.json()
    assert body["cancel_requested"] is False and body["lease_expires_at"] > 0
    _error(
        await client.post(url, json={"lease_seconds": -3}, headers=_h(producer)),
        422,
        "invalid_input",
    )
    _error(await client.post(url, json={}, headers={"X-Producer-Token": "bad"}), 409, "fenced")


async def test_cancel_is_seen_in_next_publish_and_lease_reply(client: httpx.AsyncClient) -> None:
    producer = await ProducerClient.claim(client)
    cancel = await client.post(f"/v1/runs/{producer.run_id}/cancel", json={})
    assert cancel.status_code == 202 and cancel.json()["cancel_requested"] is True
    published = await client.post(
        f"/v1/runs/{producer.run_id}/events", json={"event": "a"}, headers=_h(producer)
    )
    assert published.json()["cancel_requested"] is True
    lease = await client.post(f"/v1/runs/{producer.run_id}/lease", json={}, headers=_h(producer))
    assert lease.json()["cancel_requested"] is True
    assert (await client.get(f"/v1/runs/{producer.run_id}")).json()["cancel_requested"] is True
    _error(await client.post("/v1/runs/nope/cancel", json={}), 404, "run_not_found")


# --------------------------------------------------------------------- reads, delete


async def test_get_run_fields_and_404(client: httpx.AsyncClient) -> None:
    producer = await ProducerClient.claim(client, session_id="s")
    ids = await producer.publish(("a", 1), ("b", 2))
    run = (await client.get(f"/v1/runs/{producer.run_id}")).json()
    assert run["first_event_id"] == ids[0] and run["last_event_id"] == ids[1]
    assert set(run) == {
        "run_id",
        "session_id",
        "status",
        "created_at",
        "updated_at",
        "first_event_id",
        "last_event_id",
        "retained_events",
        "cancel_requested",
        "error",
    }
    _error(await client.get("/v1/runs/unknown"), 404, "run_not_found")
    _error(await client.get("/v1/runs/bad%20id"), 422, "invalid_input")


async def test_delete_run(client: httpx.AsyncClient) -> None:
    producer = await ProducerClient.claim(client)
    await producer.publish(("a", 1))
    await producer.end()
    response = await client.delete(f"/v1/runs/{producer.run_id}")
    assert response.status_code == 204 and response.content == b""
    run = (await client.get(f"/v1/runs/{producer.run_id}")).json()
    assert run["status"] == "success" and run["retained_events"] == 0
    _error(await client.delete("/v1/runs/unknown"), 404, "run_not_found")


# ------------------------------------------------------------------------------ /wait


async def test_wait_returns_at_end(client: httpx.AsyncClient) -> None:
    producer = await ProducerClient.claim(client)
    ids = await producer.publish(("a", 1))
    result: list[httpx.Response] = []

    async def wait() -> None:
        result.append(await client.get(f"/v1/runs/{producer.run_id}/wait", params={"timeout": 20}))

    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            more = await producer.publish(("a", 2))
            await producer.end("cancelled")
    assert result[0].status_code == 200
    assert result[0].json() == {"status": "cancelled", "last_event_id": more[-1]}
    assert ids[0] < more[-1]
    # Already ended: answers at once.
    again = await client.get(f"/v1/runs/{producer.run_id}/wait")
    assert again.json() == {"status": "cancelled", "last_event_id": more[-1]}


async def test_wait_times_out_with_202(client: httpx.AsyncClient) -> None:
    producer = await ProducerClient.claim(client)
    response = await client.get(f"/v1/runs/{producer.run_id}/wait", params={"timeout": "0.2"})
    assert response.status_code == 202 and response.json() == {"status": "running"}


@pytest.mark.parametrize("bad", ["abc", "-1", "nan", "inf", "1e999"])
async def test_wait_bad_timeout_422(client: httpx.AsyncClient, bad: str) -> None:
    producer = await ProducerClient.claim(client)
    response = await client.get(f"/v1/runs/{producer.run_id}/wait", params={"timeout": bad})
    _error(response, 422, "invalid_input")


async def test_wait_unknown_run_404(client: httpx.AsyncClient) -> None:
    _error(await client.get("/v1/runs/unknown/wait"), 404, "run_not_found")


async def test_wait_after_removal_of_ended_run(client: httpx.AsyncClient) -> None:
    producer = await ProducerClient.claim(client)
    await producer.publish(("a", 1))
    await producer.end()
    await client.delete(f"/v1/runs/{producer.run_id}")
    response = await client.get(f"/v1/runs/{producer.run_id}/wait", params={"timeout": 5})
    assert response.status_code == 200 and response.json()["status"] == "success"


async def test_wait_survives_removal_of_a_running_log(client: httpx.AsyncClient) -> None:
    """After a stream_removed gap the status is refreshed: still running → keep waiting."""
    producer = await ProducerClient.claim(client)
    await producer.publish(("a", 1))
    result: list[httpx.Response] = []

    async def wait() -> None:
        result.append(await client.get(f"/v1/runs/{producer.run_id}/wait", params={"timeout": 20}))

    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            assert (await client.delete(f"/v1/runs/{producer.run_id}")).status_code == 204
            await producer.publish(("a", 2))
            await producer.end()
    assert result[0].status_code == 200 and result[0].json()["status"] == "success"


# -------------------------------------------------------------------------------- ops


async def test_health_ready_metrics(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    assert (await client.get("/readyz")).json() == {"status": "ready"}
    producer = await ProducerClient.claim(client)
    await producer.publish(("a", 1))
    metrics = (await client.get("/metrics")).text
    assert "gateway_sse_open_subscribers 0.0" in metrics
    assert "gateway_events_published_total" in metrics
    assert "gateway_events_delivered_total" in metrics


async def test_unknown_route_and_method_are_json_errors(client: httpx.AsyncClient) -> None:
    _error(await client.get("/nope"), 404, "not_found")
    _error(await client.put("/v1/runs"), 405, "method_not_allowed")


async def test_openapi_lists_every_route(
    client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    document = (await client.get("/openapi.json")).json()
    assert document["openapi"].startswith("3.")
    paths = document["paths"]
    for path in [
        "/v1/runs",
        "/v1/runs/{run_id}",
        "/v1/runs/{run_id}/events",
        "/v1/runs/{run_id}/end",
        "/v1/runs/{run_id}/lease",
        "/v1/runs/{run_id}/stream",
        "/v1/runs/{run_id}/wait",
        "/v1/runs/{run_id}/cancel",
        "/threads/{session_id}/runs/{run_id}",
        "/threads/{session_id}/runs/{run_id}/stream",
        "/threads/{session_id}/runs/{run_id}/join",
        "/healthz",
        "/readyz",
        "/metrics",
    ]:
        assert path in paths, path
    assert "204" in paths["/v1/runs/{run_id}"]["delete"]["responses"]
    assert {"200", "202", "404", "422"} <= set(paths["/v1/runs/{run_id}/wait"]["get"]["responses"])
