"""A stalled Redis (`DEBUG SLEEP` on a Redis the test started) never leaves clients
hanging: requests answer 503 and open streams end with an `unavailable` frame within
`redis_command_timeout_seconds`, long before the stall is over."""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio
import httpx
import pytest

from tests.support.http_server import ProducerClient, make_settings, serve
from tests.support.redis_servers import RedisServer
from tests.support.sse_client import iter_frames
from tests.support.stall import stalled

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

STALL = 6.0  # seconds Redis sleeps
TIMEOUT = 1.0  # redis_command_timeout_seconds


async def test_requests_and_streams_answer_within_the_command_timeout(
    redis_server_factory: Callable[..., RedisServer], key_prefix: str
) -> None:
    server = redis_server_factory("--enable-debug-command", "yes")
    settings = make_settings("redis", server.url, key_prefix, redis_command_timeout_seconds=TIMEOUT)
    with serve(settings, "redis") as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=30) as client:
            producer = await ProducerClient.claim(client)
            ids = await producer.publish(("token", 1))
            frames = []
            async with client.stream("GET", f"/v1/runs/{producer.run_id}/stream") as response:
                stream = iter_frames(response)
                async for frame in stream:
                    if frame.id == ids[-1]:
                        break
                with stalled(server, STALL):
                    started = time.monotonic()
                    status = (await client.get(f"/v1/runs/{producer.run_id}")).status_code
                    answered = time.monotonic() - started
                    with anyio.fail_after(STALL - 1):
                        async for frame in stream:
                            frames.append(frame)
                            if frame.event == "unavailable":
                                break
                    ended = time.monotonic() - started
    assert status == 503 and answered < STALL - 2, (status, answered)
    assert frames and frames[-1].event == "unavailable" and ended < STALL - 1


async def test_session_routes_answer_within_the_command_timeout(
    redis_server_factory: Callable[..., RedisServer], key_prefix: str
) -> None:
    """Issue #25 item 6: the session store calls Redis through the bridge's boundary, so
    its routes answer 503 within the command timeout too (naming no server address). A
    feed waiting between turns sends Redis nothing (a turn is announced by the claim's
    own step), so a stall does not end it: it opens the next turn once Redis is back."""
    server = redis_server_factory("--enable-debug-command", "yes")
    settings = make_settings("redis", server.url, key_prefix, redis_command_timeout_seconds=TIMEOUT)
    with serve(settings, "redis") as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=30) as client:
            producer = await ProducerClient.claim(client, session_id="stalled")
            await producer.publish(("token", "a"))
            frames = []
            async with client.stream("GET", "/v1/sessions/stalled/stream") as response:
                stream = iter_frames(response)
                async for frame in stream:
                    if frame.event == "token":
                        break
                await producer.end()  # the feed now waits for the next turn
                async for frame in stream:
                    if frame.event == "turn_end":
                        break
                with stalled(server, STALL):
                    started = time.monotonic()
                    turns = await client.get("/v1/sessions/stalled/turns")
                    listed = await client.get("/v1/sessions")
                    answered = time.monotonic() - started
                with anyio.fail_after(STALL + 10):  # Redis is back: the next turn opens
                    second = await ProducerClient.claim(client, session_id="stalled")
                    async for frame in stream:
                        frames.append(frame)
                        if frame.event == "turn":
                            break
    assert (turns.status_code, listed.status_code) == (503, 503), (turns.text, listed.text)
    assert answered < STALL - 2, answered
    assert str(server.port) not in turns.text + listed.text
    assert [f.event for f in frames if f.event] == ["turn"]  # no `unavailable` meanwhile
    assert frames[-1].json()["run_id"] == second.run_id
