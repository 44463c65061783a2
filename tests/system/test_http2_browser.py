"""HTTP/2 through the shipped proxies, seen from a real browser: one page, 20 EventSources.

Debian's headless Chromium (driven by playwright with `executable_path`) opens 20
`EventSource`s to 20 runs of one origin, through the TLS listener of the shipped
`deploy/` nginx and HAProxy configs (a self-signed certificate made by the test; the
browser is told to accept it). Over HTTP/2 all 20 are open and streaming at once; the
same page through the plain HTTP/1.1 listener of the same proxy gets six (the browser's
per-origin connection limit) and the seventh waits. Both figures are written to
`test-artifacts/http2_streams.json` (deploy/README.md quotes them).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from playwright.async_api import Page

from tests.support.browser import ARTIFACTS, chromium, skip_without_chromium
from tests.support.http_server import ProducerClient
from tests.support.proxies import HAPROXY_BIN, NGINX_BIN, GatewayProcess, Proxy

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

STREAMS = 20
HTTP1_LIMIT = 6  # Chromium's connections per origin over HTTP/1.1
WAIT_MS = 20_000
# How long the seventh stream is watched to stay waiting once six are streaming: a
# negative can only be observed for a while (generous: the six got events within ms).
STILL_WAITING_SECONDS = 2.0

skip_without_chromium()


def _needs(binary: str) -> Any:
    return pytest.mark.skipif(
        not (os.access(binary, os.X_OK) or shutil.which(binary)), reason=f"{binary} missing"
    )


KINDS = [
    pytest.param("haproxy", marks=_needs(HAPROXY_BIN)),
    pytest.param("nginx", marks=_needs(NGINX_BIN)),
]

OPEN_STREAMS_JS = """
([ids]) => {
  window.feed = {open: 0, got: {}, sources: [], started: performance.now(), allOpenMs: null};
  for (const id of ids) {
    const source = new EventSource(`/v1/runs/${id}/stream`);
    source.onopen = () => {
      feed.open += 1;
      if (feed.open === ids.length) feed.allOpenMs = performance.now() - feed.started;
    };
    source.addEventListener("token", (event) => { feed.got[id] = event.data; });
    feed.sources.push(source);
  }
}
"""


@pytest.fixture(scope="module")
def gateway(redis_url: str) -> Iterator[GatewayProcess]:
    # open mode (no keys, loopback): an EventSource cannot send an Authorization header
    with GatewayProcess(redis_url=redis_url, heartbeat=0.5, key_prefix="h2:") as gw:
        yield gw


async def _claim(client: httpx.AsyncClient, count: int, tag: str) -> list[ProducerClient]:
    return [
        await ProducerClient.claim(client, run_id=f"{tag}-{i}-{time.monotonic_ns()}")
        for i in range(count)
    ]


async def _publish(producers: list[ProducerClient]) -> None:
    for producer in producers:
        await producer.publish(("token", {"text": producer.run_id}))


async def _state(page: Page) -> dict[str, Any]:
    state: dict[str, Any] = await page.evaluate(
        "() => ({open: feed.open, got: Object.keys(feed.got).length, allOpenMs: feed.allOpenMs,"
        " states: feed.sources.map((s) => s.readyState),"
        " protocol: performance.getEntriesByType('navigation')[0].nextHopProtocol})"
    )
    return state


def _record(kind: str, figures: dict[str, Any]) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / "http2_streams.json"
    recorded = json.loads(path.read_text()) if path.exists() else {}
    recorded[kind] = figures
    path.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")


@pytest.mark.parametrize("kind", KINDS)
async def test_twenty_event_sources_over_http2_and_the_seventh_waits_over_http1(
    kind: str, gateway: GatewayProcess
) -> None:
    with Proxy(kind, backends=[gateway.url], tls=True) as proxy:  # type: ignore[arg-type]
        async with (
            httpx.AsyncClient(base_url=proxy.url, timeout=10) as producers,
            chromium("--ignore-certificate-errors") as browser,  # a self-signed certificate
        ):
            context = await browser.new_context(ignore_https_errors=True)
            page = await context.new_page()
            page.set_default_timeout(WAIT_MS)
            with anyio.fail_after(90):
                # HTTP/2 (TLS listener, ALPN h2): all 20 open and stream at once
                h2 = await _claim(producers, STREAMS, "h2")
                await page.goto(f"{proxy.tls_url}/healthz")
                await page.evaluate(OPEN_STREAMS_JS, [[p.run_id for p in h2]])
                await page.wait_for_function(f"feed.open === {STREAMS}")
                await _publish(h2)
                await page.wait_for_function(f"Object.keys(feed.got).length === {STREAMS}")
                over_h2 = await _state(page)
                assert over_h2["protocol"] == "h2"
                assert over_h2["open"] == STREAMS and over_h2["got"] == STREAMS
                assert over_h2["states"] == [1] * STREAMS  # all OPEN at the same time
                await page.evaluate("() => feed.sources.forEach((s) => s.close())")

                # HTTP/1.1 (plain listener, same proxy): six stream, the seventh waits
                h1 = await _claim(producers, STREAMS, "h1")
                page = await context.new_page()
                page.set_default_timeout(WAIT_MS)
                await page.goto(f"{proxy.url}/healthz")
                await page.evaluate(OPEN_STREAMS_JS, [[p.run_id for p in h1]])
                await page.wait_for_function(f"feed.open === {HTTP1_LIMIT}")
                await _publish(h1)
                await page.wait_for_function(f"Object.keys(feed.got).length >= {HTTP1_LIMIT}")
                await anyio.sleep(STILL_WAITING_SECONDS)
                over_h1 = await _state(page)
                assert over_h1["protocol"] == "http/1.1"
                assert over_h1["open"] == HTTP1_LIMIT, over_h1
                assert over_h1["got"] == HTTP1_LIMIT, over_h1
                # the seventh and later: still CONNECTING while the six stream
                assert over_h1["states"].count(0) == STREAMS - HTTP1_LIMIT, over_h1
                assert over_h1["states"].count(1) == HTTP1_LIMIT, over_h1
                await page.evaluate("() => feed.sources.forEach((s) => s.close())")
                await context.close()
    _record(
        kind,
        {
            "http2": {
                "streams": STREAMS,
                "open_at_once": over_h2["open"],
                "ms_until_all_open": round(over_h2["allOpenMs"], 1),
            },
            "http1.1": {
                "streams": STREAMS,
                "open_at_once": over_h1["open"],
                "waiting": STREAMS - over_h1["open"],
            },
        },
    )
