"""`GET /v1/sessions/{id}/ui-stream`: AI SDK UI message streams, on both bridges.

The AI SDK itself drives this route in tests/js/ai_sdk.test.mjs (tests/system/test_js_client.py);
here the wire is checked byte by byte.
"""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import orjson
import pytest

from gateway.http.edge.auth import mint_subscriber_token
from gateway.values import encode_json
from tests.support import http_server
from tests.support.http_server import ProducerClient, make_settings, serve

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]
gateway_server = http_server.gateway_server
client = http_server.client

CHUNKS: list[dict[str, Any]] = [
    {"type": "start", "messageId": "m1"},
    {"type": "start-step"},
    {"type": "text-start", "id": "t1"},
    {"type": "text-delta", "id": "t1", "delta": "Hel"},
    {"type": "text-delta", "id": "t1", "delta": "lo, "},
    {"type": "text-delta", "id": "t1", "delta": "wörld \u2028✓"},
    {"type": "text-end", "id": "t1"},
    {"type": "finish-step"},
    {"type": "finish"},
]


def _url(session_id: str) -> str:
    return f"/v1/sessions/{session_id}/ui-stream"


async def _publish(producer: ProducerClient, chunks: list[dict[str, Any]]) -> None:
    await producer.publish(*[("ui", chunk) for chunk in chunks])


async def _read(client: httpx.AsyncClient, session_id: str) -> tuple[httpx.Response, bytes]:
    async with client.stream("GET", _url(session_id)) as response:
        body = await response.aread()
    return response, body


def _data_lines(body: bytes) -> list[bytes]:
    """The `data:` payloads, asserting every frame is exactly one `data:` line."""
    out = []
    for frame in body.split(b"\n\n"):
        lines = [line for line in frame.split(b"\n") if line and not line.startswith(b":")]
        if not lines:
            continue
        assert len(lines) == 1 and lines[0].startswith(b"data: "), frame
        out.append(lines[0][len(b"data: ") :])
    return out


async def test_no_running_turn_is_204(client: httpx.AsyncClient) -> None:
    for session_id in ("never-seen", "ui-ended"):
        if session_id == "ui-ended":
            producer = await ProducerClient.claim(client, session_id=session_id)
            await _publish(producer, CHUNKS[:2])
            await producer.end()
        response = await client.get(_url(session_id))
        assert response.status_code == 204 and response.content == b"", session_id
    bad = await client.get(_url("-bad"))
    assert bad.status_code == 422 and bad.json()["error"] == "invalid_input"


async def test_running_turn_replays_from_its_first_chunk_then_done(
    client: httpx.AsyncClient,
) -> None:
    producer = await ProducerClient.claim(client, session_id="ui-live")
    await _publish(producer, CHUNKS[:4])
    await producer.publish(("state", {"state": "running"}))  # not a UI chunk: left out
    async with client.stream("GET", _url("ui-live")) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
        body = b""
        published = False
        async for chunk in response.aiter_raw():
            body += chunk
            if not published and len(_data_lines(body)) == 4:
                # Live from here: the rest arrives as it is published.
                await _publish(producer, CHUNKS[4:])
                await producer.end()
                published = True
    lines = _data_lines(body)
    # (the gateway's one payload encoding: line separators escaped, docs/api.md)
    assert lines[:-1] == [encode_json(chunk) for chunk in CHUNKS]
    assert lines[-1] == b"[DONE]"
    assert b"retry:" not in body and b"event:" not in body and b"id:" not in body
    # The turn record understands the same chunks.
    (turn,) = (await client.get("/v1/sessions/ui-live/turns")).json()["turns"]
    assert turn["text"] == "Hello, wörld \u2028✓" and turn["state"] == "success"


@pytest.mark.parametrize("status", ["error", "cancelled", "producer_lost"])
async def test_other_end_statuses_are_an_error_chunk(
    client: httpx.AsyncClient, status: str
) -> None:
    session_id = f"ui-{status.replace('_', '-')}"
    producer = await ProducerClient.claim(client, session_id=session_id)
    await _publish(producer, CHUNKS[:4])
    async with client.stream("GET", _url(session_id)) as response:
        assert response.status_code == 200
        await producer.end(status, {"message": "model overloaded"})
        body = await response.aread()
    lines = _data_lines(body)
    assert lines[:-1] == [encode_json(chunk) for chunk in CHUNKS[:4]]
    last = orjson.loads(lines[-1])
    assert last["type"] == "error" and status in last["errorText"]
    assert "model overloaded" in last["errorText"]


@pytest.mark.gateway_settings(max_events_per_run=3)
async def test_a_turn_that_lost_its_first_chunks_is_a_gap_never_a_partial_message(
    client: httpx.AsyncClient,
) -> None:
    producer = await ProducerClient.claim(client, session_id="ui-trimmed")
    for chunk in CHUNKS[:6]:  # one by one, so Redis approximate trimming has to act
        await _publish(producer, [chunk])
    run = (await client.get(f"/v1/runs/{producer.run_id}")).json()
    assert run["retained_events"] <= 4
    response, body = await _read(client, "ui-trimmed")
    assert response.status_code == 200
    (line,) = _data_lines(body)
    gap = orjson.loads(line)
    assert gap["type"] == "error" and "no longer retained" in gap["errorText"]


async def test_a_session_token_for_another_session_is_refused(key_prefix: str) -> None:
    secret = "ui-stream-secret-with-enough-bytes-for-hs256"
    settings = make_settings("memory", None, key_prefix, api_keys=("k",), jwt_secret=secret)
    with serve(settings) as srv:
        auth = {"Authorization": "Bearer k"}
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=10, headers=auth) as c:
            producer = await ProducerClient.claim(c, session_id="ui-mine")
            await _publish(producer, CHUNKS[:2])
            mine = mint_subscriber_token(secret, sessions=["ui-mine"])
            other = mint_subscriber_token(secret, sessions=["ui-other"])
            url = _url("ui-mine")
            async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as reader:
                refused = await reader.get(url, params={"access_token": other})
                assert refused.status_code == 403
                missing = await reader.get(url)
                assert missing.status_code == 401
                async with reader.stream("GET", url, params={"access_token": mine}) as ok:
                    assert ok.status_code == 200
            await producer.end()


async def test_graceful_shutdown_is_an_interrupted_stream(key_prefix: str) -> None:
    """No `[DONE]`, no error chunk, no clean end: the SDK must not see a finished answer."""
    with serve(make_settings("memory", None, key_prefix)) as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as c:
            producer = await ProducerClient.claim(c, session_id="ui-drain")
            await _publish(producer, CHUNKS[:3])
            body = b""
            with anyio.fail_after(10), pytest.raises(httpx.RemoteProtocolError):
                async with c.stream("GET", _url("ui-drain")) as response:
                    async for chunk in response.aiter_raw():
                        body += chunk
                        if len(_data_lines(body)) == 3:
                            srv.server.should_exit = True  # SIGTERM-equivalent
    assert _data_lines(body) == [orjson.dumps(chunk) for chunk in CHUNKS[:3]]


async def test_the_error_chunk_goes_through_the_one_encoder(client: httpx.AsyncClient) -> None:
    """Issue #25 item 7: no frame carries a raw U+2028, U+2029 or U+0085, the error chunk
    (built from the producer's END error) included."""
    producer = await ProducerClient.claim(client, session_id="ui-separators")
    await _publish(producer, CHUNKS[:2])
    async with client.stream("GET", _url("ui-separators")) as response:
        assert response.status_code == 200
        await producer.end("error", {"message": "line\u2028break\u2029and\u0085more"})
        body = await response.aread()
    for raw in ("\u2028", "\u2029", "\u0085"):
        assert raw.encode() not in body
    last = orjson.loads(_data_lines(body)[-1])
    assert "line\u2028break\u2029and\u0085more" in last["errorText"]


UI_SECRET = "ui-expiry-secret-with-enough-bytes-for-hs256"


@pytest.mark.gateway_settings(jwt_secret=UI_SECRET, api_keys=("expiry-key",))
async def test_the_ui_stream_ends_when_its_token_expires(
    gateway_server: http_server.RunningServer,
) -> None:
    """Issue #25 item 5: like the run stream; as an interrupted stream (no `[DONE]`, no
    error chunk), which the page resumes with a fresh token."""
    secret = UI_SECRET
    auth = {"Authorization": "Bearer expiry-key"}
    async with (
        httpx.AsyncClient(base_url=gateway_server.base_url, timeout=15, headers=auth) as p,
        httpx.AsyncClient(base_url=gateway_server.base_url, timeout=15) as c,
    ):
        producer = await ProducerClient.claim(p, session_id="ui-expiry")
        await _publish(producer, CHUNKS[:2])
        token = mint_subscriber_token(secret, sessions=["ui-expiry"], ttl_seconds=1.5)
        body = b""
        with anyio.fail_after(15), pytest.raises(httpx.RemoteProtocolError):
            async with c.stream("GET", _url("ui-expiry"), params={"access_token": token}) as r:
                assert r.status_code == 200
                async for chunk in r.aiter_raw():
                    body += chunk
        assert _data_lines(body) == [encode_json(chunk) for chunk in CHUNKS[:2]]
        await producer.end()
