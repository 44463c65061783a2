"""Shared load generator of the SSE bench scripts (a module, not a bench of its own).

- `SSELoad`: many raw-asyncio SSE clients spread over worker *processes*
  (multiprocessing, spawn). Each worker runs uvloop, opens its share of HTTP/1.1
  connections (responses parsed by httptools, so chunked bodies are handled in C) and
  parses SSE frames: it counts data events (`id:` lines), optionally records the ids,
  measures publish->receive latency from the timestamp the producer embeds as the first
  key of every payload (`{"t": <unix seconds>, ...}`; all processes share one clock),
  and finishes a client at its `end` or `gap` frame.
- `HttpClient`: a minimal keep-alive HTTP/1.1 client (POST/GET, one request in flight
  per connection) used by the producers that publish over HTTP.
- `Proc`: a server process (gateway CLI or a baseline) with CPU time / RSS read from /proc.
- `payload_events(n, size)`: events of ~`size` bytes carrying the publish timestamp.

CPU placement: `pin(pid, cpus)` uses sched_setaffinity; the scripts pin the server under
test to CPU 0 and everything else (load generators, producer, redis-server) to CPU 1 on
this 2-core machine, and print the CPU seconds each side used.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import re
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httptools
import orjson

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
_TS_RE = re.compile(rb'data: \{"t":([0-9.]+)')
# Data events' ids (`<ms>-<seq>`); the terminal `end`/`gap` frames carry `id: end` / `id: gap`.
_ID_RE = re.compile(rb"(?m)^id: ([0-9]+-[0-9]+)$")


def raise_nofile(want: int = 65_536) -> int:
    """Raise RLIMIT_NOFILE (soft) as far as the hard limit allows; children inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def pin(pid: int, cpus: set[int] | None) -> None:
    if cpus and len(os.sched_getaffinity(0) | cpus) > 1:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(pid, cpus)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def payload_events(n: int, size: int = 200, name: str = "token") -> list[dict[str, Any]]:
    """n events whose data is ~`size` bytes of JSON with a fresh publish timestamp first."""
    now = time.time()
    pad = "x" * max(0, size - 40)
    return [{"event": name, "data": {"t": now, "p": pad}} for _ in range(n)]


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


# ------------------------------------------------------------------------ server processes


class Proc:
    """A server subprocess; `cpu()` is its user+system CPU seconds, `rss()` its RSS bytes."""

    def __init__(self, argv: list[str], port: int, cpus: set[int] | None, log: Path) -> None:
        self.port = port
        self.log = log
        self._log_file = log.open("wb")
        self.popen = subprocess.Popen(
            argv, stdout=self._log_file, stderr=subprocess.STDOUT, cwd=ROOT
        )
        pin(self.popen.pid, cpus)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"server exited: {self.log.read_text()[-2000:]}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5),
            ):
                return
            time.sleep(0.05)
        raise RuntimeError("server did not start")

    def cpu(self) -> float:
        fields = Path(f"/proc/{self.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def rss(self) -> int:
        for line in Path(f"/proc/{self.popen.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._log_file.close()

    def __enter__(self) -> Proc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def gateway_proc(
    port: int, cpus: set[int] | None, log: Path, redis_url: str | None = None, *extra: str
) -> Proc:
    argv = [str(VENV_BIN / "gateway"), "serve", "--port", str(port), *extra]
    if redis_url:
        argv += ["--redis-url", redis_url]
    return Proc(argv, port, cpus, log)


def baseline_proc(
    kind: str, port: int, cpus: set[int] | None, log: Path, redis_url: str | None = None
) -> Proc:
    argv = [sys.executable, str(ROOT / "bench" / "baselines.py"), kind, "--port", str(port)]
    if redis_url:
        argv += ["--redis-url", redis_url]
    return Proc(argv, port, cpus, log)


@contextlib.contextmanager
def started(starts: dict[str, Callable[[], Proc]]) -> Iterator[dict[str, Proc]]:
    """The servers `starts` makes, by name, started in order; every one that started is
    stopped on leaving, also when a later one fails to start."""
    with contextlib.ExitStack() as stack:
        yield {name: stack.enter_context(start()) for name, start in starts.items()}


def socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process `pid` holds (none once it is gone)."""
    inodes = set()
    with contextlib.suppress(FileNotFoundError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                link = os.readlink(fd)
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
    return inodes


def local_ports(pid: int) -> set[int]:
    """Local TCP ports of the sockets process `pid` holds (from /proc, IPv4 loopback)."""
    inodes = socket_inodes(pid)
    ports = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[9] in inodes:
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def redis_connections_of(pid: int, client: Any) -> int:
    """Connections of process `pid` among redis-server's CLIENT LIST (matched by port)."""
    ports = local_ports(pid)
    return sum(1 for c in client.client_list() if int(c["addr"].rsplit(":", 1)[1]) in ports)


def redis_cpu(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


# ------------------------------------------------------------------------ HTTP client


class _HttpProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        waiter, self.waiter = self.waiter, None
        body, self.body = b"".join(self.body), []
        if waiter is not None and not waiter.done():
            waiter.set_result((self.parser.get_status_code(), body))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("connection lost"))


class HttpClient:
    """Keep-alive HTTP/1.1 client on one connection; `await request(...)` -> (status, body)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._proto: _HttpProtocol | None = None

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        if (
            self._proto is None
            or self._proto.transport is None
            or self._proto.transport.is_closing()
        ):
            loop = asyncio.get_running_loop()
            _, self._proto = await loop.create_connection(_HttpProtocol, self.host, self.port)
        proto = self._proto
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        for key, value in (headers or {}).items():
            lines.append(f"{key}: {value}")
        if body or method == "POST":
            lines.append("Content-Type: application/json")
            lines.append(f"Content-Length: {len(body)}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode()
        proto.waiter = asyncio.get_running_loop().create_future()
        assert proto.transport is not None
        proto.transport.write(head + body)
        return await proto.waiter

    async def post_json(
        self, path: str, value: Any, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        status, body = await self.request("POST", path, orjson.dumps(value), headers)
        return status, (orjson.loads(body) if body else None)

    def close(self) -> None:
        if self._proto is not None and self._proto.transport is not None:
            self._proto.transport.close()


# ------------------------------------------------------------------------ SSE clients


@dataclass
class ClientSpec:
    path: str
    last_event_id: str | None = None


@dataclass
class LoadResult:
    clients: int = 0
    connected: int = 0
    failed: int = 0
    finished: int = 0  # got an end (or gap) frame
    gaps: int = 0
    events: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    ids: list[list[str]] = field(default_factory=list)  # per client, when record_ids
    counts: list[int] = field(default_factory=list)  # per client
    last_done: float = 0.0  # unix time the last client finished
    first_event: float = 0.0  # unix time of the first data event anywhere
    cpu: float = 0.0  # CPU seconds of the worker processes
    began: float = 0.0  # unix time the first worker started connecting

    def merge(self, other: LoadResult) -> None:
        self.clients += other.clients
        self.connected += other.connected
        self.failed += other.failed
        self.finished += other.finished
        self.gaps += other.gaps
        self.events += other.events
        self.latencies_ms += other.latencies_ms
        self.ids += other.ids
        self.counts += other.counts
        self.last_done = max(self.last_done, other.last_done)
        if other.first_event:
            self.first_event = (
                min(self.first_event, other.first_event) if self.first_event else other.first_event
            )
        self.cpu += other.cpu
        self.began = min(self.began, other.began) if self.began else other.began


class _SSEProtocol(asyncio.Protocol):
    def __init__(self, worker: _Worker, record_ids: bool, latency: bool) -> None:
        self.worker = worker
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.headers_done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.buf = b""
        self.events = 0
        self.ids: list[str] | None = [] if record_ids else None
        self.latency = latency
        self.finished = False
        self.gap = False
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_headers_complete(self) -> None:
        if not self.headers_done.done():
            self.headers_done.set_result(self.parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        buf = self.buf + body if self.buf else body
        cut = buf.rfind(b"\n\n")
        if cut < 0:
            self.buf = buf
            return
        done, self.buf = buf[: cut + 2], buf[cut + 2 :]
        framed = b"\n" + done
        n = framed.count(b"\nid: ") - framed.count(b"\nid: end\n") - framed.count(b"\nid: gap\n")
        if n:
            now = time.time()
            if not self.worker.result.first_event:
                self.worker.result.first_event = now
            self.events += n
            self.worker.result.events += n
            if self.latency:
                lat = self.worker.result.latencies_ms
                for stamp in _TS_RE.findall(done):
                    lat.append((now - float(stamp)) * 1000.0)
            if self.ids is not None:
                self.ids.extend(m.decode() for m in _ID_RE.findall(done))
        if b"event: end\n" in done or b"event: gap\n" in done:
            self.gap = b"event: gap\n" in done
            self._finish()

    def on_message_complete(self) -> None:
        self._finish()

    def _finish(self) -> None:
        if not self.finished:
            self.finished = True
            self.worker.client_done(self)
            if self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.headers_done.done():
            self.headers_done.set_exception(ConnectionError("closed before headers"))
        if not self.finished:
            self.worker.client_lost(self)
        if not self.closed.done():
            self.closed.set_result(None)


class _Worker:
    def __init__(self, host: str, port: int, specs: list[ClientSpec], opts: dict[str, Any]) -> None:
        self.host, self.port, self.specs, self.opts = host, port, specs, opts
        self.result = LoadResult(clients=len(specs))
        self.protos: list[_SSEProtocol] = []
        self.open = 0
        self.connecting = True  # `open` is only counted once every client connected
        self.all_done: asyncio.Event | None = None

    def client_done(self, proto: _SSEProtocol) -> None:
        self.result.finished += 1
        self.result.gaps += int(proto.gap)
        self._closed_one()

    def client_lost(self, proto: _SSEProtocol) -> None:
        self._closed_one()

    def _closed_one(self) -> None:
        self.open -= 1
        self.result.last_done = time.time()
        if self.open <= 0 and self.all_done is not None and not self.connecting:
            self.all_done.set()

    async def _connect(self, spec: ClientSpec, sem: asyncio.Semaphore) -> _SSEProtocol | None:
        loop = asyncio.get_running_loop()
        async with sem:
            for attempt in range(5):
                try:
                    _, proto = await loop.create_connection(
                        lambda: _SSEProtocol(self, self.opts["record_ids"], self.opts["latency"]),
                        self.host,
                        self.port,
                    )
                    break
                except OSError:
                    await asyncio.sleep(0.05 * (attempt + 1))
            else:
                return None
            head = [
                f"GET {spec.path} HTTP/1.1",
                f"Host: {self.host}:{self.port}",
                "Accept: text/event-stream",
            ]
            if spec.last_event_id is not None:
                head.append(f"Last-Event-ID: {spec.last_event_id}")
            assert proto.transport is not None
            proto.transport.write(("\r\n".join(head) + "\r\n\r\n").encode())
            try:
                status = await asyncio.wait_for(proto.headers_done, 60)
            except (ConnectionError, TimeoutError):
                return None
            if status != 200:
                proto.transport.close()
                return None
            return proto

    async def run(self, conn: Any) -> None:
        loop = asyncio.get_running_loop()
        self.all_done = asyncio.Event()
        sem = asyncio.Semaphore(self.opts["connect_concurrency"])
        started = time.perf_counter()
        self.result.began = time.time()
        protos = await asyncio.gather(*(self._connect(s, sem) for s in self.specs))
        self.protos = [p for p in protos if p is not None]
        self.result.connected = len(self.protos)
        self.result.failed = len(self.specs) - len(self.protos)
        self.open = sum(1 for p in self.protos if not p.finished)
        self.connecting = False
        if self.open <= 0:
            self.all_done.set()
        conn.send(
            ("ready", self.result.connected, self.result.failed, time.perf_counter() - started)
        )
        stop = asyncio.Event()
        loop.add_reader(conn.fileno(), lambda: (conn.recv(), stop.set()))
        done_task = asyncio.ensure_future(self.all_done.wait())
        stop_task = asyncio.ensure_future(stop.wait())
        await asyncio.wait([done_task, stop_task], return_when=asyncio.FIRST_COMPLETED)
        loop.remove_reader(conn.fileno())
        os.set_blocking(conn.fileno(), True)  # the loop made it non-blocking
        for p in self.protos:
            if p.transport is not None and not p.transport.is_closing():
                p.transport.close()
        done_task.cancel()
        stop_task.cancel()
        self.result.counts = [p.events for p in self.protos]
        if self.opts["record_ids"]:
            self.result.ids = [p.ids or [] for p in self.protos]
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self.result.cpu = usage.ru_utime + usage.ru_stime
        conn.send(("done", self.result))


def _worker_main(
    host: str,
    port: int,
    specs: list[ClientSpec],
    opts: dict[str, Any],
    conn: Any,
    cpus: set[int] | None,
) -> None:
    raise_nofile()
    if cpus:
        pin(0, cpus)
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    asyncio.run(_Worker(host, port, specs, opts).run(conn))


class SSELoad:
    """SSE clients in `procs` worker processes.

    load = SSELoad(port, specs, procs=2)
    load.start()            # returns once every client has its response headers
    ...publish...
    result = load.wait(60)  # until every client got END/gap (or the timeout)
    """

    def __init__(
        self,
        port: int,
        specs: Sequence[ClientSpec],
        *,
        procs: int = 2,
        host: str = "127.0.0.1",
        record_ids: bool = False,
        latency: bool = True,
        cpus: set[int] | None = None,
        connect_concurrency: int = 200,
    ) -> None:
        self.port, self.host, self.cpus = port, host, cpus
        procs = max(1, min(procs, len(specs)))
        self.shares = [list(specs[i::procs]) for i in range(procs)]
        self.opts = {
            "record_ids": record_ids,
            "latency": latency,
            "connect_concurrency": connect_concurrency,
        }
        self._ctx = mp.get_context("spawn")
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self.connect_seconds = 0.0

    def start(self, timeout: float = 300.0) -> int:
        for share in self.shares:
            parent, child = self._ctx.Pipe()
            proc = self._ctx.Process(
                target=_worker_main,
                args=(self.host, self.port, share, self.opts, child, self.cpus),
                daemon=True,
            )
            proc.start()
            self._procs.append(proc)
            self._conns.append(parent)
        connected = 0
        for conn in self._conns:
            if not conn.poll(timeout):
                raise RuntimeError("load worker did not connect in time")
            _, ok, _failed, seconds = conn.recv()
            connected += ok
            self.connect_seconds = max(self.connect_seconds, seconds)
        return connected

    def wait(self, timeout: float = 300.0) -> LoadResult:
        """Collect results once every client finished, or stop them all at the timeout."""
        deadline = time.monotonic() + timeout
        result = LoadResult()
        pending = list(self._conns)
        while pending:
            left = deadline - time.monotonic()
            conn = pending[0]
            if left <= 0:
                for c in pending:
                    with contextlib.suppress(OSError):
                        c.send("stop")
                deadline = time.monotonic() + 60
                left = 60
            if conn.poll(min(left, 0.5)):
                _, part = conn.recv()
                result.merge(part)
                pending.pop(0)
        for proc in self._procs:
            proc.join(10)
        return result

    def stop(self) -> LoadResult:
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send("stop")
        return self.wait(60)


# ------------------------------------------------------------------------ producers


def _batch_body(n: int, pad: bytes) -> bytes:
    """`{"events": [...]}` of n events, each `{"t": <now>, "p": pad}` (t = publish time)."""
    event = b'{"event":"token","data":{"t":%.6f,"p":"%s"}}' % (time.time(), pad)
    return b'{"events":[' + b",".join([event] * n) + b"]}"


async def http_claim(client: HttpClient, run_id: str) -> str:
    status, body = await client.post_json("/v1/runs", {"run_id": run_id, "takeover": True})
    if status != 201:
        raise RuntimeError(f"claim {run_id}: {status} {body}")
    return str(body["producer_token"])


async def http_produce(
    port: int,
    tokens: dict[str, str],
    events_per_run: int,
    *,
    batch: int = 50,
    rate: float | None = None,
    size: int = 200,
    end: bool = True,
) -> tuple[float, float]:
    """Publish `events_per_run` events to every run over HTTP, then END each run.

    `rate=None`: every run's producer posts batches of `batch` back to back. Otherwise
    each run publishes `rate` events/s on an absolute schedule: one POST per tick of
    max(1/rate, 5 ms) carrying the events due (each stamped with the POST's time).
    Returns (start, end) unix times of the publishing.
    """
    pad = b"x" * max(0, size - 40)

    async def one(run_id: str, token: str) -> None:
        client = HttpClient("127.0.0.1", port)
        headers = {"X-Producer-Token": token}
        path = f"/v1/runs/{run_id}/events"
        sent = 0
        began = time.monotonic()
        tick = 0.0 if rate is None else max(1 / rate, 0.005)
        next_at = began
        while sent < events_per_run:
            if rate is None:
                n = min(batch, events_per_run - sent)
            else:
                next_at += tick
                delay = next_at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                due = int((time.monotonic() - began) * rate) + 1
                n = max(1, min(due - sent, events_per_run - sent, batch))
            status, body = await client.request("POST", path, _batch_body(n, pad), headers)
            if status != 200:
                raise RuntimeError(f"publish {run_id}: {status} {body[:200]!r}")
            sent += n
        if end:
            status, body = await client.request(
                "POST", f"/v1/runs/{run_id}/end", b'{"status":"success"}', headers
            )
            if status != 200:
                raise RuntimeError(f"end {run_id}: {status} {body[:200]!r}")
        client.close()

    start = time.time()
    await asyncio.gather(*(one(r, t) for r, t in tokens.items()))
    return start, time.time()


@dataclass
class Fanout:
    """One fan-out measurement over HTTP."""

    subscribers: int
    delivered: int
    expected: int
    seconds: float
    rate: float  # delivered events/s
    p50_ms: float
    p99_ms: float
    server_cpu: float  # seconds
    client_cpu: float
    finished: int
    extra_cpu: float = 0.0  # e.g. redis-server

    @property
    def cpu_us_per_event(self) -> float:
        return self.server_cpu / max(1, self.delivered) * 1e6


def http_fanout(
    server: Proc,
    runs: int,
    subs_per_run: int,
    events_per_run: int,
    *,
    rate: float | None = None,
    procs: int = 2,
    cpus: set[int] | None = None,
    tag: str = "r",
    prepare: Any = None,
    produce: Any = None,
    extra_cpu: Any = None,
) -> Fanout:
    """Subscribers connect, then a producer publishes; measured until every client's END.

    Default producer: claims and publishes over HTTP. `prepare(run_ids) -> tokens` and
    `produce(tokens) -> (start, end)` replace it (the Redis benches write straight into
    Redis with the gateway's bridge). `extra_cpu()` is another process's CPU seconds
    (redis-server) to report per delivered event too.
    """
    run_ids = [f"{tag}-{time.monotonic_ns()}-{i}" for i in range(runs)]

    async def claim_all() -> dict[str, str]:
        client = HttpClient("127.0.0.1", server.port)
        tokens = {r: await http_claim(client, r) for r in run_ids}
        client.close()
        return tokens

    tokens = asyncio.run(claim_all()) if prepare is None else prepare(run_ids)
    specs = [ClientSpec(f"/v1/runs/{r}/stream") for r in run_ids for _ in range(subs_per_run)]
    load = SSELoad(server.port, specs, procs=procs, cpus=cpus, latency=True)
    connected = load.start()
    if connected != len(specs):
        raise RuntimeError(f"only {connected}/{len(specs)} subscribers connected")
    cpu0 = server.cpu()
    extra0 = extra_cpu() if extra_cpu else 0.0
    if produce is None:
        start, _ = asyncio.run(http_produce(server.port, tokens, events_per_run, rate=rate))
    else:
        start, _ = produce(tokens)
    result = load.wait(600)
    cpu = server.cpu() - cpu0
    extra = (extra_cpu() - extra0) if extra_cpu else 0.0
    seconds = max(1e-9, result.last_done - start)
    return Fanout(
        subscribers=len(specs),
        delivered=result.events,
        expected=len(specs) * events_per_run,
        seconds=seconds,
        rate=result.events / seconds,
        p50_ms=percentile(result.latencies_ms, 50),
        p99_ms=percentile(result.latencies_ms, 99),
        server_cpu=cpu,
        client_cpu=result.cpu,
        finished=result.finished,
        extra_cpu=extra,
    )
