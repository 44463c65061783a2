"""`python -m gateway ...` as a real subprocess: config errors, startup policy, demo, SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest

from gateway.settings import is_loopback

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]
HAS_APP = (ROOT / "gateway" / "http" / "app.py").exists()
needs_app = pytest.mark.skipif(
    not HAS_APP, reason="gateway.http.app (create_app) has not landed yet"
)
WATCH_RE = re.compile(r"curl -N(?: -H \"[^\"]*\")? (http://\S+/v1/runs/([^/\s]+)/stream)")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gateway(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=ROOT,
        env=env if env is not None else clean_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll `condition` until it returns a truthy value, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Server:
    """A `gateway serve` subprocess whose stderr goes to a file we can poll."""

    def __init__(self, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.log_path = tmp_path / f"gateway-{self.port}.log"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--port", str(self.port), *args],
            cwd=ROOT,
            env=env if env is not None else clean_env(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.base = f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text()

    def healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"gateway exited {self.proc.returncode}: {self.log()}")
        try:
            return httpx.get(self.base + "/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def wait_healthy(self, timeout: float = 15) -> None:
        wait_for(self.healthy, timeout, "GET /healthz -> 200")

    def terminate(self, timeout: float = 10) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Server:
        server = Server(tmp_path, *args, env=env)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def sse_frames(response: httpx.Response) -> Iterator[dict[str, str]]:
    """A tiny SSE parser: yields each frame's fields ('comment' for ':' lines)."""
    frame: dict[str, str] = {}
    for line in response.iter_lines():
        if line == "":
            if frame:
                yield frame
            frame = {}
            continue
        if line.startswith(":"):
            frame["comment"] = line[1:].strip()
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        frame[name] = frame[name] + "\n" + value if name in frame else value
    if frame:
        yield frame


# -- configuration errors: one line, exit 2, before binding ---------------------------------


@pytest.fixture
def occupied_port() -> Iterator[int]:
    """A port we hold: a gateway that tried to bind it would fail with a bind error."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def assert_config_error(result: subprocess.CompletedProcess[str], needle: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gateway: error:")
    assert needle in lines[0]
    assert "Uvicorn running" not in result.stderr and "address already in use" not in lines[0]
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["--port", "-1"], {}, "port"),
        (["--port", "70000"], {}, "port"),
        (["--port", "eighty"], {}, "--port"),
        (["--heartbeat-interval-seconds", "0"], {}, "heartbeat_interval"),
        (["--heartbeat-interval-seconds", "inf"], {}, "heartbeat_interval"),
        (["--stream-ttl-seconds", "-5"], {}, "stream_ttl"),
        (["--max-events-per-run", "0"], {}, "max_events_per_run"),
        (["--log-format", "xml"], {}, "--log-format"),
        (["--no-such-flag"], {}, "no-such-flag"),
        ([], {"GATEWAY_HEARTBEAT_INTERVAL_SECONDS": "nan"}, "heartbeat_interval"),
        ([], {"GATEWAY_SSE_SEND_TIMEOUT_SECONDS": "inf"}, "sse_send_timeout"),
        ([], {"GATEWAY_PORT": "abc"}, "port"),
        ([], {"GATEWAY_LOG_FORMAT": "yaml"}, "log_format"),
        ([], {"GATEWAY_LEGACY_END_SCAN_ENABLED": "maybe"}, "legacy_end_scan"),
        (["--jwt-secret", "too-short"], {}, "jwt_secret"),
        (["--api-keys", ""], {}, "API key"),
        (["--api-keys", " ", "--host", "0.0.0.0"], {}, "API key"),
        # a GATEWAY_* name that is no setting (here: a name older versions read)
        ([], {"GATEWAY_API_KEY": "k1"}, "unknown settings in the environment: GATEWAY_API_KEY"),
    ],
)
def test_invalid_settings_exit_2_with_one_line(
    occupied_port: int, args: list[str], env: dict[str, str], needle: str
) -> None:
    env = {"GATEWAY_PORT": str(occupied_port), **env}
    result = gateway("serve", *args, env=clean_env(**env))
    assert_config_error(result, needle)


def test_flag_beats_env(occupied_port: int) -> None:
    # A valid flag overrides an invalid env value of the same setting ...
    result = gateway(
        "serve",
        "--port",
        str(occupied_port),
        "--heartbeat-interval-seconds",
        "-1",
        env=clean_env(GATEWAY_HEARTBEAT_INTERVAL_SECONDS="5"),
    )
    assert_config_error(result, "heartbeat_interval")
    # ... and env still fills the settings no flag gave.
    result = gateway(
        "serve", "--port", str(occupied_port), env=clean_env(GATEWAY_MAX_EVENTS_PER_RUN="-3")
    )
    assert_config_error(result, "max_events_per_run")


@needs_app
def test_port_in_use_fails_without_traceback(occupied_port: int) -> None:
    result = gateway("serve", "--port", str(occupied_port))
    assert result.returncode not in (0, 2)
    assert "Traceback" not in result.stderr
    assert "address already in use" in result.stderr.lower()


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["--host", "0.0.0.0"], {}),
        (["--host", "::"], {}),
        (["--host", "192.0.2.10"], {}),
        ([], {"GATEWAY_HOST": "0.0.0.0"}),
        ([], {"GATEWAY_HOST": "0.0.0.0", "GATEWAY_API_KEYS": " , ", "GATEWAY_JWT_SECRET": ""}),
        # Another program's unprefixed variables configure nothing.
        ([], {"GATEWAY_HOST": "0.0.0.0", "API_KEYS": "k1", "JWT_SECRET": "j" * 40}),
    ],
)
def test_non_loopback_without_auth_refuses_to_start(
    occupied_port: int, args: list[str], env: dict[str, str]
) -> None:
    result = gateway("serve", "--port", str(occupied_port), *args, env=clean_env(**env))
    assert_config_error(result, "--allow-open-nonloopback")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.1", False),
        ("example.com", False),
        ("", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


# -- token ------------------------------------------------------------------------------------


def test_token_command_prints_a_scoped_jwt() -> None:
    secret = "k" * 64
    result = gateway("token", "--jwt-secret", secret, "--run", "r1", "--session", "s1")
    assert result.returncode == 0, result.stderr
    claims = jwt.decode(result.stdout.strip(), secret, algorithms=["HS256"])
    assert claims["runs"] == ["r1"] and claims["sessions"] == ["s1"]
    assert 3500 < claims["exp"] - time.time() <= 3600
    result = gateway("token", "--run", "r1", env=clean_env(GATEWAY_JWT_SECRET=secret))
    assert result.returncode == 0
    assert jwt.decode(result.stdout.strip(), secret, algorithms=["HS256"])["runs"] == ["r1"]


def test_token_command_refuses_bad_input() -> None:
    assert_config_error(gateway("token", "--jwt-secret", "x" * 64), "--run")
    assert_config_error(gateway("token", "--jwt-secret", "x" * 64, "--run", "bad id"), "run_id")


# -- running servers ------------------------------------------------------------------------


@needs_app
def test_allow_open_nonloopback_forces_start(start_server: Callable[..., Server]) -> None:
    server = start_server("--host", "0.0.0.0", "--allow-open-nonloopback", "--log-format", "json")
    server.wait_healthy()
    assert server.terminate() == 0
    entries = [json.loads(line) for line in server.log().splitlines() if line.strip()]
    assert entries and all({"ts", "level", "logger", "msg"} <= e.keys() for e in entries)


@needs_app
def test_cors_origin_flags_and_env(start_server: Callable[..., Server]) -> None:
    """`--cors-origins` (repeatable) and `GATEWAY_CORS_ORIGINS` reach the CORS rules."""
    flagged = start_server(
        "--cors-origins", "http://a.example", "--cors-origins", "http://b.example"
    )
    env = {**clean_env(), "GATEWAY_CORS_ORIGINS": "http://c.example"}
    from_env = start_server(env=env)
    preflight = {"Access-Control-Request-Method": "GET"}
    for server, allowed in ((flagged, "http://b.example"), (from_env, "http://c.example")):
        server.wait_healthy()
        url = server.base + "/v1/sessions"
        ok = httpx.options(url, headers={**preflight, "Origin": allowed}, timeout=5)
        assert ok.headers.get("access-control-allow-origin") == allowed
        other = httpx.options(url, headers={**preflight, "Origin": "http://z.example"}, timeout=5)
        assert "access-control-allow-origin" not in other.headers
        assert server.terminate() == 0
    bad = start_server("--cors-origins", "not-an-origin")
    assert bad.proc.wait(timeout=15) == 2
    assert "origin" in bad.log()


def read_demo_stream(url: str, headers: dict[str, str] | None = None) -> list[dict[str, str]]:
    frames: list[dict[str, str]] = []
    timeout = httpx.Timeout(10, read=20)
    with httpx.stream("GET", url, headers=headers, timeout=timeout) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for frame in sse_frames(response):
            frames.append(frame)
            if frame.get("event") in ("end", "gap"):
                break
    return frames


@needs_app
def test_serve_demo_streams_tokens_then_end(start_server: Callable[..., Server]) -> None:
    server = start_server("--demo")
    server.wait_healthy()
    match = wait_for(lambda: WATCH_RE.search(server.log()), 15, "the demo's curl line")
    url, run_id = match.group(1), match.group(2)
    assert url == f"{server.base}/v1/runs/{run_id}/stream"
    frames = read_demo_stream(url)
    tokens = [f for f in frames if f.get("event") == "token"]
    assert len(tokens) >= 2
    assert all("id" in f and "text" in json.loads(f["data"]) for f in tokens)
    assert frames[-1]["event"] == "end" and frames[-1]["id"] == "end"
    assert json.loads(frames[-1]["data"])["status"] == "success"
    assert server.terminate() == 0


@needs_app
def test_serve_demo_turns_are_turns_of_the_demo_session(
    start_server: Callable[..., Server],
) -> None:
    """`serve --demo` is a producer like any other: its turn is in the session `demo`
    while it streams (what the console opens on), also when the gateway needs keys."""
    server = start_server("--demo", env=clean_env(GATEWAY_API_KEYS="operator-key"))
    server.wait_healthy()
    wait_for(lambda: WATCH_RE.search(server.log()), 15, "the demo's curl line")
    headers = {"Authorization": "Bearer operator-key"}

    def streaming_turn() -> Any:
        reply = httpx.get(f"{server.base}/v1/sessions/demo/turns", headers=headers, timeout=5)
        turns = reply.json()["turns"]
        return turns and turns[-1]["state"] == "running" and turns[-1]["text"] and turns[-1]

    turn = wait_for(streaming_turn, 15, "the demo turn streaming in its session")
    assert turn["history"][0]["role"] == "user"
    assert f"open the console: {server.base}/?session=demo" in server.log()
    assert "operator-key" not in server.log()
    assert server.terminate() == 0


@needs_app
def test_sigterm_with_an_open_stream_exits_0_promptly(
    start_server: Callable[..., Server],
) -> None:
    server = start_server("--demo", "--heartbeat-interval-seconds", "0.5")
    server.wait_healthy()
    match = wait_for(lambda: WATCH_RE.search(server.log()), 15, "the demo's curl line")
    timeout = httpx.Timeout(10, read=15)
    with httpx.stream("GET", match.group(1), timeout=timeout) as response:
        assert response.status_code == 200
        frames = sse_frames(response)
        next(frames)  # the stream is established
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        for _ in frames:  # the server ends the response by itself
            pass
    assert server.proc.wait(timeout=10) == 0
    assert time.monotonic() - started < 8
    assert "Traceback" not in server.log()


@needs_app
def test_demo_command_produces_over_http(start_server: Callable[..., Server]) -> None:
    key = "producer-key-123"
    server = start_server("--api-keys", key)
    server.wait_healthy()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway",
            "demo",
            "--url",
            server.base,
            "--runs",
            "1",
            "--token-delay",
            "0",
            "--pause",
            "0",
        ],
        cwd=ROOT,
        env=clean_env(GATEWAY_API_KEYS=key),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    match = WATCH_RE.search(result.stderr)
    assert match is not None, result.stderr
    frames = read_demo_stream(match.group(1), headers={"Authorization": f"Bearer {key}"})
    assert len([f for f in frames if f.get("event") == "token"]) >= 2
    assert json.loads(frames[-1]["data"])["status"] == "success"
    # Without credentials the same stream is refused.
    assert httpx.get(match.group(1), timeout=5).status_code == 401
    assert server.terminate() == 0


@needs_app
def test_demo_with_jwt_secret_hints_a_token_that_reads_the_run(
    start_server: Callable[..., Server],
) -> None:
    secret = "j" * 64
    server = start_server("--demo", env=clean_env(GATEWAY_JWT_SECRET=secret))
    server.wait_healthy()
    match = wait_for(lambda: WATCH_RE.search(server.log()), 15, "the demo's curl line")
    run_id = match.group(2)
    assert f'-H "Authorization: Bearer $(gateway token --run {run_id})"' in match.group(0)
    minted = gateway("token", "--run", run_id, env=clean_env(GATEWAY_JWT_SECRET=secret))
    token = minted.stdout.strip()
    frames = read_demo_stream(f"{match.group(1)}?access_token={token}")
    assert frames[-1]["event"] == "end"
    assert token not in server.log()  # access_token is masked in the access log
    other = gateway("token", "--run", "another-run", env=clean_env(GATEWAY_JWT_SECRET=secret))
    forbidden = httpx.get(match.group(1), params={"access_token": other.stdout.strip()}, timeout=5)
    assert forbidden.status_code == 403
    assert forbidden.json()["error"] == "forbidden"
    assert server.terminate() == 0
