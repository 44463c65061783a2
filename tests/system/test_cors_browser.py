"""A page on another origin, in real headless Chromium (Debian's, see test_console_browser).

The page is served by a second small HTTP server on its own port: `http://127.0.0.1:P`
is the allowed origin, and the same page loaded as `http://localhost:P` is another
origin (same server, different host name), which the browser must refuse.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from gateway.http.edge.auth import mint_subscriber_token
from tests.support.browser import chromium, skip_without_chromium
from tests.support.http_server import ProducerClient, make_settings, serve
from tests.support.request_log import request_log

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

skip_without_chromium()

API_KEY = "cors-browser-key"
JWT_SECRET = "cors-browser-secret-with-enough-bytes-for-hs256"
PAGE = b"<!doctype html><html><head><title>app</title></head><body>app</body></html>"


class _Page(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def page_server() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


# Runs in the page: follow the run with EventSource (?access_token=), then read its
# record and its stream with fetch and an Authorization header (both need CORS).
FOLLOW = """
async ({base, runId, token, lastEventId}) => {
  const viaEventSource = await new Promise((resolve) => {
    const es = new EventSource(`${base}/v1/runs/${runId}/stream?access_token=${token}`);
    const texts = [];
    es.addEventListener("token", (m) => texts.push(JSON.parse(m.data).text));
    es.addEventListener("end", (m) => { es.close(); resolve({texts, end: JSON.parse(m.data)}); });
    es.onerror = () => { if (es.readyState === 2) resolve({refused: true, texts}); };
    window.eventSourceOpen = true;
  });
  let viaFetch;
  try {
    const auth = {Authorization: `Bearer ${token}`};
    const record = await (await fetch(`${base}/v1/runs/${runId}`, {headers: auth})).json();
    const stream = await fetch(`${base}/v1/runs/${runId}/stream`, {
      headers: {...auth, "Last-Event-ID": lastEventId},
    });
    viaFetch = {status: record.status, body: await stream.text(),
                requestId: stream.headers.get("x-request-id")};
  } catch (err) {
    viaFetch = {refused: String(err)};
  }
  return {viaEventSource, viaFetch};
}
"""


async def test_allowed_origin_follows_a_run_and_another_origin_is_refused() -> None:
    with page_server() as port:
        allowed = f"http://127.0.0.1:{port}"
        settings = make_settings(
            "memory",
            None,
            "cors-browser:",
            api_keys=(API_KEY,),
            jwt_secret=JWT_SECRET,
            cors_origins=(allowed,),
        )
        with serve(settings) as srv:
            auth = {"Authorization": f"Bearer {API_KEY}"}
            async with (
                httpx.AsyncClient(base_url=srv.base_url, timeout=10, headers=auth) as client,
                chromium() as browser,
            ):
                producer = await ProducerClient.claim(client, session_id="cors-page")
                token = mint_subscriber_token(JWT_SECRET, runs=[producer.run_id])
                (first,) = await producer.publish(("token", {"text": "a"}))
                args = {
                    "base": srv.base_url,
                    "runId": producer.run_id,
                    "token": token,
                    "lastEventId": first,
                }

                context = await browser.new_context()
                page = await context.new_page()
                await page.goto(f"{allowed}/app")
                task = asyncio.ensure_future(page.evaluate(FOLLOW, args))
                await page.wait_for_function("window.eventSourceOpen === true")
                await producer.publish(("token", {"text": "b"}), ("token", {"text": "c"}))
                await producer.end()
                result = await task
                assert result["viaEventSource"] == {
                    "texts": ["a", "b", "c"],
                    "end": {"status": "success"},
                }
                via_fetch = result["viaFetch"]
                assert via_fetch["status"] == "success"
                assert via_fetch["requestId"]  # an exposed header
                body = via_fetch["body"]
                assert '"text":"a"' not in body  # resumed after Last-Event-ID
                assert '"text":"b"' in body and '"text":"c"' in body
                assert "event: end" in body

                other = await context.new_page()
                await other.goto(f"http://localhost:{port}/app")
                refused = await other.evaluate(FOLLOW, args)
                assert refused["viaEventSource"] == {"refused": True, "texts": []}
                assert "Failed to fetch" in refused["viaFetch"]["refused"]
                await context.close()


# Runs in the page: an EventSource the app never closes; resolves with what it saw once
# it has been CLOSED by the browser (the 204 after the terminal frame) or after `waitMs`.
LEAVE_OPEN = """
async ({url, waitMs}) => {
  const es = new EventSource(url);
  const seen = [];
  for (const name of ["token", "end", "gap"]) {
    es.addEventListener(name, (m) => seen.push([name, m.lastEventId]));
  }
  await new Promise((resolve) => setTimeout(resolve, waitMs));
  return {seen, readyState: es.readyState};
}
"""


async def test_browser_event_source_stops_by_itself_after_end_and_gap() -> None:
    """Chromium's own EventSource, never closed by the page: it reconnects once after
    `end` / `gap` with the terminal id, gets 204 and stays CLOSED."""
    with page_server() as port, request_log() as log:
        allowed = f"http://127.0.0.1:{port}"
        settings = make_settings(
            "memory", None, "cors-stop:", cors_origins=(allowed,), max_events_per_run=3
        )
        with serve(settings) as srv:
            async with (
                httpx.AsyncClient(base_url=srv.base_url, timeout=10) as client,
                chromium() as browser,
            ):
                ended = await ProducerClient.claim(client)
                await ended.publish(("token", {"text": "a"}))
                await ended.end()
                trimmed = await ProducerClient.claim(client)
                ids = []
                for i in range(6):
                    ids += await trimmed.publish(("token", {"text": str(i)}))
                context = await browser.new_context()
                page = await context.new_page()
                await page.goto(f"{allowed}/app")
                base = f"{srv.base_url}/v1/runs"
                after_end, after_gap = await asyncio.gather(
                    page.evaluate(
                        LEAVE_OPEN, {"url": f"{base}/{ended.run_id}/stream", "waitMs": 8000}
                    ),
                    page.evaluate(
                        LEAVE_OPEN,
                        {
                            "url": f"{base}/{trimmed.run_id}/stream?last_event_id={ids[0]}",
                            "waitMs": 8000,
                        },
                    ),
                )
                await context.close()
    assert after_end["readyState"] == 2  # CLOSED
    assert [name for name, _ in after_end["seen"]] == ["token", "end"]
    assert after_end["seen"][1] == ["end", "end"]
    assert after_gap == {"seen": [["gap", "gap"]], "readyState": 2}
    for run_id in (ended.run_id, trimmed.run_id):
        reads = log.reads_after(run_id, 0.0)
        assert len(reads) == 2 and reads[-1].startswith("GET /v1/runs/{run_id}/stream 204"), reads
