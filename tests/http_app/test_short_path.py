"""The short path answers exactly as Starlette's stack: every answer of the producer's
append route (`DirectRoute`, served by `GatewayApp` itself), the same from a gateway whose
`debug` app takes the whole stack for every route."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.http_server import make_settings, serve

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

IGNORED_HEADERS = frozenset({"date", "x-request-id", "content-length"})


@pytest.fixture(params=["memory", "redis"])
def servers(request: pytest.FixtureRequest, key_prefix: str) -> Iterator[tuple[str, str]]:
    backend = str(request.param)
    url = request.getfixturevalue("redis_url") if backend == "redis" else None
    settings = make_settings(backend, url, key_prefix, max_body_bytes=1024)
    stack_settings = make_settings(backend, url, key_prefix + "stack:", max_body_bytes=1024)
    with serve(settings, backend) as short, serve(stack_settings, backend, debug=True) as stack:
        yield short.base_url, stack.base_url


async def _answers(base_url: str) -> list[tuple[int, dict[str, str], Any]]:
    answers = []
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
        claim = (await client.post("/v1/runs", json={"run_id": "parity"})).json()
        token = {"X-Producer-Token": claim["producer_token"]}
        raw = {**token, "Content-Type": "application/json"}
        events = "/v1/runs/parity/events"
        requests: list[tuple[str, str, dict[str, Any]]] = [
            ("POST", events, {"json": {"event": "token", "data": 1}, "headers": token}),
            ("POST", events, {"json": {"event": "token", "data": 1}}),  # no token
            ("POST", events, {"json": {"event": "token"}, "headers": {"X-Producer-Token": "x"}}),
            ("POST", "/v1/runs/nobody/events", {"json": {"event": "t"}, "headers": token}),
            ("POST", "/v1/runs/bad%20id/events", {"json": {"event": "t"}, "headers": token}),
            ("POST", events, {"content": b"{not json", "headers": raw}),
            ("POST", events, {"content": b"x" * 2048, "headers": raw}),
            ("POST", events, {"json": {"event": "token", "extra": 1}, "headers": token}),
            ("POST", events, {"json": {"events": []}, "headers": token}),
            ("POST", events, {"content": b"{}", "headers": {**raw, "Content-Type": "text/plain"}}),
            ("POST", events, {"json": {"event": "t"}, "headers": {**token, "X-Producer-Seq": "x"}}),
            ("GET", events, {}),
            ("HEAD", events, {}),
            ("PUT", events, {"json": {}}),
        ]
        for method, path, options in requests:
            response = await client.request(method, path, **options)
            headers = {
                name: value
                for name, value in response.headers.items()
                if name not in IGNORED_HEADERS
            }
            assert "x-request-id" in response.headers
            body: Any = response.json() if response.content else None
            if response.status_code == 200:
                body = sorted(body)  # the ids differ between the two runs; the fields do not
            answers.append((response.status_code, headers, body))
        await client.post("/v1/runs/parity/end", json={"status": "success"}, headers=token)
        ended = await client.post(events, json={"event": "t"}, headers=token)
        answers.append((ended.status_code, {}, ended.json()))
    return answers


async def test_the_append_route_answers_as_the_whole_stack_does(
    servers: tuple[str, str],
) -> None:
    short, stack = servers
    got, expected = await _answers(short), await _answers(stack)
    assert got == expected
    statuses = [status for status, _, _ in got]
    assert statuses == [200, 422, 409, 409, 422, 400, 413, 422, 422, 415, 422, 405, 405, 405, 409]
