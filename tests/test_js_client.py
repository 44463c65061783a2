"""A second, independent client: `node --test tests/js/` (npm `eventsource` package).

Starts a real gateway (memory bridge, an API key and a JWT secret, small retention so
the Node test can force a gap), runs the Node test suite against it, and asserts it
passed. `npm ci` runs here when scripts/bootstrap did not install tests/js/node_modules.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gateway.http.auth import mint_subscriber_token
from tests.http_server import make_settings, serve

JS_DIR = Path(__file__).resolve().parent / "js"
API_KEY = "js-test-key"
JWT_SECRET = "js-test-secret-with-enough-bytes-for-hs256"
MAX_EVENTS = 5
SCOPED_RUN = "js-scoped-run"


def _node_modules() -> None:
    if (JS_DIR / "node_modules" / "eventsource" / "package.json").is_file():
        return
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed (needed for the pinned eventsource package)")
    subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=JS_DIR,
        check=True,
        timeout=120,
    )


@pytest.mark.timeout(180)
def test_node_eventsource_client_suite() -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    _node_modules()
    settings = make_settings(
        "memory",
        None,
        "js:",
        api_keys=(API_KEY,),
        jwt_secret=JWT_SECRET,
        max_events_per_run=MAX_EVENTS,
    )
    with serve(settings) as srv:
        env = {
            **os.environ,
            "GATEWAY_URL": srv.base_url,
            "GATEWAY_API_KEY": API_KEY,
            "GATEWAY_MAX_EVENTS": str(MAX_EVENTS),
            "GATEWAY_SCOPED_RUN": SCOPED_RUN,
            "GATEWAY_SCOPED_TOKEN": mint_subscriber_token(JWT_SECRET, runs=[SCOPED_RUN]),
        }
        proc = subprocess.run(
            [node, "--test", "--test-reporter=spec", "eventsource.test.mjs"],
            cwd=JS_DIR,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    assert "# fail 0" in report or "fail 0" in report, report
    assert "pass 6" in report, report


@pytest.mark.timeout(180)
def test_node_session_feed_suite() -> None:
    """`session-feed.test.mjs`: npm `eventsource` on the session feed stops reconnecting
    after the retirement `end` (204), and `followSession` recovers a gap in a turn."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    _node_modules()
    settings = make_settings(
        "memory",
        None,
        "jsfeed:",
        api_keys=(API_KEY,),
        jwt_secret=JWT_SECRET,
        max_events_per_run=MAX_EVENTS,
    )
    tokens = {s: mint_subscriber_token(JWT_SECRET, sessions=[s]) for s in ("js-feed", "js-gap")}
    with serve(settings) as srv:
        env = {
            **os.environ,
            "GATEWAY_URL": srv.base_url,
            "GATEWAY_API_KEY": API_KEY,
            "GATEWAY_MAX_EVENTS": str(MAX_EVENTS),
            "GATEWAY_SESSION_TOKENS": json.dumps(tokens),
        }
        proc = subprocess.run(
            [node, "--test", "--test-reporter=spec", "session-feed.test.mjs"],
            cwd=JS_DIR,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    assert "pass 2" in report, report
