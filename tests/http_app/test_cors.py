"""Browsers on another origin (CORS): the allow-list, the reader routes, producer routes.

HTTP-level checks with httpx (what a browser sends: `Origin`, preflight headers), on a
real uvicorn server; the browser itself is in tests/system/test_cors_browser.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from gateway.settings import Settings
from tests.support.http_server import ProducerClient, RunningServer, make_settings, serve
from tests.test_cli import Server

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

ALLOWED = "http://app.example:3000"
OTHER = "http://evil.example"


@contextmanager
def _server(**settings: Any) -> Iterator[RunningServer]:
    with serve(make_settings("memory", None, "cors:", **settings)) as srv:
        yield srv


@asynccontextmanager
async def _client(**settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    with _server(**settings) as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as client:
            yield client


def _preflight(origin: str, method: str, headers: str = "authorization") -> dict[str, str]:
    return {
        "Origin": origin,
        "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": headers,
    }


async def test_no_origins_configured_means_no_cross_origin_access() -> None:
    async with _client() as client:
        producer = await ProducerClient.claim(client)
        url = f"/v1/runs/{producer.run_id}/stream"
        preflight = await client.options(url, headers=_preflight(ALLOWED, "GET"))
        assert preflight.status_code == 405
        assert "access-control-allow-origin" not in preflight.headers
        run = await client.get(f"/v1/runs/{producer.run_id}", headers={"Origin": ALLOWED})
        assert run.status_code == 200 and "access-control-allow-origin" not in run.headers


async def test_reader_routes_allow_the_listed_origin_only() -> None:
    async with _client(cors_origins=(ALLOWED,)) as client:
        producer = await ProducerClient.claim(client, session_id="cors-s")
        await producer.publish(("token", {"text": "a"}))
        await producer.end()
        stream = f"/v1/runs/{producer.run_id}/stream"
        preflight = await client.options(
            stream, headers=_preflight(ALLOWED, "GET", "authorization,last-event-id")
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == ALLOWED
        allowed_headers = preflight.headers["access-control-allow-headers"].lower()
        for header in ("authorization", "x-api-key", "last-event-id", "content-type"):
            assert header in allowed_headers
        assert "GET" in preflight.headers["access-control-allow-methods"]

        # The SSE stream (served on the fast path) carries the same headers.
        async with client.stream("GET", stream, headers={"Origin": ALLOWED}) as response:
            assert response.status_code == 200
            assert response.headers["access-control-allow-origin"] == ALLOWED
            assert "x-request-id" in response.headers["access-control-expose-headers"].lower()
        for path in (
            f"/v1/runs/{producer.run_id}",
            "/v1/sessions",
            "/v1/sessions/cors-s/turns",
            f"/threads/cors-s/runs/{producer.run_id}",
        ):
            response = await client.get(path, headers={"Origin": ALLOWED})
            assert response.status_code == 200, path
            assert response.headers["access-control-allow-origin"] == ALLOWED, path
        cancel = await client.options(
            f"/v1/runs/{producer.run_id}/cancel", headers=_preflight(ALLOWED, "POST")
        )
        assert cancel.headers["access-control-allow-origin"] == ALLOWED

        # Another origin: no CORS headers at all (the browser refuses the response).
        refused = await client.options(stream, headers=_preflight(OTHER, "GET"))
        assert refused.status_code == 400
        assert "access-control-allow-origin" not in refused.headers
        run = await client.get(f"/v1/runs/{producer.run_id}", headers={"Origin": OTHER})
        assert "access-control-allow-origin" not in run.headers
        async with client.stream("GET", stream, headers={"Origin": OTHER}) as response:
            assert "access-control-allow-origin" not in response.headers


async def test_producer_and_operator_routes_only_when_allowed_explicitly() -> None:
    async with _client(cors_origins=(ALLOWED,)) as client:
        producer = await ProducerClient.claim(client)
        for method, path, headers in (
            ("POST", "/v1/runs", "content-type"),
            ("POST", f"/v1/runs/{producer.run_id}/events", "content-type,x-producer-token"),
            ("POST", f"/v1/runs/{producer.run_id}/end", "content-type,x-producer-token"),
            ("POST", f"/v1/runs/{producer.run_id}/lease", "x-producer-token"),
            ("DELETE", f"/v1/runs/{producer.run_id}", "authorization"),
            ("DELETE", "/v1/sessions/s1", "authorization"),
        ):
            preflight = await client.options(path, headers=_preflight(ALLOWED, method, headers))
            assert "access-control-allow-origin" not in preflight.headers, (method, path)
        claim = await client.post("/v1/runs", json={}, headers={"Origin": ALLOWED})
        assert claim.status_code == 201 and "access-control-allow-origin" not in claim.headers

    async with _client(cors_origins=(ALLOWED,), cors_producer_routes=True) as client:
        producer = await ProducerClient.claim(client)
        preflight = await client.options(
            f"/v1/runs/{producer.run_id}/events",
            headers=_preflight(ALLOWED, "POST", "content-type,x-producer-token,x-producer-seq"),
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == ALLOWED
        assert "x-producer-token" in preflight.headers["access-control-allow-headers"].lower()
        delete = await client.options("/v1/sessions/s1", headers=_preflight(ALLOWED, "DELETE"))
        assert "DELETE" in delete.headers["access-control-allow-methods"]
        refused = await client.options(
            f"/v1/runs/{producer.run_id}/events", headers=_preflight(OTHER, "POST")
        )
        assert "access-control-allow-origin" not in refused.headers


def test_origins_setting_is_validated_and_split(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_CORS_ORIGINS", "https://a.example, http://127.0.0.1:5173/")
    settings = Settings()
    assert settings.cors_origins == ("https://a.example", "http://127.0.0.1:5173")
    assert Settings(cors_origins=("*",), api_keys=("k1",)).cors_origins == ("*",)
    for bad in ("a.example", "https://a.example/path", "ftp://a.example"):
        with pytest.raises(ValidationError):
            Settings(cors_origins=(bad,))


@pytest.mark.parametrize(
    "configured",
    ["https://App.Example.com", "https://app.example.com:443", "HTTPS://APP.EXAMPLE.COM:443/"],
)
async def test_an_origin_written_another_way_matches_what_browsers_send(configured: str) -> None:
    # A browser sends the scheme and host lower-cased, without the default port.
    browser = "https://app.example.com"
    async with _client(cors_origins=(configured,)) as client:
        preflight = await client.options("/v1/sessions", headers=_preflight(browser, "GET"))
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == browser
        listed = await client.get("/v1/sessions", headers={"Origin": browser})
        assert listed.headers["access-control-allow-origin"] == browser


@pytest.mark.timeout(60)
def test_serve_refuses_any_origin_without_authentication_unless_forced(tmp_path: Path) -> None:
    refused = Server(tmp_path, "--cors-origins", "*")
    try:
        assert refused.proc.wait(timeout=15) == 2
        assert "--allow-open-any-origin" in refused.log()
    finally:
        refused.close()
    forced = Server(tmp_path, "--cors-origins", "*", "--allow-open-any-origin")
    try:
        forced.wait_healthy()
        preflight = httpx.options(
            forced.base + "/v1/sessions", headers=_preflight("http://any.example", "GET"), timeout=5
        )
        assert preflight.headers["access-control-allow-origin"] in ("*", "http://any.example")
    finally:
        forced.close()


@pytest.mark.timeout(60)
def test_serve_refuses_an_origin_that_could_never_match(tmp_path: Path) -> None:
    server = Server(tmp_path, "--cors-origins", "https://app.example.com:99999")
    try:
        assert server.proc.wait(timeout=15) == 2
        assert "out of range" in server.log()
    finally:
        server.close()
