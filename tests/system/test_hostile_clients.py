"""Hostile and careless clients against real servers over real sockets: a client that
leaves mid-body, endless request headers, idle connections that never send a request."""

from __future__ import annotations

import contextlib
import re
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from gateway.http.edge.auth import mint_subscriber_token
from gateway.http.serve.connections import PROBE_RESERVE
from tests.http_app import test_logging
from tests.http_app.test_logging import JsonLogs, request_line
from tests.support import http_server
from tests.support.http_server import ProducerClient, RunningServer
from tests.test_cli import ROOT, clean_env, free_port, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
gateway_server = http_server.gateway_server
client = http_server.client
json_logs = test_logging.json_logs


def _address(server: RunningServer) -> tuple[str, int]:
    host, port = server.base_url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


# --------------------------------------------------------- 6. a client that leaves mid-body


async def test_client_leaving_mid_body_is_a_client_disconnect_not_a_500(
    json_logs: JsonLogs, client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    producer = await ProducerClient.claim(client)
    head = (
        f"POST /v1/runs/{producer.run_id}/events HTTP/1.1\r\n"
        "Host: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"X-Producer-Token: {producer.token}\r\nContent-Length: 10000\r\n\r\n"
    ).encode()
    with socket.create_connection(_address(gateway_server), timeout=10) as sock:
        sock.sendall(head + b'{"event":"token","data":"')
    line = json_logs.wait(request_line("/v1/runs/{run_id}/events", outcome="client_disconnect"))
    assert line["status"] < 500 and line["level"] == "INFO"
    assert not [e for e in json_logs.entries if e.get("level") in ("ERROR", "CRITICAL")]
    assert not [e for e in json_logs.entries if "exc" in e]
    # the server is fine and nothing was appended
    run = await client.get(f"/v1/runs/{producer.run_id}")
    assert run.status_code == 200 and run.json()["retained_events"] == 0


# ------------------------------------------------------- real `gateway serve` processes


class GatewayProcess:
    """`python -m gateway serve` on a free port, optionally with a lower open-file limit."""

    def __init__(self, tmp_path: Path, env: dict[str, str], nofile: int | None = None) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / f"gateway-{self.port}.log"
        self._log = self.log_path.open("w")

        def limit_files() -> None:  # pragma: no cover - runs in the child
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--port", str(self.port)],
            cwd=ROOT,
            env=clean_env(**env),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=limit_files,
        )
        wait_for(self._healthy, 20, "GET /healthz -> 200")

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"gateway exited: {self.log_path.read_text()}")
        try:
            return httpx.get(self.base + "/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()


@contextlib.contextmanager
def gateway_process(
    tmp_path: Path, nofile: int | None = None, **env: str
) -> Iterator[GatewayProcess]:
    process = GatewayProcess(tmp_path, env, nofile)
    try:
        yield process
    finally:
        process.close()


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _read_until_closed(sock: socket.socket, limit: int = 1 << 20) -> bytes:
    """Everything the server sends until it closes (a timeout fails: it kept it open)."""
    received = b""
    with contextlib.suppress(ConnectionResetError):
        while len(received) < limit:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    return received


# ---------------------------------------------------------- 4. unbounded request headers


MB = 1024 * 1024
KEEP_ALIVE_SECONDS = uvicorn.Config(app=None).timeout_keep_alive


@pytest.mark.timeout(90)
def test_an_endless_header_neither_grows_the_process_nor_is_read_whole(tmp_path: Path) -> None:
    with gateway_process(tmp_path) as gateway:
        before = gateway.rss_bytes()
        sent = 0
        with _connect(gateway.port) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Endless: ")
            chunk = b"a" * (64 * 1024)
            with contextlib.suppress(OSError):  # the server closes on us (reset, broken pipe)
                while sent < 64 * MB:
                    sock.sendall(chunk)
                    sent += len(chunk)
            with contextlib.suppress(OSError):
                reply = sock.recv(4096)
                assert reply == b"" or reply.startswith(b"HTTP/1.1 4"), reply
        grown = gateway.rss_bytes() - before
        assert sent < 64 * MB, "the server read a 64 MB header to the end"
        assert grown < 16 * MB, f"RSS grew by {grown / MB:.1f} MB"
        assert httpx.get(gateway.base + "/healthz", timeout=5).status_code == 200


async def test_a_large_body_and_pipelined_requests_are_not_taken_for_a_long_head(
    client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    producer = await ProducerClient.claim(client)
    body = b'{"event":"token","data":"' + b"x" * 600_000 + b'"}'
    request = (
        f"POST /v1/runs/{producer.run_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nX-Producer-Token: {producer.token}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    probe = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with socket.create_connection(_address(gateway_server), timeout=10) as sock:
        sock.sendall(request + probe + probe)  # one write: head, body, two pipelined heads
        replies = b""
        while replies.count(b"HTTP/1.1 200") < 3:
            chunk = sock.recv(65536)
            assert chunk, replies
            replies += chunk
    # Status lines only: an event id or a request id in a body or header may hold "431".
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", replies) == [b"200"] * 3, replies


async def test_too_many_headers_are_refused(
    client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    headers = {f"x-h-{i}": "v" for i in range(150)}
    response = await client.get("/healthz", headers=headers)
    assert response.status_code == 431, response.text
    assert response.json()["error"] == "too_many_headers"
    assert response.headers["connection"] == "close"
    assert (await client.get("/healthz", headers=dict(list(headers.items())[:50]))).is_success


def test_a_431_closes_the_connection(gateway_server: RunningServer) -> None:
    many = "".join(f"x-h-{i}: v\r\n" for i in range(150))
    request = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n{many}\r\n".encode()
    with socket.create_connection(_address(gateway_server), timeout=10) as sock:
        sock.sendall(request)
        # Closed at once, not kept alive until uvicorn's keep-alive timeout (5 s).
        sock.settimeout(KEEP_ALIVE_SECONDS / 2)
        reply = _read_until_closed(sock)
    assert reply.startswith(b"HTTP/1.1 431"), reply
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", reply) == [b"431"]


# ------------------------------------------------------------ 7. unbounded chunked trailers


def _flood_trailers(port: int, head: bytes, line: bytes, limit: int) -> tuple[int, bytes]:
    """Send `head`, then `line` over and over (64 KiB writes) until the server closes or
    `limit` bytes went out; (bytes sent, what the server answered)."""
    sent = 0
    with _connect(port) as sock:
        sock.sendall(head)
        block = line * max(1, (64 * 1024) // len(line))
        with contextlib.suppress(OSError):  # the server closes on us (reset, broken pipe)
            while sent < limit:
                sock.sendall(block)
                sent += len(block)
        sock.settimeout(10)
        reply = _read_until_closed(sock)
    return sent, reply


CHUNKED_PROBE = (
    b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n"
)
CHUNKED_CLAIM = (
    b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n"
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("head", "line", "answered"),
    [
        # A probe answers without reading its body: when its answer went out before the
        # limit was reached, the connection is closed without a second answer.
        (CHUNKED_PROBE, b"X-Trailer: " + b"t" * 40 + b"\r\n", {b"200", b"431"}),
        # a route that reads its body first: 431, then closed
        (CHUNKED_CLAIM, b"X-Trailer: " + b"t" * 40 + b"\r\n", {b"431"}),
        # one trailer line that never ends
        (CHUNKED_CLAIM, b"X-Endless: " + b"e" * 1000, {b"431"}),
    ],
    ids=["probe-many-lines", "claim-many-lines", "claim-one-endless-line"],
)
def test_endless_trailers_are_refused_and_the_connection_closed(
    tmp_path: Path, head: bytes, line: bytes, answered: set[bytes]
) -> None:
    with gateway_process(tmp_path) as gateway:
        before = gateway.rss_bytes()
        sent, reply = _flood_trailers(gateway.port, head, line, 64 * MB)
        grown = gateway.rss_bytes() - before
        assert sent < 64 * MB, "the server read 64 MB of trailers"
        statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", reply)
        assert len(statuses) == 1 and statuses[0] in answered, reply[:300]
        assert grown < 16 * MB, f"RSS grew by {grown / MB:.1f} MB"
        assert httpx.get(gateway.base + "/healthz", timeout=5).status_code == 200


def test_trailers_within_the_limits_are_accepted(gateway_server: RunningServer) -> None:
    request = CHUNKED_CLAIM + b"X-Checksum: abc\r\n\r\n"
    with socket.create_connection(_address(gateway_server), timeout=10) as sock:
        sock.sendall(request)
        reply = b""
        while b"\r\n\r\n" not in reply or b"producer_token" not in reply:
            chunk = sock.recv(65536)
            assert chunk, reply
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 201"), reply


# ------------------------------------------------- 5. connections that never send a request


@pytest.mark.timeout(90)
def test_idle_connections_do_not_shut_out_a_legitimate_client(tmp_path: Path) -> None:
    with gateway_process(tmp_path, nofile=256, GATEWAY_REQUEST_HEAD_TIMEOUT_SECONDS="1") as gateway:
        idle = [_connect(gateway.port) for _ in range(300)]
        try:
            started = time.monotonic()

            def served() -> bool:
                try:
                    response = httpx.get(gateway.base + "/healthz", timeout=2)
                except httpx.TransportError:
                    return False
                return response.status_code == 200

            wait_for(served, 20, "a legitimate GET /healthz -> 200")
            assert time.monotonic() - started < 20
            # the idle connections were closed by the server (or refused at the cap)
            for sock in idle[:20] + idle[-20:]:
                sock.settimeout(10)
                with contextlib.suppress(ConnectionResetError):
                    data = sock.recv(4096)
                    assert data == b"" or data.startswith(b"HTTP/1.1 503"), data
        finally:
            for sock in idle:
                sock.close()


@pytest.mark.timeout(90)
def test_connection_cap_answers_503_and_spares_established_streams(tmp_path: Path) -> None:
    env = {"GATEWAY_MAX_CONNECTIONS": "20", "GATEWAY_REQUEST_HEAD_TIMEOUT_SECONDS": "1"}
    with (
        gateway_process(tmp_path, **env) as gateway,
        httpx.Client(base_url=gateway.base, timeout=10) as client,
    ):
        claim = client.post("/v1/runs", json={}).json()
        run_id, token = claim["run_id"], claim["producer_token"]
        with (
            httpx.Client(base_url=gateway.base, timeout=10) as reader,
            reader.stream("GET", f"/v1/runs/{run_id}/stream") as stream,
        ):
            lines = stream.iter_lines()
            assert next(lines).startswith("retry:")
            idle = [_connect(gateway.port) for _ in range(30)]
            try:
                # Past the cap, within the probe reserve: probes are served, nothing else.
                with _connect(gateway.port) as extra:
                    extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                    reply = extra.recv(4096)
                assert reply.startswith(b"HTTP/1.1 200"), reply
                with _connect(gateway.port) as extra:
                    extra.sendall(b"GET /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                    reply = _read_until_closed(extra)
                assert reply.startswith(b"HTTP/1.1 503"), reply
                assert b"too_many_connections" in reply and b"retry-after: 1" in reply.lower()
                # Past the reserve too: refused at once, probes included.
                idle += [_connect(gateway.port) for _ in range(PROBE_RESERVE)]
                with _connect(gateway.port) as extra:
                    extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                    reply = extra.recv(4096)
                assert reply.startswith(b"HTTP/1.1 503"), reply
                assert b"too_many_connections" in reply and b"retry-after: 1" in reply.lower()
                # the server closes an idle connection at its head deadline; the stream's
                # connection is older, so its deadline has passed too
                idle[0].settimeout(10)
                assert idle[0].recv(4096) == b""
            finally:
                for sock in idle:
                    sock.close()

            def published() -> bool:
                try:
                    response = client.post(
                        f"/v1/runs/{run_id}/events",
                        json={"event": "token", "data": "after"},
                        headers={"X-Producer-Token": token},
                    )
                except httpx.TransportError:
                    return False
                return response.status_code == 200

            wait_for(published, 10, "a publish once the idle connections are gone")
            for line in lines:
                if line.startswith("data: "):
                    assert line == 'data: "after"'
                    break


# ------------------------------------------------ 8. one reader's share of the connections


def _open_stream(port: int, path: str) -> tuple[socket.socket, bytes]:
    """A raw SSE request; the socket and the response head (once its head is in)."""
    sock = _connect(port)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        assert chunk, head
        head += chunk
    return sock, head


@pytest.mark.timeout(90)
def test_one_reader_holds_only_its_share_of_the_connections(tmp_path: Path) -> None:
    secret = "s" * 40
    env = {
        "GATEWAY_API_KEYS": "operator-key-0123456789",
        "GATEWAY_JWT_SECRET": secret,
        "GATEWAY_MAX_CONNECTIONS": "10",
        "GATEWAY_SUBJECT_STREAM_SHARE": "0.4",  # 4 of the 10
    }
    with (
        gateway_process(tmp_path, **env) as gateway,
        httpx.Client(base_url=gateway.base, timeout=10) as client,
    ):
        auth = {"Authorization": "Bearer operator-key-0123456789"}
        run_id = client.post("/v1/runs", json={}, headers=auth).json()["run_id"]
        alice = mint_subscriber_token(secret, runs=[run_id], subject="alice")
        alice_again = mint_subscriber_token(secret, runs=[run_id], subject="alice", ttl_seconds=99)
        bob = mint_subscriber_token(secret, runs=[run_id], subject="bob")
        path = f"/v1/runs/{run_id}/stream?access_token="
        held: list[socket.socket] = []
        try:
            for _ in range(4):
                sock, head = _open_stream(gateway.port, path + alice)
                held.append(sock)
                assert head.startswith(b"HTTP/1.1 200"), head
            # The fifth, with the same subject in another token, is refused: 429.
            sock, head = _open_stream(gateway.port, path + alice_again)
            sock.close()
            assert head.startswith(b"HTTP/1.1 429"), head
            assert b"retry-after: 1" in head.lower()
            waited = client.get(f"/v1/runs/{run_id}/wait?timeout=1&access_token={alice}")
            assert waited.status_code == 429 and waited.json()["error"] == "too_many_streams"
            assert waited.headers["retry-after"] == "1"
            # Everyone else is served: another reader, an API key, the probes.
            sock, head = _open_stream(gateway.port, path + bob)
            held.append(sock)
            assert head.startswith(b"HTTP/1.1 200"), head
            assert client.get("/v1/sessions", headers=auth).status_code == 200
            assert client.get("/readyz").status_code == 200
            # One of alice's streams closes: her share has room again.
            held.pop(0).close()

            def admitted() -> bool:
                sock, head = _open_stream(gateway.port, path + alice_again)
                if head.startswith(b"HTTP/1.1 200"):
                    held.append(sock)
                    return True
                sock.close()
                assert head.startswith(b"HTTP/1.1 429"), head
                return False

            wait_for(admitted, 10, "alice's stream once one of hers closed")
        finally:
            for sock in held:
                sock.close()


async def test_the_share_covers_every_kind_of_stream(key_prefix: str) -> None:
    """Run streams, the LangGraph path, the session feed and /wait count as one share."""
    secret = "s" * 40
    settings = http_server.make_settings(
        "memory",
        None,
        key_prefix,
        api_keys=("operator-key-0123456789",),
        jwt_secret=secret,
        max_connections=40,
        subject_stream_share=0.1,  # 4 of the 40
    )
    auth = {"Authorization": "Bearer operator-key-0123456789"}
    with http_server.serve(settings) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as client:
            claim = (await client.post("/v1/runs", json={"session_id": "s1"}, headers=auth)).json()
            run_id = claim["run_id"]
            token = mint_subscriber_token(secret, sessions=["s1"], subject="alice")
            reader = {"Authorization": f"Bearer {token}"}
            paths = [
                f"/v1/runs/{run_id}/stream",
                f"/threads/s1/runs/{run_id}/stream",
                "/v1/sessions/s1/stream",
                f"/v1/runs/{run_id}/stream",
            ]
            async with contextlib.AsyncExitStack() as stack:
                for path in paths:
                    response = await stack.enter_async_context(
                        client.stream("GET", path, headers=reader)
                    )
                    assert response.status_code == 200, path
                for path in [*paths, f"/v1/runs/{run_id}/wait?timeout=1"]:
                    refused = await client.get(path, headers=reader)
                    assert refused.status_code == 429, path
                    assert refused.json()["error"] == "too_many_streams"
                    assert refused.headers["retry-after"] == "1"
                # The operator's key is a reader of its own.
                async with client.stream("GET", paths[0], headers=auth) as response:
                    assert response.status_code == 200


# Documented in docs/operations.md ("Memory under hostile clients").
STUCK_READER_BYTES = 300 * 1024


@pytest.mark.timeout(120)
def test_readers_that_stop_reading_hold_a_bounded_amount_each(tmp_path: Path) -> None:
    readers = 300
    env = {"GATEWAY_SSE_SEND_TIMEOUT_SECONDS": "120"}  # stuck for the whole test
    with (
        gateway_process(tmp_path, **env) as gateway,
        httpx.Client(base_url=gateway.base, timeout=30) as client,
    ):
        claim = client.post("/v1/runs", json={}).json()
        run_id, token = claim["run_id"], claim["producer_token"]
        before = gateway.rss_bytes()
        stuck: list[socket.socket] = []
        try:
            for _ in range(readers):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.connect(("127.0.0.1", gateway.port))
                request = f"GET /v1/runs/{run_id}/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                sock.sendall(request.encode())
                stuck.append(sock)
            batch = [{"event": "token", "data": "x" * 16_384}] * 50
            peak = before
            for _ in range(10):  # 8 MB each reader would get, far past its buffers
                response = client.post(
                    f"/v1/runs/{run_id}/events",
                    json={"events": batch},
                    headers={"X-Producer-Token": token},
                )
                assert response.status_code == 200
                peak = max(peak, gateway.rss_bytes())
            # Every reader's task has written what its buffers take, and waits.
            for _ in range(20):
                peak = max(peak, gateway.rss_bytes())
                time.sleep(0.1)
        finally:
            for sock in stuck:
                sock.close()
        grown = peak - before
        assert grown < readers * STUCK_READER_BYTES + 16 * MB, f"{grown / MB:.1f} MB"
        print(f"{readers} stuck readers: RSS grew by {grown / MB:.1f} MB")
