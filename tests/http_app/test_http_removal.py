"""Removal under a live producer, through a real server: operator DELETE and session
retirement mid-turn, then more writes. Every reader behind the removal point gets a
gap; nobody continues silently into the later events (memory and Redis)."""

from __future__ import annotations

import anyio
import httpx
import pytest

from gateway.cursor import parse_cursor
from tests.support import http_server
from tests.support.http_server import ProducerClient
from tests.support.sse_client import read_stream

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
gateway_server = http_server.gateway_server
client = http_server.client


async def _reconnect(
    client: httpx.AsyncClient, run_id: str, cursor: str
) -> list[dict[str, object]]:
    with anyio.fail_after(15):
        result = await read_stream(
            client, f"/v1/runs/{run_id}/stream", headers={"Last-Event-ID": cursor}
        )
    assert result.status == 200
    return [{"id": f.id, "event": f.event, "data": f.json()} for f in result.frames if f.is_event]


async def test_delete_of_a_live_run_then_more_writes_gives_old_cursors_a_gap(
    client: httpx.AsyncClient,
) -> None:
    producer = await ProducerClient.claim(client)
    first = await producer.publish(*[("token", i) for i in range(5)])
    assert (await client.delete(f"/v1/runs/{producer.run_id}")).status_code == 204
    later = await producer.publish(*[("token", i) for i in range(5, 8)])
    await producer.end("success")
    assert parse_cursor(later[0]) > parse_cursor(first[-1])  # ids never repeat

    frames = await _reconnect(client, producer.run_id, first[1])
    assert [f["event"] for f in frames] == ["gap"], frames
    gap = frames[0]["data"]
    assert isinstance(gap, dict)
    assert gap["requested_event_id"] == first[1] and gap["reason"] == "stream_removed"
    assert gap["earliest_available_event_id"] == later[0]
    # Rejoining where the gap says continues exactly.
    frames = await _reconnect(client, producer.run_id, later[0])
    assert [f["id"] for f in frames if f["event"] == "token"] == later[1:]
    assert frames[-1]["event"] == "end"


async def test_session_retired_mid_turn_then_more_writes_gives_old_cursors_a_gap(
    client: httpx.AsyncClient,
) -> None:
    producer = await ProducerClient.claim(client, session_id="retire-me")
    first = await producer.publish(*[("token", i) for i in range(3)])
    response = await client.delete("/v1/sessions/retire-me", params={"retire": "true"})
    assert response.status_code == 200 and producer.run_id in response.json()["removed_runs"]
    await producer.publish(("token", "after retirement"))
    frames = await _reconnect(client, producer.run_id, first[0])
    assert [f["event"] for f in frames] == ["gap"], frames


async def test_reconnect_into_an_ended_run_whose_log_was_removed(
    client: httpx.AsyncClient,
) -> None:
    """A cursor before the last event of an ended run whose log is gone gets a gap (it
    missed events), never the END alone; at the last event it gets the END."""
    producer = await ProducerClient.claim(client)
    ids = await producer.publish(*[("token", i) for i in range(4)])
    await producer.end("success")
    assert (await client.delete(f"/v1/runs/{producer.run_id}")).status_code == 204
    assert [f["event"] for f in await _reconnect(client, producer.run_id, ids[1])] == ["gap"]
    assert [f["event"] for f in await _reconnect(client, producer.run_id, ids[-1])] == ["end"]
