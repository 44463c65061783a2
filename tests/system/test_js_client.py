"""Real npm clients against a real gateway: `node --test` suites in tests/js/.

- eventsource.test.mjs: the npm `eventsource` package and gateway-client.js on it;
- ai_sdk.test.mjs: the AI SDK (`ai`) resuming chats from the ui-stream;
- clients.test.mjs: npm `eventsource` and `@microsoft/fetch-event-source` reconnecting.

Each test starts a real gateway, runs one Node suite against it and asserts it passed.
`npm ci` runs here when scripts/bootstrap did not install tests/js/node_modules.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gateway.http.edge.auth import mint_subscriber_token
from gateway.settings import Settings
from tests.support.http_server import make_settings, serve

JS_DIR = Path(__file__).resolve().parents[1] / "js"
API_KEY = "js-test-key"
JWT_SECRET = "js-test-secret-with-enough-bytes-for-hs256"
MAX_EVENTS = 5
SCOPED_RUN = "js-scoped-run"
# The pinned npm packages (tests/js/package.json); `npm ci` when any is missing.
PACKAGES = ("eventsource", "eventsource3", "ai", "@microsoft/fetch-event-source")


def _node_modules() -> None:
    if all((JS_DIR / "node_modules" / name / "package.json").is_file() for name in PACKAGES):
        return
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed (needed for the pinned npm packages)")
    subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=JS_DIR,
        check=True,
        timeout=300,
    )


def run_node_suite(script: str, settings: Settings, env: dict[str, str], passed: int) -> str:
    """Serve `settings`, run `node --test script` against it, assert `passed` tests passed."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    _node_modules()
    with serve(settings) as srv:
        proc = subprocess.run(
            [node, "--test", "--test-reporter=spec", script],
            cwd=JS_DIR,
            env={**os.environ, "GATEWAY_URL": srv.base_url, **env},
            capture_output=True,
            text=True,
            timeout=150,
        )
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    assert "fail 0" in report, report
    assert f"pass {passed}" in report, report
    return report


@pytest.mark.timeout(180)
def test_node_eventsource_client_suite() -> None:
    settings = make_settings(
        "memory",
        None,
        "js:",
        api_keys=(API_KEY,),
        jwt_secret=JWT_SECRET,
        max_events_per_run=MAX_EVENTS,
    )
    env = {
        "GATEWAY_API_KEY": API_KEY,
        "GATEWAY_MAX_EVENTS": str(MAX_EVENTS),
        "GATEWAY_SCOPED_RUN": SCOPED_RUN,
        "GATEWAY_SCOPED_TOKEN": mint_subscriber_token(JWT_SECRET, runs=[SCOPED_RUN]),
    }
    run_node_suite("eventsource.test.mjs", settings, env, 6)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_ai_sdk_resumes_chats_from_the_ui_stream(
    backend: str, request: pytest.FixtureRequest, key_prefix: str
) -> None:
    """npm `ai` 6: resumeStream() after a cut is exact and `ready`; nothing to resume is
    `ready`; END error is `error` (tests/js/ai_sdk.test.mjs)."""
    url = request.getfixturevalue("redis_url") if backend == "redis" else None
    settings = make_settings(backend, url, key_prefix, api_keys=(API_KEY,))
    run_node_suite("ai_sdk.test.mjs", settings, {"GATEWAY_API_KEY": API_KEY}, 3)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_node_reconnecting_clients_resume_exactly_and_stop_after_end_and_gap(
    backend: str, request: pytest.FixtureRequest, key_prefix: str
) -> None:
    """npm `eventsource` and `@microsoft/fetch-event-source` (tests/js/clients.test.mjs)."""
    url = request.getfixturevalue("redis_url") if backend == "redis" else None
    settings = make_settings(
        backend, url, key_prefix, api_keys=(API_KEY,), max_events_per_run=MAX_EVENTS
    )
    env = {"GATEWAY_API_KEY": API_KEY, "GATEWAY_MAX_EVENTS": str(MAX_EVENTS)}
    run_node_suite("clients.test.mjs", settings, env, 6)


@pytest.mark.timeout(180)
def test_node_session_feed_suite() -> None:
    """`session-feed.test.mjs`: npm `eventsource` on the session feed stops reconnecting
    after the retirement `end` (204), and `followSession` recovers a gap in a turn."""
    settings = make_settings(
        "memory",
        None,
        "jsfeed:",
        api_keys=(API_KEY,),
        jwt_secret=JWT_SECRET,
        max_events_per_run=MAX_EVENTS,
    )
    tokens = {s: mint_subscriber_token(JWT_SECRET, sessions=[s]) for s in ("js-feed", "js-gap")}
    env = {
        "GATEWAY_API_KEY": API_KEY,
        "GATEWAY_MAX_EVENTS": str(MAX_EVENTS),
        "GATEWAY_SESSION_TOKENS": json.dumps(tokens),
    }
    run_node_suite("session-feed.test.mjs", settings, env, 2)
