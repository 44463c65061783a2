"""A numbered batch that overlaps what was applied folds only its new tail into the turn
record, on both bridges (PROTOCOL 3.1 with 6: the record always says what the log holds)."""

from __future__ import annotations

import httpx
import pytest

from tests.support import http_server
from tests.support.http_server import ProducerClient

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]
gateway_server = http_server.gateway_server
client = http_server.client


async def post(producer: ProducerClient, seq: int, *texts: str) -> httpx.Response:
    body = {"events": [{"event": "token", "data": {"text": t}} for t in texts]}
    headers = {"X-Producer-Token": producer.token, "X-Producer-Seq": str(seq)}
    return await producer.client.post(
        f"/v1/runs/{producer.run_id}/events", json=body, headers=headers
    )


async def test_an_overlapping_batch_adds_only_its_tail_to_the_turn(
    client: httpx.AsyncClient,
) -> None:
    producer = await ProducerClient.claim(client, session_id="overlap-chat")
    first = await post(producer, 1, "a", "b")
    assert first.status_code == 200, first.text
    # a retry after a lost reply that also carries the next events
    again = await post(producer, 1, "a", "b", "c")
    assert again.status_code == 200, again.text
    ids = again.json()["ids"]
    assert ids[:2] == first.json()["ids"] and len(ids) == 3
    duplicate = await post(producer, 2, "b", "c")  # all applied: changes nothing
    assert duplicate.json()["ids"] == ids[1:]
    await producer.end()
    turns = (await client.get("/v1/sessions/overlap-chat/turns")).json()["turns"]
    [turn] = [t for t in turns if t["run_id"] == producer.run_id]
    assert turn["text"] == "abc" and turn["state"] == "success"
