"""The Next.js App Router example (examples/next) in real headless Chromium.

The same chat as examples/chat, as a Next.js app: a client page with `useChat` and
@gateway/ai's `GatewayChatTransport`, route handlers on `@gateway/ai/server`
(`POST /api/chat` publishing with `waitUntil: after`, `GET /api/access` minting a reader
token after an ownership check), `next build` once, `next start` per case, and the
gateway on a real uvicorn server (memory and Redis). Cases: a message, a reload
mid-answer, a proxy cut with the browser online, stop (turn `cancelled`, the partial
kept after a reload), a double submit (one turn), the Next server killed mid-answer
(`producer_lost` on the page within 10 s). Each compares the page's whole message list
with the gateway's records.

A system test (tests/system/): `make test-fast` skips it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.settings import Settings
from tests.support.browser import skip_without_chromium
from tests.support.http_server import make_settings, serve
from tests.support.proxies import wait_until
from tests.system.test_chat_app import (
    API_KEY,
    APP_KID,
    APP_SECRET,
    GRACE_SECONDS,
    JS_DIR,
    MID_ANSWER,
    WORD_DELAY_MS,
    WORDS,
    ChatApp,
    Network,
    _address,
    _build_package,
    _npm_ci,
    _setup_lock,
    answer_text,
    assert_once,
    assert_recorded,
    browser_context,
    gateway_api,
    messages,
    open_chat,
    send,
    sources_digest,
    stop_app,
    turn_text,
    wait_answer,
    wait_run_status,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]

skip_without_chromium()

NEXT_DIR = Path(__file__).resolve().parents[2] / "examples" / "next"
START_TIMEOUT = 30.0


@pytest.fixture(scope="module")
def next_build() -> str:
    """`npm ci` (js/ and the example) and `next build`, once; the Node binary."""
    node = shutil.which("node")
    if node is None or shutil.which("npm") is None:
        pytest.skip("node and npm are needed for the Next.js example")
    with _setup_lock():
        _npm_ci(JS_DIR)
        _npm_ci(NEXT_DIR)
        _build_package(node)
        stamp = NEXT_DIR / ".next" / "gateway-test.sources"
        digest = sources_digest(_next_sources())
        if not (stamp.is_file() and stamp.read_text() == digest):
            subprocess.run(
                [node, "node_modules/next/dist/bin/next", "build"],
                cwd=NEXT_DIR,
                env={**os.environ, "NEXT_TELEMETRY_DISABLED": "1"},
                check=True,
                capture_output=True,
                timeout=600,
            )
            stamp.write_text(digest)
    return node


def _next_sources() -> list[Path]:
    return [
        *(NEXT_DIR / "app").rglob("*"),
        NEXT_DIR / "next.config.mjs",
        NEXT_DIR / "package-lock.json",
        NEXT_DIR.parent / "chat" / "model.mjs",
        JS_DIR / "dist" / "client.js",
        JS_DIR / "dist" / "server.js",
    ]


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture(params=["memory", "redis"])
def next_app(
    request: pytest.FixtureRequest, next_build: str, key_prefix: str, tmp_path: Path
) -> Iterator[ChatApp]:
    backend = str(request.param)
    redis_url = request.getfixturevalue("redis_url") if backend == "redis" else None
    app_network, gateway_network = Network(), Network()
    keys: dict[str, Any] = {"jwt_secret": APP_SECRET}
    if "jwt_app_keys" in Settings.model_fields:
        keys["jwt_app_keys"] = (f"{APP_KID}:{APP_SECRET}",)
    settings = make_settings(
        backend,
        redis_url,
        key_prefix,
        api_keys=(API_KEY,),
        cors_origins=(app_network.url,),
        producer_lost_grace_seconds=GRACE_SECONDS,
        **keys,
    )
    log = tmp_path / "next.log"
    port = _free_port()
    with serve(settings, backend) as gateway, log.open("w") as out:
        gateway_network.target = _address(gateway.base_url)
        env = {
            **os.environ,
            "NEXT_TELEMETRY_DISABLED": "1",
            "GATEWAY_URL": gateway.base_url,
            "GATEWAY_PUBLIC_URL": gateway_network.url,
            "GATEWAY_API_KEY": API_KEY,
            "GATEWAY_APP_KID": APP_KID,
            "GATEWAY_APP_SECRET": APP_SECRET,
            "CHAT_WORDS": str(WORDS),
            "CHAT_WORD_DELAY_MS": str(WORD_DELAY_MS),
        }
        proc = subprocess.Popen(
            [
                next_build,
                "node_modules/next/dist/bin/next",
                "start",
                "-H",
                "127.0.0.1",
                "-p",
                str(port),
            ],
            cwd=NEXT_DIR,
            env=env,
            stdout=out,
            stderr=out,
        )
        try:

            def answering() -> bool:  # next start prints "Ready" before it answers: ask it
                assert proc.poll() is None, log.read_text()
                return httpx.get(f"http://127.0.0.1:{port}/", timeout=2).status_code == 200

            wait_until("next start", answering, START_TIMEOUT, log.read_text)
            app_network.target = ("127.0.0.1", port)
            yield ChatApp(app_network.url, gateway, app_network, gateway_network, proc, log)
        finally:
            stop_app(proc, (app_network, gateway_network), log, "next")


async def test_send_and_reload_mid_answer(next_app: ChatApp) -> None:
    prompt, chat_id = "hello next", "next-reload"
    async with browser_context() as context:
        page = await open_chat(context, next_app, chat_id)
        await send(page, prompt)
        await page.wait_for_function(MID_ANSWER, arg=4)
        await page.reload()
        listed = await wait_answer(page, answer_text(prompt))
        run_id = assert_once(listed, prompt, answer_text(prompt))
    await assert_recorded(next_app, chat_id, run_id, answer_text(prompt))


async def test_a_proxy_cut_with_the_browser_online(next_app: ChatApp) -> None:
    prompt, chat_id = "cut next", "next-cut"
    async with browser_context() as context:
        page = await open_chat(context, next_app, chat_id)
        await send(page, prompt)
        await page.wait_for_function(MID_ANSWER, arg=4)
        next_app.gateway_network.cut()
        next_app.gateway_network.restore()
        listed = await wait_answer(page, answer_text(prompt))
        run_id = assert_once(listed, prompt, answer_text(prompt))
    await assert_recorded(next_app, chat_id, run_id, answer_text(prompt))


async def test_stop_keeps_the_partial_answer(next_app: ChatApp) -> None:
    prompt, chat_id = "stop next", "next-stop"
    async with browser_context() as context:
        page = await open_chat(context, next_app, chat_id)
        await send(page, prompt)
        await page.wait_for_function(MID_ANSWER, arg=4)
        await page.click("#stop")
        await page.wait_for_selector('#status[data-status="ready"]')
        run_id = (await messages(page))[-1]["id"]
        await wait_run_status(next_app, run_id, "cancelled", 10)
        async with gateway_api(next_app) as api:
            kept = await turn_text(api, chat_id)
        assert len(kept) < len(answer_text(prompt))
        await page.reload()
        await page.wait_for_function("() => document.querySelectorAll('.message').length >= 2")
        listed = await messages(page)
        assert [(m["role"], m["text"]) for m in listed] == [("user", prompt), ("assistant", kept)]
        assert listed[1]["status"] == "cancelled"
    await assert_recorded(next_app, chat_id, run_id, kept, "cancelled")


async def test_a_double_submit_runs_one_turn(next_app: ChatApp) -> None:
    prompt, chat_id = "next once", "next-double"
    async with browser_context() as context:
        page = await open_chat(context, next_app, chat_id)

        async def twice(route: Any) -> None:
            await route.fetch()
            await route.fulfill(response=await route.fetch())

        await page.route("**/api/chat", twice)
        await send(page, prompt)
        listed = await wait_answer(page, answer_text(prompt))
        run_id = assert_once(listed, prompt, answer_text(prompt))
    await assert_recorded(next_app, chat_id, run_id, answer_text(prompt))  # one turn


async def test_the_server_killed_mid_answer_is_producer_lost(next_app: ChatApp) -> None:
    prompt, chat_id = "kill next", "next-killed"
    async with browser_context() as context:
        page = await open_chat(context, next_app, chat_id)
        await send(page, prompt)
        await page.wait_for_function(MID_ANSWER, arg=4)
        run_id = (await messages(page))[-1]["id"]
        next_app.process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        await wait_run_status(next_app, run_id, "producer_lost", 10)
        await page.wait_for_selector('#status[data-status="error"]', timeout=10_000)
        assert time.monotonic() - killed < 10
        assert "producer_lost" in (await page.text_content("#error") or "")
        async with gateway_api(next_app) as api:
            kept = await turn_text(api, chat_id)
        listed = await messages(page)
        assert [(m["role"], m["text"]) for m in listed] == [("user", prompt), ("assistant", kept)]
    await assert_recorded(next_app, chat_id, run_id, kept, "producer_lost")
