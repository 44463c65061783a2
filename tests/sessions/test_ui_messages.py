"""`GET /v1/sessions/{id}/ui-messages`: a session's turns as AI SDK `UIMessage[]`
(docs/protocol.md §8), through a real server on the memory and the Redis bridge.

The shapes asserted here are what the chat app (examples/chat) hands to the AI SDK;
tests/system/test_chat_app.py drives that in Chromium.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from gateway.http.edge.auth import mint_subscriber_token
from tests.support import http_server
from tests.support.http_server import ProducerClient, RunningServer

KEY = "ui-messages-key-0123456789"
SECRET = "ui-messages-secret-0123456789-0123456789"

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.timeout(30),
    pytest.mark.gateway_settings(api_keys=(KEY,), jwt_secret=SECRET),
]
gateway_server = http_server.gateway_server


@pytest.fixture
async def client(gateway_server: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(
        base_url=gateway_server.base_url, timeout=10, headers=headers
    ) as c:
        yield c


def _input(message_id: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"messageId": message_id, "role": "user", "parts": [{"kind": "text", "text": text}]} | (
        extra
    )


def _ui(*deltas: str) -> list[tuple[str, Any]]:
    chunks: list[dict[str, Any]] = [{"type": "start"}, {"type": "text-start", "id": "t"}]
    chunks += [{"type": "text-delta", "id": "t", "delta": d} for d in deltas]
    return [("ui", chunk) for chunk in chunks]


async def _messages(client: httpx.AsyncClient, session_id: str, **params: Any) -> Any:
    response = await client.get(f"/v1/sessions/{session_id}/ui-messages", params=params)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    return response.json()


async def test_ended_turns_are_user_and_assistant_pairs_oldest_first(
    client: httpx.AsyncClient,
) -> None:
    first = await ProducerClient.claim(
        client, session_id="ui-hist", input_message=_input("u1", "Hi?")
    )
    await first.publish(*_ui("Hel", "lo"))
    await first.end()
    second = await ProducerClient.claim(
        client,
        session_id="ui-hist",
        input_message=_input(
            "u2",
            "And this?",
            parts=[
                {"kind": "text", "text": "And this?"},
                {
                    "kind": "file",
                    "file": {
                        "name": "a.png",
                        "mimeType": "image/png",
                        "uri": "https://example.test/a.png",
                    },
                },
                {"kind": "file", "file": {"name": "b.bin", "bytes": "AAAA"}},
            ],
        ),
    )
    await second.publish(("token", {"text": "Fine."}))
    await second.end()

    assert await _messages(client, "ui-hist") == [
        {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "Hi?"}]},
        {
            "id": first.run_id,
            "role": "assistant",
            "parts": [{"type": "text", "text": "Hello", "state": "done"}],
            "metadata": {"status": "success"},
        },
        {
            "id": "u2",
            "role": "user",
            "parts": [
                {"type": "text", "text": "And this?"},
                {
                    "type": "file",
                    "mediaType": "image/png",
                    "url": "https://example.test/a.png",
                    "filename": "a.png",
                },
            ],
        },
        {
            "id": second.run_id,
            "role": "assistant",
            "parts": [{"type": "text", "text": "Fine.", "state": "done"}],
            "metadata": {"status": "success"},
        },
    ]


async def test_a_running_turn_lists_its_user_message_only(client: httpx.AsyncClient) -> None:
    producer = await ProducerClient.claim(
        client, session_id="ui-live", input_message=_input("u1", "Tell me")
    )
    await producer.publish(*_ui("part"))
    assert await _messages(client, "ui-live") == [
        {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "Tell me"}]}
    ]
    # Parked on the operator and still the session's running turn (the UI stream
    # replays it): still the user message only.
    await producer.publish(("state", {"state": "input-required"}))
    assert len(await _messages(client, "ui-live")) == 1
    # A newer turn makes the parked one history: no stream replays it any more.
    newer = await ProducerClient.claim(
        client, session_id="ui-live", input_message=_input("u2", "Next")
    )
    listed = await _messages(client, "ui-live")
    assert [m["id"] for m in listed] == ["u1", producer.run_id, "u2"]
    assert listed[1]["parts"] == [{"type": "text", "text": "part", "state": "done"}]
    assert listed[1]["metadata"] == {"status": "input-required"}
    await newer.end()
    assert [m["id"] for m in await _messages(client, "ui-live")] == [
        "u1",
        producer.run_id,
        "u2",
        newer.run_id,
    ]


@pytest.mark.parametrize("with_text", [False, True])
async def test_a_turn_ended_with_an_error_carries_it(
    client: httpx.AsyncClient, with_text: bool
) -> None:
    session_id = f"ui-error-{int(with_text)}"
    producer = await ProducerClient.claim(
        client, session_id=session_id, input_message=_input("u1", "Fail")
    )
    if with_text:
        await producer.publish(*_ui("Half an "))
    await producer.end("error", {"message": "model overloaded"})
    user, assistant = await _messages(client, session_id)
    assert user["role"] == "user"
    assert assistant == {
        "id": producer.run_id,
        "role": "assistant",
        "parts": [{"type": "text", "text": "Half an ", "state": "done"}] if with_text else [],
        "metadata": {"status": "error", "error": {"message": "model overloaded"}},
    }


async def test_unknown_session_is_empty_and_bad_input_is_4xx(
    client: httpx.AsyncClient,
) -> None:
    assert await _messages(client, "never-seen") == []
    bad = await client.get("/v1/sessions/-bad/ui-messages")
    assert bad.status_code == 422 and bad.json()["error"] == "invalid_input"
    for limit in ("0", "201", "x", "-1"):
        response = await client.get("/v1/sessions/s/ui-messages", params={"limit": limit})
        assert response.status_code in (400, 422), limit
        assert response.json()["error"] == "invalid_input"


async def test_limit_bounds_the_turns_read(client: httpx.AsyncClient) -> None:
    run_ids = []
    for index in range(3):
        producer = await ProducerClient.claim(
            client, session_id="ui-limit", input_message=_input(f"u{index}", f"q{index}")
        )
        await producer.publish(("token", f"a{index}"))
        await producer.end()
        run_ids.append(producer.run_id)
    listed = await _messages(client, "ui-limit", limit=2)
    assert [m["id"] for m in listed] == ["u1", run_ids[1], "u2", run_ids[2]]


async def test_scoped_tokens_read_only_their_session(
    client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    producer = await ProducerClient.claim(
        client, session_id="ui-mine", input_message=_input("u1", "secret")
    )
    await producer.end()
    url = f"{gateway_server.base_url}/v1/sessions/ui-mine/ui-messages"
    async with httpx.AsyncClient(timeout=10) as anonymous:
        assert (await anonymous.get(url)).status_code == 401
        mine = mint_subscriber_token(SECRET, sessions=["ui-mine"])
        response = await anonymous.get(url, headers={"Authorization": f"Bearer {mine}"})
        assert response.status_code == 200 and len(response.json()) == 2
        # the query-string form browsers use for the streams works here too
        response = await anonymous.get(url, params={"access_token": mine})
        assert response.status_code == 200
        for other in (
            mint_subscriber_token(SECRET, sessions=["ui-other"]),
            mint_subscriber_token(SECRET, runs=[producer.run_id]),
        ):
            refused = await anonymous.get(url, headers={"Authorization": f"Bearer {other}"})
            assert refused.status_code == 403 and refused.json()["error"] == "forbidden"


async def test_turns_without_a_bubble_list_their_answer_only(client: httpx.AsyncClient) -> None:
    # No input message at all, then a hidden one (an approval resume): no user bubble.
    plain = await ProducerClient.claim(client, session_id="ui-nobubble")
    await plain.publish(("token", "one"))
    await plain.end()
    hidden = await ProducerClient.claim(
        client,
        session_id="ui-nobubble",
        input_message=_input("u2", "approve", metadata={"hidden": True}),
    )
    await hidden.publish(("token", "two"))
    await hidden.end()
    listed = await _messages(client, "ui-nobubble")
    assert [(m["role"], m["id"], m["parts"][0]["text"]) for m in listed] == [
        ("assistant", plain.run_id, "one"),
        ("assistant", hidden.run_id, "two"),
    ]
