"""`POST /v1/runs` with an idempotency key, through the real server on both backends:
a double submit, a retried request or a second tab gets `409 turn_exists` with the run
already started, never a second run."""

from __future__ import annotations

import anyio
import httpx
import pytest

from tests.support import http_server

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(40)]
gateway_server = http_server.gateway_server
client = http_server.client


async def test_second_claim_with_the_key_is_turn_exists(client: httpx.AsyncClient) -> None:
    first = await client.post("/v1/runs", json={"session_id": "chat", "idempotency_key": "m-1"})
    assert first.status_code == 201, first.text
    run_id = first.json()["run_id"]
    # the header says the same
    again = await client.post(
        "/v1/runs", json={"session_id": "chat"}, headers={"Idempotency-Key": "m-1"}
    )
    assert again.status_code == 409
    body = again.json()
    assert body["error"] == "turn_exists" and body["run_id"] == run_id
    assert "producer_token" not in body and body["detail"]
    # both, agreeing
    same = await client.post(
        "/v1/runs",
        json={"session_id": "chat", "idempotency_key": "m-1"},
        headers={"Idempotency-Key": "m-1"},
    )
    assert same.status_code == 409 and same.json()["run_id"] == run_id
    sessions = await client.get("/v1/sessions/chat/turns")
    assert [t["run_id"] for t in sessions.json()["turns"]] == [run_id]


async def test_claim_key_bad_requests(client: httpx.AsyncClient) -> None:
    differ = await client.post(
        "/v1/runs",
        json={"session_id": "chat", "idempotency_key": "a"},
        headers={"Idempotency-Key": "b"},
    )
    assert differ.status_code == 400 and differ.json()["error"] == "invalid_request"
    for body, headers in (
        ({"session_id": "chat", "idempotency_key": "has space"}, {}),
        ({"session_id": "chat", "idempotency_key": 5}, {}),
        ({"session_id": "chat"}, {"Idempotency-Key": "x" * 201}),
        ({"idempotency_key": "k"}, {}),  # no session
    ):
        refused = await client.post("/v1/runs", json=body, headers=headers)
        assert refused.status_code == 422, (body, refused.text)
        assert refused.json()["error"] == "invalid_input"


async def test_concurrent_double_submit_starts_one_run(client: httpx.AsyncClient) -> None:
    answers: list[httpx.Response] = []

    async def submit() -> None:
        answers.append(
            await client.post("/v1/runs", json={"session_id": "tabs", "idempotency_key": "m-9"})
        )

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(submit)
    created = [a for a in answers if a.status_code == 201]
    assert len(created) == 1, [a.text for a in answers]
    run_id = created[0].json()["run_id"]
    assert sorted(a.status_code for a in answers) == [201] + [409] * 5
    assert {a.json()["run_id"] for a in answers} == {run_id}
    turns = (await client.get("/v1/sessions/tabs/turns")).json()["turns"]
    assert [t["run_id"] for t in turns] == [run_id]
