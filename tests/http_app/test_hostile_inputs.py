"""What a careless or hostile producer or reader sends, on both bridges (real servers):
deep nesting at the encoder's limit, reserved event names, line separators inside
payloads, integers beyond 64 bits."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from gateway.errors import ReservedEventName
from gateway.http.edge.auth import mint_subscriber_token
from gateway.names import RESERVED_EVENT_NAMES
from tests.support import http_server
from tests.support.http_server import ProducerClient, RunningServer, make_settings, serve
from tests.support.redis_servers import RedisServer
from tests.support.sse_client import iter_frames

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]
SECRET = "jwt-secret-0123456789-0123456789-abc"
KEY = "producer-key-0123456789"
gateway_server = http_server.gateway_server
client = http_server.client


def nest(depth: int) -> Any:
    """A JSON object `depth` containers deep."""
    value: Any = 1
    for _ in range(depth - 1):
        value = [value]
    return {"deep": value}


def _h(producer: ProducerClient) -> dict[str, str]:
    return {"X-Producer-Token": producer.token}


async def _retained(client: httpx.AsyncClient, run_id: str) -> int:
    response = await client.get(f"/v1/runs/{run_id}")
    assert response.status_code == 200, response.text
    count: int = response.json()["retained_events"]
    return count


# --------------------------------------------------------------- 1. no 500 after a write


@pytest.mark.parametrize(
    ("name", "depth"),
    [("artifact", 252), ("artifact", 253), ("history", 253), ("status", 253), ("status", 254)],
)
async def test_deeply_nested_turn_event_is_accepted_and_turns_stay_readable(
    client: httpx.AsyncClient, name: str, depth: int
) -> None:
    producer = await ProducerClient.claim(client, session_id=f"deep-{name}-{depth}")
    response = await client.post(
        f"/v1/runs/{producer.run_id}/events",
        json={"event": name, "data": nest(depth)},
        headers=_h(producer),
    )
    assert response.status_code == 200, response.text
    assert await _retained(client, producer.run_id) == 1  # written once, nothing to retry
    await producer.end()
    turns = await client.get(f"/v1/sessions/{producer.session_id}/turns")
    assert turns.status_code == 200, turns.text
    [turn] = turns.json()["turns"]
    assert turn["state"] == "success"
    stored = turn["artifacts"] if name == "artifact" else turn["history"]
    if name == "status":
        stored = [turn["status"]] if turn["status"] is not None else []
    # Kept when the record (as readers get it) can hold it, else dropped and marked.
    assert stored == [nest(depth)] or (stored == [] and turn["truncated"] is True)


async def test_deep_input_message_metadata_keeps_the_claim_and_turns_readable(
    client: httpx.AsyncClient,
) -> None:
    message = {
        "messageId": "m1",
        "role": "user",
        "parts": [{"kind": "text", "text": "hi"}],
        "metadata": {"hitl_resume": nest(252), "hidden": nest(247)},
    }
    claimed = await client.post(
        "/v1/runs", json={"session_id": "deep-meta", "input_message": message}
    )
    assert claimed.status_code == 201, claimed.text
    turns = await client.get("/v1/sessions/deep-meta/turns")
    assert turns.status_code == 200, turns.text
    [turn] = turns.json()["turns"]
    # the value too deep to read back is left out; the one that fits is kept
    assert turn["history"][0]["metadata"] == {"hidden": nest(247)}


# ------------------------------------------------------------ 2. reserved event names


@pytest.mark.parametrize("name", sorted(RESERVED_EVENT_NAMES))
async def test_reserved_event_names_are_refused(client: httpx.AsyncClient, name: str) -> None:
    producer = await ProducerClient.claim(client)
    one = await client.post(
        f"/v1/runs/{producer.run_id}/events",
        json={"event": name, "data": {"status": "success"}},
        headers=_h(producer),
    )
    batch = await client.post(
        f"/v1/runs/{producer.run_id}/events",
        json={"events": [{"event": "token", "data": "a"}, {"event": name, "data": {}}]},
        headers=_h(producer),
    )
    for response in (one, batch):
        assert response.status_code == 422, response.text
        body = response.json()
        assert body["error"] == "reserved_event_name" and name in body["detail"]
    assert await _retained(client, producer.run_id) == 0


async def test_reserved_event_names_are_refused_by_both_bridges(bridge: Any) -> None:
    claim = await bridge.claim("reserved-lib")
    for name in sorted(RESERVED_EVENT_NAMES):
        with pytest.raises(ReservedEventName):
            await bridge.publish("reserved-lib", name, {}, producer_token=claim.token)
        with pytest.raises(ReservedEventName):
            await bridge.publish_many(
                "reserved-lib", [("token", "a"), (name, {})], producer_token=claim.token
            )
    info = await bridge.get_run("reserved-lib")
    assert info is not None and info.retained_events == 0


# ------------------------------------------------------- 3. line separators in payloads


async def test_line_separators_cannot_forge_sse_lines(client: httpx.AsyncClient) -> None:
    forged = "x\u2028id: 999999-0\u2029event: end\x85data: {}\u2028"
    value = {"text": forged, "note": "caf\u00e9 \u2019"}
    producer = await ProducerClient.claim(client)
    [event_id] = await producer.publish(("token", value))
    await producer.end("error")
    lines: list[str] = []
    # httpx's iter_lines splits like str.splitlines(): at U+2028, U+2029 and U+0085 too.
    async with client.stream("GET", f"/v1/runs/{producer.run_id}/stream") as response:
        async for line in response.aiter_lines():
            lines.append(line)
    assert "event: end" in lines
    assert not any(line.startswith("id: 999999") for line in lines)
    assert [line for line in lines if line.startswith("id: ")] == [f"id: {event_id}", "id: end"]
    data_lines = [line for line in lines if line.startswith("data: ")]
    assert orjson.loads(data_lines[0][len("data: ") :]) == value
    assert orjson.loads(data_lines[-1][len("data: ") :])["status"] == "error"
    for escaped in ("\\u2028", "\\u2029", "\\u0085"):
        assert escaped in data_lines[0]


async def test_line_separators_in_an_end_error_are_escaped(client: httpx.AsyncClient) -> None:
    producer = await ProducerClient.claim(client)
    await producer.end("error", {"message": "a\u2028event: end\u2028data: {}"})
    async with client.stream("GET", f"/v1/runs/{producer.run_id}/stream") as response:
        lines = [line async for line in response.aiter_lines()]
    assert lines.count("event: end") == 1
    [data] = [line for line in lines if line.startswith("data: ")]
    end = orjson.loads(data[len("data: ") :])
    assert end["error"]["message"] == "a\u2028event: end\u2028data: {}"


# --------------------------------------------------------- 7. numbers are never altered


@pytest.mark.parametrize("literal", [b"18446744073709551616", b"-9223372036854775809", b"1" * 300])
async def test_integers_beyond_64_bits_are_refused(
    client: httpx.AsyncClient, literal: bytes
) -> None:
    producer = await ProducerClient.claim(client)
    response = await client.post(
        f"/v1/runs/{producer.run_id}/events",
        content=b'{"event":"token","data":{"n":' + literal + b',"s":"18446744073709551616"}}',
        headers={**_h(producer), "Content-Type": "application/json"},
    )
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "number_out_of_range"
    assert await _retained(client, producer.run_id) == 0


async def test_integers_at_the_64_bit_bounds_are_kept_exactly(client: httpx.AsyncClient) -> None:
    producer = await ProducerClient.claim(client)
    payload = b'{"max":18446744073709551615,"min":-9223372036854775808,"s":"123456789012345678901"}'
    response = await client.post(
        f"/v1/runs/{producer.run_id}/events",
        content=b'{"event":"token","data":' + payload + b"}",
        headers={**_h(producer), "Content-Type": "application/json"},
    )
    assert response.status_code == 200, response.text
    await producer.end()
    async with client.stream("GET", f"/v1/runs/{producer.run_id}/stream") as stream:
        body = await stream.aread()
    assert b"data: " + payload + b"\n" in body


# ------------------------------------------------------------------------ 10. small leaks


@pytest.mark.gateway_settings(api_keys=(KEY,), jwt_secret=SECRET)
async def test_trailing_slash_reflects_neither_host_nor_token(
    gateway_server: RunningServer,
) -> None:
    async with httpx.AsyncClient(base_url=gateway_server.base_url, timeout=10) as client:
        for path in ("/v1/runs/r1/", "/v1/runs/r1/stream/", "/healthz/"):
            response = await client.get(
                path,
                params={"access_token": "SECRET-TOKEN"},
                headers={"Host": "evil.example"},
            )
            assert response.status_code == 404, response.headers
            assert "location" not in response.headers
            assert "SECRET-TOKEN" not in response.text and "evil" not in response.text


@pytest.mark.parametrize("timeout", ["\u0661", "\uff11", "1_0", " 1", "1 ", "inf", "1e1", "+1"])
async def test_wait_timeout_takes_ascii_digits_only(
    client: httpx.AsyncClient, timeout: str
) -> None:
    producer = await ProducerClient.claim(client)
    response = await client.get(f"/v1/runs/{producer.run_id}/wait", params={"timeout": timeout})
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "invalid_input"


async def test_wait_timeout_accepts_plain_seconds(client: httpx.AsyncClient) -> None:
    producer = await ProducerClient.claim(client)
    response = await client.get(f"/v1/runs/{producer.run_id}/wait", params={"timeout": "0.05"})
    assert response.status_code == 202 and response.json() == {"status": "running"}


async def test_backend_errors_do_not_show_the_redis_address(
    fresh_redis: RedisServer, key_prefix: str
) -> None:
    port = fresh_redis.address[1]
    with serve(make_settings("redis", fresh_redis.url, key_prefix), "redis") as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as client:
            producer = await ProducerClient.claim(client)
            await producer.publish(("token", "a"))
            url = f"/v1/runs/{producer.run_id}/stream"
            async with client.stream("GET", url) as stream:
                frames = iter_frames(stream)
                async for frame in frames:
                    if frame.id is not None:
                        break
                fresh_redis.kill()
                rest = [frame async for frame in frames]
            status = await client.get(f"/v1/runs/{producer.run_id}")
            ready = await client.get("/readyz")
    [unavailable] = [f for f in rest if f.event == "unavailable"]
    for text in (unavailable.data.decode(), status.text, ready.text):
        assert str(port) not in text and "connecting" not in text.lower(), text
    assert status.status_code == 503 and status.json()["error"] == "backend_unavailable"
    assert ready.status_code == 503


@pytest.mark.gateway_settings(jwt_secret=SECRET, api_keys=(KEY,))
async def test_stream_ends_cleanly_when_its_token_expires(gateway_server: RunningServer) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(
        base_url=gateway_server.base_url, timeout=15, headers=auth
    ) as producer_client:
        producer = await ProducerClient.claim(producer_client)
        [first] = await producer.publish(("token", "a"))
        token = mint_subscriber_token(SECRET, runs=[producer.run_id], ttl_seconds=1.5)
        async with httpx.AsyncClient(base_url=gateway_server.base_url, timeout=15) as reader:
            url = f"/v1/runs/{producer.run_id}/stream"
            frames = []
            # the response ends by itself (no exception: a complete chunked body)
            async with reader.stream("GET", url, params={"access_token": token}) as stream:
                async for frame in iter_frames(stream):
                    frames.append(frame)
            assert [f.data_id for f in frames if f.data_id] == [first]
            assert not [f for f in frames if f.event in ("end", "gap", "unavailable")]
            assert any(b"token expired" in c for f in frames for c in f.comments)
            # the same token is refused now: the client must come back with a fresh one
            again = await reader.get(url, params={"access_token": token})
            assert again.status_code == 401 and again.json()["error"] == "token_expired"
            fresh = mint_subscriber_token(SECRET, runs=[producer.run_id], ttl_seconds=60)
            await producer.publish(("token", "b"))
            await producer.end()
            resumed = []
            async with reader.stream(
                "GET", url, params={"access_token": fresh}, headers={"Last-Event-ID": first}
            ) as stream:
                async for frame in iter_frames(stream):
                    resumed.append(frame)
            assert [f.json() for f in resumed if f.data_id] == ["b"]
            assert resumed[-1].event == "end"


# ---------------------------------------------- 9. open mode is not reachable from web pages


@pytest.mark.parametrize("host", ["evil.example", "evil.example:80", "127.0.0.1.nip.io", "::1"])
async def test_open_mode_answers_only_loopback_host_names(
    client: httpx.AsyncClient, host: str
) -> None:
    producer = await ProducerClient.claim(client)
    for path in (f"/v1/runs/{producer.run_id}", f"/v1/runs/{producer.run_id}/stream", "/"):
        response = await client.get(path, headers={"Host": host})
        assert response.status_code == 403, (path, response.text)
        assert response.json()["error"] == "host_not_allowed"
    refused = await client.post(
        f"/v1/runs/{producer.run_id}/cancel", json={}, headers={"Host": host}
    )
    assert refused.status_code == 403
    assert (await client.get(f"/v1/runs/{producer.run_id}")).json()["cancel_requested"] is False
    # probes carry no run data and come from load balancers under their own names
    assert (await client.get("/healthz", headers={"Host": host})).status_code == 200


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST:8000", "127.0.0.2:1", "[::1]:8000"])
async def test_open_mode_serves_loopback_host_names(client: httpx.AsyncClient, host: str) -> None:
    producer = await ProducerClient.claim(client)
    response = await client.get(f"/v1/runs/{producer.run_id}", headers={"Host": host})
    assert response.status_code == 200, response.text


@pytest.mark.gateway_settings(api_keys=(KEY,))
async def test_with_api_keys_any_host_name_is_served(gateway_server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=gateway_server.base_url, timeout=10) as client:
        response = await client.post(
            "/v1/runs",
            json={},
            headers={"Host": "gateway.example.com", "Authorization": f"Bearer {KEY}"},
        )
        assert response.status_code == 201, response.text


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
async def test_json_routes_require_a_json_content_type(
    client: httpx.AsyncClient, content_type: str | None
) -> None:
    producer = await ProducerClient.claim(client, lease_seconds=1)
    headers = {} if content_type is None else {"Content-Type": content_type}
    run = f"/v1/runs/{producer.run_id}"
    attempts = [
        ("/v1/runs", {}, b'{"run_id":"' + producer.run_id.encode() + b'","takeover":true}'),
        (f"{run}/cancel", {}, b""),
        (f"{run}/events", _h(producer), b'{"event":"token","data":"x"}'),
        (f"{run}/lease", _h(producer), b"{}"),
        (f"{run}/end", _h(producer), b'{"status":"success"}'),
    ]
    for path, extra, body in attempts:
        response = await client.post(path, content=body, headers={**headers, **extra})
        assert response.status_code == 415, (path, response.text)
        assert response.json()["error"] == "unsupported_media_type"
    info = (await client.get(run)).json()
    assert info["status"] == "running" and info["retained_events"] == 0
    assert info["cancel_requested"] is False
    # the same requests, saying JSON (a charset parameter is fine)
    ok = await client.post(
        f"{run}/events",
        content=b'{"event":"token","data":"x"}',
        headers={**_h(producer), "Content-Type": "application/json; charset=utf-8"},
    )
    assert ok.status_code == 200, ok.text
