"""Real ``redis-server`` processes for tests (no fakes, no mocks).

``RedisServer`` runs one server on a free 127.0.0.1 port in its own temp dir;
``RedisCluster`` runs a Redis Cluster (3 masters + 1 replica each by default).
Both wait for readiness by polling with a deadline, never by a blind sleep, and
both are context managers. Every process started here is also killed at
interpreter exit (and, where possible, when the test process dies) so a failing
or interrupted test run does not leak servers.

    with RedisServer() as srv:                       # srv.url, srv.port, srv.dir
        ...
    srv = RedisServer("--appendonly", "yes").start()
    srv.kill(); srv.restart()                        # same port + dir: AOF survives
    srv.close()                                      # stop + remove the temp dir

    with RedisCluster() as cluster:                  # cluster.url, cluster.nodes
        ...

    # TLS only (no plain port), AUTH on, client certificates required:
    with RedisServer(tls=make_tls_files(tmp), password="pw") as srv:   # srv.url: rediss://
        ...
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import quote, urlencode, urlparse

import redis

from tests.support.tls import TlsFiles

REDIS_SERVER_BIN = os.environ.get("REDIS_SERVER_BIN", "redis-server")
REDIS_CLI_BIN = os.environ.get("REDIS_CLI_BIN", "redis-cli")
HOST = "127.0.0.1"
START_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0
CLUSTER_TIMEOUT = 60.0
_POLL = 0.01

DEFAULT_ARGS: tuple[str, ...] = (
    "--save",
    "",
    "--appendonly",
    "no",
    "--repl-diskless-sync-delay",
    "0",
    "--enable-debug-command",
    "local",
)

_live: weakref.WeakSet[RedisServer] = weakref.WeakSet()


@atexit.register
def _kill_leftovers() -> None:
    for server in list(_live):
        with contextlib.suppress(Exception):
            server.kill()


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port(*, cluster_bus: bool = False, exclude: Iterable[int] = ()) -> int:
    """A port that is free right now on 127.0.0.1 (and port+10000 too if ``cluster_bus``)."""
    taken = set(exclude)
    for _ in range(1000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((HOST, 0))
            port = int(s.getsockname()[1])
        if port in taken:
            continue
        bus = port + 10000
        if cluster_bus and (bus > 65535 or bus in taken or not _port_free(bus)):
            continue
        return port
    raise RuntimeError("could not find a free port")


def _deadline_poll(
    what: str,
    check: Callable[[], bool],
    timeout: float,
    on_fail: Callable[[], str] = str,
    transient: tuple[type[BaseException], ...] = (redis.RedisError, OSError),
) -> None:
    """Call ``check`` until it returns True, or raise TimeoutError after ``timeout`` seconds.

    Polls, because what it waits for is another process (a server answering, a port
    opening): there is no event in this process to await. ``transient`` errors from
    ``check`` count as "not yet".
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            if check():
                return
        except transient as exc:
            last_exc = exc
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"timed out after {timeout}s waiting for {what}: {last_exc!r}\n{on_fail()}"
            )
        time.sleep(_POLL)


def _pdeathsig() -> None:  # pragma: no cover - runs in the child between fork and exec
    # Ask Linux to SIGKILL redis-server if the thread that started it dies (e.g. pytest is
    # killed hard). Only used when starting from the main thread: the signal is tied to the
    # *thread*, so a worker thread exiting would otherwise take the server down with it.
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class RedisServer:
    """One real redis-server process.

    ``RedisServer(*extra_args, port=None, directory=None)``: ``extra_args`` are appended
    after the defaults (``--save "" --appendonly no``...), so they override them
    (e.g. ``"--appendonly", "yes"``). Without ``port`` a free one is picked (and retried
    if another process grabs it first). Without ``directory`` a temp dir is created and
    removed by ``close()``. The server starts on ``start()`` or on entering ``with``.
    With ``tls`` the port is a TLS port (no plain one) that requires a client
    certificate from the same CA; with ``password`` clients must AUTH (``requirepass``).
    ``url`` then carries both (``rediss://:pw@…?ssl_ca_certs=…``).
    """

    external = False

    def __init__(
        self,
        *extra_args: str,
        port: int | None = None,
        directory: str | os.PathLike[str] | None = None,
        cluster: bool = False,
        tls: TlsFiles | None = None,
        password: str | None = None,
    ) -> None:
        self.extra_args: tuple[str, ...] = tuple(extra_args)
        self.cluster = cluster
        self.tls = tls
        self.password = password
        self._fixed_port = port is not None
        self.port: int = port if port is not None else 0
        self._own_dir = directory is None
        self.dir = (
            Path(directory)
            if directory is not None
            else Path(tempfile.mkdtemp(prefix="redis-test-"))
        )
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None

    # -- addresses -------------------------------------------------------------------
    @property
    def host(self) -> str:
        return HOST

    @property
    def url(self) -> str:
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        if self.tls is None:
            return f"redis://{auth}{HOST}:{self.port}"
        query = urlencode(
            {
                "ssl_ca_certs": self.tls.ca,
                "ssl_certfile": self.tls.client_cert,
                "ssl_keyfile": self.tls.client_key,
            }
        )
        return f"rediss://{auth}{HOST}:{self.port}/0?{query}"

    @property
    def address(self) -> tuple[str, int]:
        return (HOST, self.port)

    @property
    def log_path(self) -> Path:
        return self.dir / "redis.log"

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no redis log)"
        return "\n".join(text.splitlines()[-lines:])

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def client(self, **kwargs: object) -> redis.Redis:
        """A synchronous redis-py client for this server (caller closes it)."""
        kwargs.setdefault("socket_timeout", 5)
        if self.password:
            kwargs.setdefault("password", self.password)
        if self.tls is not None:
            kwargs.update(
                ssl=True,
                ssl_ca_certs=str(self.tls.ca),
                ssl_certfile=str(self.tls.client_cert),
                ssl_keyfile=str(self.tls.client_key),
            )
        return redis.Redis(host=HOST, port=self.port, **kwargs)  # type: ignore[arg-type]

    # -- lifecycle -------------------------------------------------------------------
    def _argv(self) -> list[str]:
        if self.tls is None:
            listen = ["--port", str(self.port)]
        else:
            listen = [
                "--port", "0",
                "--tls-port", str(self.port),
                "--tls-cert-file", str(self.tls.server_cert),
                "--tls-key-file", str(self.tls.server_key),
                "--tls-ca-cert-file", str(self.tls.ca),
                "--tls-auth-clients", "yes",
            ]  # fmt: skip
            if self.cluster:
                listen += ["--tls-cluster", "yes", "--tls-replication", "yes"]
        if self.password:
            listen += ["--requirepass", self.password, "--masterauth", self.password]
        argv = [
            REDIS_SERVER_BIN,
            *listen,
            "--bind",
            HOST,
            "--dir",
            str(self.dir),
            "--logfile",
            str(self.log_path),
            "--daemonize",
            "no",
            *DEFAULT_ARGS,
        ]
        if self.cluster:
            argv += [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
            ]
        return argv + list(self.extra_args)

    def start(self) -> Self:
        if self.running:
            return self
        attempts = 1 if self._fixed_port else 5
        for attempt in range(attempts):
            if not self._fixed_port:
                self.port = free_port(cluster_bus=self.cluster)
            try:
                self._spawn_and_wait()
                return self
            except _PortTaken:
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def _spawn_and_wait(self) -> None:
        with contextlib.suppress(OSError):
            self.log_path.unlink()
        main = threading.current_thread() is threading.main_thread()
        self.proc = subprocess.Popen(
            self._argv(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=self.dir,
            preexec_fn=_pdeathsig if main else None,
        )
        _live.add(self)
        proc = self.proc

        def ready() -> bool:
            if proc.poll() is not None:
                raise _Exited()
            with contextlib.ExitStack() as stack:
                s = stack.enter_context(socket.create_connection((HOST, self.port), timeout=1))
                if self.tls is not None:  # (the TLS socket takes over the descriptor)
                    context = self.tls.client_context()
                    s = stack.enter_context(context.wrap_socket(s, server_hostname=HOST))
                # Without AUTH a server with a password answers -NOAUTH: it is up.
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith((b"+PONG", b"-NOAUTH"))

        try:
            _deadline_poll(f"redis-server on port {self.port}", ready, START_TIMEOUT, self.log_tail)
        except _Exited:
            stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            log = self.log_tail()
            self.proc = None
            if "Address already in use" in log + stderr:
                raise _PortTaken() from None
            raise RuntimeError(
                f"redis-server exited with {proc.returncode} on port {self.port}:\n{stderr}\n{log}"
            ) from None
        except BaseException:
            self.kill()
            raise

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM and wait (SIGKILL if it does not exit within ``timeout``)."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._reap()

    def kill(self) -> None:
        """SIGKILL (no shutdown work: whatever was not fsynced is lost) and wait."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        self._reap()

    def _reap(self) -> None:
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()
        self.proc = None
        _live.discard(self)

    def restart(self, *extra_args: str, kill: bool = False) -> Self:
        """Stop (or ``kill``) if running, then start again on the same port and dir.

        With ``extra_args`` the new process uses those instead of the original extras.
        """
        if kill:
            self.kill()
        else:
            self.stop()
        if extra_args:
            self.extra_args = tuple(extra_args)
        self._fixed_port = True  # keep the port: clients and AOF/RDB files refer to it
        return self.start()

    def close(self) -> None:
        """Stop and remove the temp dir (if this object created it)."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<RedisServer {self.url} {state} dir={self.dir}>"


class _Exited(Exception):
    pass


class _PortTaken(Exception):
    pass


class ExternalRedis:
    """A Redis given by URL (env ``REDIS_URL``): never started, stopped or flushed here."""

    external = True

    def __init__(self, url: str) -> None:
        self.url = url
        parsed = urlparse(url)
        self.host = parsed.hostname or HOST
        self.port = parsed.port or 6379

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis.from_url(self.url, **kwargs)

    def __repr__(self) -> str:
        return f"<ExternalRedis {self.url}>"


def _parse_info(raw: object) -> dict[str, str]:
    """INFO / CLUSTER INFO reply (raw text or redis-py's parsed dict) -> {str: str}."""
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items()}
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    out: dict[str, str] = {}
    for line in text.splitlines():
        if ":" in line and not line.startswith("#"):
            k, _, v = line.partition(":")
            out[k.strip()] = v.strip()
    return out


class RedisCluster:
    """A real Redis Cluster: ``masters`` masters (>= 3) each with ``replicas`` replicas.

    Nodes run with ``--cluster-enabled yes --cluster-config-file nodes.conf
    --cluster-node-timeout 2000`` plus ``extra_args``. ``start()`` returns once every
    node reports ``cluster_state:ok`` with all 16384 slots, every node sees the same
    masters/replicas, and every replica's link is up and synced.
    """

    def __init__(self, masters: int = 3, replicas: int = 1, *extra_args: str) -> None:
        if masters < 3:
            raise ValueError("redis-cli --cluster create needs at least 3 masters")
        self.n_masters = masters
        self.n_replicas = replicas
        self.extra_args = tuple(extra_args)
        self.nodes: list[RedisServer] = []

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>`` of a node that was a master at creation."""
        return self.nodes[0].url if self.nodes else ""

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [n.address for n in self.nodes]

    @property
    def masters(self) -> list[RedisServer]:
        return [n for n in self.nodes if n.running and self._role(n) == "master"]

    @property
    def replicas(self) -> list[RedisServer]:
        return [n for n in self.nodes if n.running and self._role(n) == "slave"]

    @classmethod
    def _role(cls, node: RedisServer) -> str:
        return cls._info(node, "replication").get("role", "")

    @staticmethod
    def _info(node: RedisServer, section: str) -> dict[str, str]:
        with node.client() as c:
            return _parse_info(c.execute_command("INFO", section))

    @staticmethod
    def _cluster_info(node: RedisServer) -> dict[str, str]:
        with node.client() as c:
            return _parse_info(c.execute_command("CLUSTER", "INFO"))

    def start(self) -> Self:
        total = self.n_masters * (1 + self.n_replicas)
        try:
            ports: list[int] = []
            for _ in range(total):
                node = RedisServer(*self.extra_args, cluster=True)
                # Keep ports (and their bus ports) distinct across nodes.
                node.port = free_port(cluster_bus=True, exclude=ports + [p + 10000 for p in ports])
                node._fixed_port = True
                node.start()
                ports.append(node.port)
                self.nodes.append(node)
            cmd = [
                REDIS_CLI_BIN,
                "--cluster",
                "create",
                *(f"{HOST}:{p}" for p in ports),
                "--cluster-replicas",
                str(self.n_replicas),
                "--cluster-yes",
            ]
            res = subprocess.run(
                cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=CLUSTER_TIMEOUT
            )
            if res.returncode != 0:
                raise RuntimeError(
                    "redis-cli --cluster create failed:\n"
                    + res.stdout.decode(errors="replace")
                    + res.stderr.decode(errors="replace")
                )
            self.wait_ok()
        except BaseException:
            self.close()
            raise
        return self

    def wait_ok(self, timeout: float = CLUSTER_TIMEOUT) -> None:
        """Block until the running nodes agree the cluster is healthy and replicas are synced."""
        running = [n for n in self.nodes if n.running]
        want_masters = self.n_masters
        want_replicas = len(running) - want_masters

        def ok() -> bool:
            for node in running:
                info = self._cluster_info(node)
                if info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != "16384":
                    return False
                with node.client() as c:
                    raw = c.execute_command("CLUSTER", "NODES")
                text = raw.decode() if isinstance(raw, bytes) else str(raw)
                m = r = 0
                for line in text.splitlines():
                    flags = line.split()[2].split(",")
                    if "fail" in flags or "fail?" in flags or "handshake" in flags:
                        continue
                    if "master" in flags:
                        m += 1
                    elif "slave" in flags:
                        r += 1
                if (m, r) != (want_masters, want_replicas):
                    return False
                repl = self._info(node, "replication")
                if repl.get("role") == "slave" and (
                    repl.get("master_link_status") != "up"
                    or repl.get("master_sync_in_progress") != "0"
                ):
                    return False
            return True

        def diag() -> str:
            return "\n".join(f"--- {n!r}\n{n.log_tail(10)}" for n in running)

        _deadline_poll("cluster_state:ok on every node", ok, timeout, diag)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def close(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RedisCluster {[n.port for n in self.nodes]}>"


__all__: Sequence[str] = [
    "ExternalRedis",
    "RedisCluster",
    "RedisServer",
    "free_port",
]
