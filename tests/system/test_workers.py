"""`gateway serve --workers N` as real processes on a real redis-server: one listening
socket served by every worker, SSE and producer routes across workers, clean stops."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.test_cli import (
    ROOT,
    Server,
    assert_config_error,
    clean_env,
    gateway,
    sse_frames,
    wait_for,
)

pytestmark = pytest.mark.timeout(60)

_TCP_LISTEN, _TCP_ESTABLISHED = "0A", "01"


class WorkersServer(Server):
    """A `gateway serve --workers` subprocess; `seen` are the child pids found so far."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        super().__init__(tmp_path, *args)
        self.seen: set[int] = set()


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., WorkersServer]]:
    servers: list[WorkersServer] = []

    def start(*args: str) -> WorkersServer:
        server = WorkersServer(tmp_path, *args)
        servers.append(server)
        return server

    yield start
    for server in servers:
        pids = server.seen | set(children(server.proc.pid))
        server.close()
        for pid in pids:  # never leave a worker behind, whatever the test did
            if not gone(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


# -- /proc: which process holds which socket -----------------------------------------------


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return []
    return [int(p) for p in text.split()]


def gone(pid: int) -> bool:
    """The process has exited (a zombie waiting for init to reap it counts as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    with contextlib.suppress(FileNotFoundError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                link = os.readlink(fd)
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
    return inodes


def tcp_sockets(port: int, state: str) -> set[str]:
    """Inodes of the IPv4 TCP sockets on local `port` in `state` (gateway side)."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == state:
            inodes.add(fields[9])
    return inodes


def workers_of(server: WorkersServer) -> list[int]:
    """The parent's children that hold the listening socket (not multiprocessing's
    resource tracker), once there are two of them."""
    listening = tcp_sockets(server.port, _TCP_LISTEN)
    everyone = children(server.proc.pid)
    server.seen.update(everyone)
    pids = [pid for pid in everyone if socket_inodes(pid) & listening]
    return pids if len(pids) == 2 else []


def connections_by_worker(server: Server, pids: list[int]) -> dict[int, int]:
    established = tcp_sockets(server.port, _TCP_ESTABLISHED)
    return {pid: len(socket_inodes(pid) & established) for pid in pids}


def redis_args(redis_url: str, key_prefix: str) -> list[str]:
    return ["--redis-url", redis_url, "--redis-key-prefix", key_prefix]


# -- tests ---------------------------------------------------------------------------------


def test_memory_bridge_refuses_more_than_one_worker() -> None:
    for args, env in ((["--workers", "2"], {}), ([], {"GATEWAY_WORKERS": "2"})):
        result = gateway("serve", *args, env=clean_env(**env))
        assert_config_error(result, "needs the Redis bridge: set --redis-url")
    # one worker is how the memory bridge has always run
    assert_config_error(gateway("serve", "--workers", "0"), "workers")


def test_demo_refuses_more_than_one_worker(redis_url: str) -> None:
    result = gateway("serve", "--workers", "2", "--demo", "--redis-url", redis_url)
    assert_config_error(result, "--demo runs in a single process")


def test_port_in_use_fails_in_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["serve", "--workers", "2", "--port", str(port), "--redis-url", "redis://x:1"]
        result = subprocess.run(
            [sys.executable, "-m", "gateway", *argv],
            cwd=ROOT,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert result.returncode == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "address already in use" in lines[0].lower(), result.stderr


def test_two_workers_serve_sse_and_producer_routes_then_stop_on_sigterm(
    start_server: Callable[..., WorkersServer], redis_url: str, key_prefix: str
) -> None:
    server = start_server("--workers", "2", *redis_args(redis_url, key_prefix))
    server.wait_healthy()
    pids = wait_for(lambda: workers_of(server), 15, "two workers holding the listening socket")
    assert server.proc.pid not in pids

    run_id = "workers-run"
    claim = httpx.post(f"{server.base}/v1/runs", json={"run_id": run_id}, timeout=5)
    assert claim.status_code == 201, claim.text
    headers = {"X-Producer-Token": claim.json()["producer_token"]}

    with contextlib.ExitStack() as stack:
        streams: list[Iterator[dict[str, str]]] = []

        def open_stream_and_check() -> bool:
            # Each stream is a new connection; the kernel hands it to whichever worker
            # accepts first, so open streams until both workers hold one.
            timeout = httpx.Timeout(10, read=20)
            url = f"{server.base}/v1/runs/{run_id}/stream"
            response = stack.enter_context(httpx.stream("GET", url, timeout=timeout))
            assert response.status_code == 200
            streams.append(sse_frames(response))
            return all(connections_by_worker(server, pids).values())

        wait_for(open_stream_and_check, 20, "an SSE stream served by each worker")
        assert len(streams) <= 100

        # Producer requests on fresh connections land on either worker; every reader,
        # whichever worker it is on, gets every event through Redis.
        for i in range(6):
            with httpx.Client(timeout=5) as client:
                reply = client.post(
                    f"{server.base}/v1/runs/{run_id}/events",
                    json={"event": "token", "data": {"i": i}},
                    headers=headers,
                )
                assert reply.status_code == 200, reply.text
        end = httpx.post(
            f"{server.base}/v1/runs/{run_id}/end",
            json={"status": "success"},
            headers=headers,
            timeout=5,
        )
        assert end.status_code == 200, end.text
        for frames in streams:
            got = []
            for frame in frames:
                if frame.get("event") == "token":
                    got.append(json.loads(frame["data"])["i"])
                if frame.get("event") in ("end", "gap"):
                    assert frame["event"] == "end"
                    break
            assert got == list(range(6))

    everyone = children(server.proc.pid)  # the workers and multiprocessing's tracker
    assert server.terminate(timeout=20) == 0
    wait_for(lambda: all(gone(pid) for pid in everyone), 10, "every child process gone")
    log = server.log()
    assert "Traceback" not in log
    for pid in pids:
        assert f"event=worker_exited pid={pid} exit_code=0" in log


def test_sigterm_ends_open_streams_on_every_worker(
    start_server: Callable[..., WorkersServer], redis_url: str, key_prefix: str
) -> None:
    server = start_server("--workers", "2", *redis_args(redis_url, key_prefix))
    server.wait_healthy()
    pids = wait_for(lambda: workers_of(server), 15, "two workers holding the listening socket")
    claim = httpx.post(f"{server.base}/v1/runs", json={"run_id": "open-run"}, timeout=5)
    assert claim.status_code == 201
    with contextlib.ExitStack() as stack:
        responses: list[httpx.Response] = []

        def open_stream() -> bool:
            url = f"{server.base}/v1/runs/open-run/stream"
            timeout = httpx.Timeout(10, read=20)
            responses.append(stack.enter_context(httpx.stream("GET", url, timeout=timeout)))
            return all(connections_by_worker(server, pids).values())

        wait_for(open_stream, 20, "an SSE stream served by each worker")
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        for response in responses:  # each worker drains its own streams and ends them
            comments = [f.get("comment") or "" for f in sse_frames(response)]
            assert any(c.startswith("shutdown") for c in comments), comments
    assert server.proc.wait(timeout=15) == 0
    assert time.monotonic() - started < 10
    wait_for(lambda: all(gone(pid) for pid in pids), 10, "both workers gone")


def test_a_worker_that_dies_stops_the_others(
    start_server: Callable[..., WorkersServer], redis_url: str, key_prefix: str
) -> None:
    server = start_server("--workers", "2", *redis_args(redis_url, key_prefix))
    server.wait_healthy()
    pids = wait_for(lambda: workers_of(server), 15, "two workers holding the listening socket")
    # A worker holds the socket from its spawn; one still starting up would die of the
    # SIGTERM (exit -15, see gateway.supervisor), so both must be serving first.
    wait_for(
        lambda: server.log().count("Application startup complete") >= 2, 20, "both workers serving"
    )
    os.kill(pids[0], signal.SIGKILL)
    # the service manager sees the failure and restarts the whole set
    assert server.proc.wait(timeout=20) == 128 + signal.SIGKILL
    wait_for(lambda: gone(pids[1]), 10, "the other worker gone")
    assert f"event=worker_exited pid={pids[1]} exit_code=0" in server.log()


def test_workers_stop_when_the_parent_is_killed(
    start_server: Callable[..., WorkersServer], redis_url: str, key_prefix: str
) -> None:
    server = start_server("--workers", "2", *redis_args(redis_url, key_prefix))
    server.wait_healthy()
    pids = wait_for(lambda: workers_of(server), 15, "two workers holding the listening socket")
    server.proc.kill()
    server.proc.wait(timeout=10)
    wait_for(lambda: all(gone(pid) for pid in pids), 20, "both orphaned workers gone")
    with socket.socket() as probe:  # and nothing listens on the port any more
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", server.port))
