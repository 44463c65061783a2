"""Sessions through the producer API on a real server (memory and Redis bridges): the
claim's `input_message` opens the turn, published events build it, END settles it, and
a fresh reader rebuilds the chat from `GET /v1/sessions…` alone."""

from __future__ import annotations

import time

import anyio
import httpx
import pytest

from tests.support import http_server
from tests.support.http_server import RunningServer

gateway_server = http_server.gateway_server
client = http_server.client

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

TIMEOUT = 15.0
MESSAGE = {
    "messageId": "m-1",
    "role": "user",
    "parts": [
        {"kind": "text", "text": "what is the weather?"},
        {"kind": "file", "file": {"name": "a.png", "mimeType": "image/png", "bytes": "aGVsbG8="}},
    ],
    "metadata": {"incognito": True, "secret": "not kept"},
}


async def test_turn_follows_the_producer(client: httpx.AsyncClient) -> None:
    with anyio.fail_after(TIMEOUT):
        claim = await client.post(
            "/v1/runs", json={"session_id": "chat-1", "input_message": MESSAGE}
        )
        assert claim.status_code == 201
        run_id, token = claim.json()["run_id"], claim.json()["producer_token"]
        headers = {"X-Producer-Token": token}
        res = await client.post(
            f"/v1/runs/{run_id}/events",
            json={
                "events": [
                    {"event": "token", "data": {"text": "Sun"}},
                    {"event": "token", "data": {"text": "ny"}},
                ]
            },
            headers=headers,
        )
        assert res.status_code == 200

        # In flight: partial text, non-terminal state, the shaped operator message.
        turns = (await client.get("/v1/sessions/chat-1/turns")).json()["turns"]
        assert len(turns) == 1
        (live,) = turns
        assert live["run_id"] == run_id and live["state"] == "running"
        assert live["text"] == "Sunny"
        opening = live["history"][0]
        assert opening["messageId"] == "m-1" and opening["role"] == "user"
        assert opening["metadata"] == {"incognito": True}
        assert opening["parts"][1]["file"]["omittedBytes"] == 5
        rows = (await client.get("/v1/sessions")).json()["sessions"]
        assert [r["session_id"] for r in rows] == ["chat-1"] and rows[0]["turn_count"] == 1

        await client.post(
            f"/v1/runs/{run_id}/events",
            json={"event": "state", "data": {"state": "input-required"}},
            headers=headers,
        )
        parked = (await client.get("/v1/sessions?parked=true")).json()["sessions"]
        assert parked and parked[0]["last_state"] == "input-required"

        end = await client.post(
            f"/v1/runs/{run_id}/end", json={"status": "success"}, headers=headers
        )
        assert end.status_code == 200
        (done,) = (await client.get("/v1/sessions/chat-1/turns")).json()["turns"]
        assert done["state"] == "success" and done["text"] == "Sunny"


async def test_recovery_end_settles_the_turn(
    client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    with anyio.fail_after(TIMEOUT):
        claim = await client.post(
            "/v1/runs",
            json={"session_id": "chat-2", "lease_seconds": 0.8, "input_message": MESSAGE},
        )
        run_id = claim.json()["run_id"]
        await client.post(
            f"/v1/runs/{run_id}/events",
            json={"event": "token", "data": "x"},
            headers={"X-Producer-Token": claim.json()["producer_token"]},
        )
        # A waiter makes this gateway watch the run; the producer never comes back.
        wait = await client.get(f"/v1/runs/{run_id}/wait", params={"timeout": 10})
        assert wait.status_code == 200 and wait.json()["status"] == "producer_lost"
        deadline = time.monotonic() + 5
        while True:
            (turn,) = (await client.get("/v1/sessions/chat-2/turns")).json()["turns"]
            if turn["state"] == "producer_lost" or time.monotonic() > deadline:
                break
            await anyio.sleep(0.02)
        assert turn["state"] == "producer_lost"


async def test_retired_session_stays_hidden_after_a_late_write(
    client: httpx.AsyncClient,
) -> None:
    with anyio.fail_after(TIMEOUT):
        claim = await client.post(
            "/v1/runs", json={"session_id": "chat-3", "input_message": MESSAGE}
        )
        run_id, token = claim.json()["run_id"], claim.json()["producer_token"]
        res = await client.delete("/v1/sessions/chat-3", params={"retire": "false"})
        assert res.status_code == 409 and res.json()["error"] == "session_active"
        res = await client.delete("/v1/sessions/chat-3")
        assert res.status_code == 200 and res.json()["removed_runs"] == [run_id]
        # The in-flight producer saves again after the deletion.
        await client.post(
            f"/v1/runs/{run_id}/events",
            json={"event": "token", "data": "late"},
            headers={"X-Producer-Token": token},
        )
        assert (await client.get("/v1/sessions/chat-3/turns")).json()["turns"] == []
        rows = (await client.get("/v1/sessions")).json()["sessions"]
        assert "chat-3" not in [r["session_id"] for r in rows]
