"""`X-Producer-Seq` on `POST /v1/runs/{id}/events`, on both bridges, over real HTTP."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support import http_server
from tests.support.http_server import ProducerClient

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]
gateway_server = http_server.gateway_server
client = http_server.client


def tokens(*texts: str) -> dict[str, Any]:
    return {"events": [{"event": "token", "data": {"text": t}} for t in texts]}


async def post(
    client: httpx.AsyncClient, producer: ProducerClient, seq: str | int, body: dict[str, Any]
) -> httpx.Response:
    headers = {"X-Producer-Token": producer.token, "X-Producer-Seq": str(seq)}
    return await client.post(f"/v1/runs/{producer.run_id}/events", json=body, headers=headers)


async def test_numbered_batches_apply_once_and_retries_get_the_first_ids(
    client: httpx.AsyncClient,
) -> None:
    producer = await ProducerClient.claim(client, session_id="seq-chat")
    first = await post(client, producer, 1, tokens("Hello", ", "))
    assert first.status_code == 200, first.text
    ids = first.json()["ids"]
    assert len(ids) == 2
    again = await post(client, producer, 1, tokens("Hello", ", "))
    assert again.status_code == 200 and again.json() == {"ids": ids, "cancel_requested": False}
    single = await post(client, producer, 3, {"event": "token", "data": {"text": "world"}})
    assert single.status_code == 200
    await producer.end()
    run = (await client.get(f"/v1/runs/{producer.run_id}")).json()
    assert run["retained_events"] == 3
    # The turn record took each event once: a retry is not recorded again.
    turns = (await client.get("/v1/sessions/seq-chat/turns")).json()["turns"]
    assert [t["text"] for t in turns] == ["Hello, world"]


async def test_gap_and_unknown_overlap_are_409_and_an_overlap_appends_its_tail(
    client: httpx.AsyncClient,
) -> None:
    producer = await ProducerClient.claim(client)
    gap = await post(client, producer, 2, tokens("a"))
    assert gap.status_code == 409
    body = gap.json()
    assert body["error"] == "sequence_gap" and body["expected_seq"] == 1 and body["detail"]
    assert (await post(client, producer, 1, tokens("a", "b"))).status_code == 200
    third = await post(client, producer, 3, tokens("c"))
    assert third.status_code == 200
    # An overlap reaching past the next number (3.1): only "d" is appended; the reply
    # lists every event's id, the first-assigned one for "c".
    overlap = await post(client, producer, 3, tokens("c", "d"))
    assert overlap.status_code == 200, overlap.text
    ids = overlap.json()["ids"]
    assert len(ids) == 2 and ids[0] == third.json()["ids"][0]
    # An overlap reaching back across an unnumbered write: its ids are not known, a 409.
    unnumbered = {"X-Producer-Token": producer.token}
    path = f"/v1/runs/{producer.run_id}/events"
    assert (await client.post(path, json=tokens("x"), headers=unnumbered)).status_code == 200
    assert (await post(client, producer, 5, tokens("e"))).status_code == 200
    conflict = await post(client, producer, 4, tokens("d", "e"))
    assert conflict.status_code == 409
    assert conflict.json()["error"] == "sequence_conflict"
    assert conflict.json()["expected_seq"] == 6
    run = (await client.get(f"/v1/runs/{producer.run_id}")).json()
    assert run["retained_events"] == 6


@pytest.mark.parametrize(
    "raw", [b"", b"abc", b"0", b"-1", b"1.0", b"+1", "\u0663".encode(), b"9" * 17]
)
async def test_a_malformed_sequence_header_is_422(client: httpx.AsyncClient, raw: bytes) -> None:
    producer = await ProducerClient.claim(client)
    headers = {"X-Producer-Token": producer.token.encode(), "X-Producer-Seq": raw}
    response = await client.post(
        f"/v1/runs/{producer.run_id}/events",
        content=b'{"event": "token", "data": 1}',
        headers={**headers, "Content-Type": b"application/json"},
    )
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "invalid_input"
    assert (await client.get(f"/v1/runs/{producer.run_id}")).json()["retained_events"] == 0


async def test_takeover_restarts_the_numbering_over_http(client: httpx.AsyncClient) -> None:
    old = await ProducerClient.claim(client, run_id="seq-takeover", lease_seconds=30)
    assert (await post(client, old, 1, tokens("x", "y"))).status_code == 200
    new = await ProducerClient.claim(client, run_id="seq-takeover", takeover=True)
    fenced = await post(client, old, 1, tokens("x", "y"))
    assert fenced.status_code == 409 and fenced.json()["error"] == "fenced"
    assert (await post(client, new, 1, tokens("z"))).status_code == 200
