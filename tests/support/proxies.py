"""Real load balancers and real gateway processes for tests (no fakes).

``Proxy`` runs haproxy or nginx as a process, configured from the files shipped in
``deploy/`` (``deploy/haproxy.cfg`` with its environment variables, or
``deploy/nginx.conf.template`` rendered the way envsubst would), on a free 127.0.0.1
port, with its own config, pid and log files in a temp dir. ``GatewayProcess`` runs
``gateway serve`` as a subprocess on a free port. Both wait for readiness by polling
with a deadline, both are context managers, and every process started here is killed
at interpreter exit (and with the starting thread, via PR_SET_PDEATHSIG) if a test
forgets to.

    with GatewayProcess(redis_url=url, api_key="k", heartbeat=0.3) as gw1, \\
         GatewayProcess(redis_url=url, api_key="k", heartbeat=0.3) as gw2, \\
         Proxy("haproxy", backends=[gw1.url, gw2.url]) as proxy:
        httpx.get(proxy.url + "/readyz")          # through haproxy to one of them
        gw1.terminate()                           # SIGTERM: drain, exit 0 (returns code)
        gw2.kill()                                # SIGKILL

Backends may be given as ``host:port`` or as base URLs (``http://host:port``).
``Proxy(...).check()`` only validates the config (``haproxy -c`` / ``nginx -t``).
``Proxy(kind, backends, config=path)`` uses another haproxy.cfg / nginx template.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal, Self
from urllib.parse import urlparse

import httpx

from tests.support.redis_servers import _deadline_poll, _pdeathsig, free_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
HAPROXY_CFG = DEPLOY / "haproxy.cfg"
NGINX_TEMPLATE = DEPLOY / "nginx.conf.template"
HAPROXY_BIN = os.environ.get("HAPROXY_BIN") or shutil.which("haproxy") or "/usr/sbin/haproxy"
NGINX_BIN = os.environ.get("NGINX_BIN") or shutil.which("nginx") or "/usr/sbin/nginx"
HAPROXY_MAX_BACKENDS = 8  # GATEWAY_BACKEND_1..8 slots in deploy/haproxy.cfg
NGINX_VARIABLES = (
    "NGINX_LISTEN",
    "NGINX_TLS_LISTEN",
    "NGINX_TLS_CERT",
    "NGINX_TLS_KEY",
    "GATEWAY_UPSTREAMS",
)
OPENSSL_BIN = shutil.which("openssl") or "/usr/bin/openssl"
HOST = "127.0.0.1"
START_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0

ProxyKind = Literal["haproxy", "nginx"]

_live: weakref.WeakSet[_Process] = weakref.WeakSet()


@atexit.register
def _kill_leftovers() -> None:
    for item in list(_live):
        with contextlib.suppress(Exception):
            item.kill()


def wait_until(
    what: str, check: Callable[[], bool], timeout: float, details: Callable[[], str]
) -> None:
    """Call ``check`` until it returns True; TimeoutError (with ``details()``) at the deadline."""
    _deadline_poll(what, check, timeout, details, transient=(OSError, httpx.TransportError))


def host_port(backend: str) -> str:
    """``http://h:p/`` or ``h:p`` -> ``h:p``."""
    if "://" in backend:
        parsed = urlparse(backend)
        if not parsed.hostname or not parsed.port:
            raise ValueError(f"backend URL needs a host and a port: {backend!r}")
        host = f"[{parsed.hostname}]" if ":" in parsed.hostname else parsed.hostname
        return f"{host}:{parsed.port}"
    if not re.fullmatch(r"[^\s;\"']+:\d+", backend):
        raise ValueError(f"backend must be host:port or a base URL: {backend!r}")
    return backend


def render_template(text: str, values: Mapping[str, str]) -> str:
    """envsubst with an explicit variable list: ``$NAME``/``${NAME}`` for NAME in ``values``.

    Every other ``$...`` (nginx's own variables) is left alone, like
    ``envsubst '${NGINX_LISTEN} ${GATEWAY_UPSTREAMS}'``.
    """
    names = "|".join(re.escape(name) for name in values)
    pattern = re.compile(rf"\$(?:\{{({names})\}}|({names})\b)")
    return pattern.sub(lambda m: values[m.group(1) or m.group(2)], text)


@dataclass(frozen=True)
class Certificate:
    """A self-signed certificate for 127.0.0.1/localhost: PEM files in one directory."""

    cert: Path  # the certificate
    key: Path  # its private key
    bundle: Path  # both in one file (what HAProxy's `crt` reads)


def self_signed_certificate(directory: Path) -> Certificate:
    """Make one with the openssl CLI (an EC P-256 key, valid for two days)."""
    cert, key, bundle = directory / "tls.crt", directory / "tls.key", directory / "tls.pem"
    subprocess.run(
        [
            OPENSSL_BIN, "req", "-x509", "-newkey", "ec",
            "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(key), "-out", str(cert), "-days", "2",
            "-subj", "/CN=localhost",
            "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )  # fmt: skip
    bundle.write_bytes(cert.read_bytes() + key.read_bytes())
    return Certificate(cert, key, bundle)


def haproxy_env(
    backends: Sequence[str],
    listen: str,
    tls_listen: str | None = None,
    certificate: Certificate | None = None,
) -> dict[str, str]:
    """The environment ``deploy/haproxy.cfg`` reads."""
    if not 1 <= len(backends) <= HAPROXY_MAX_BACKENDS:
        raise ValueError(f"deploy/haproxy.cfg has 1..{HAPROXY_MAX_BACKENDS} backend slots")
    env = {"HAPROXY_BIND": listen}
    if tls_listen is not None and certificate is not None:
        env["HAPROXY_TLS_BIND"] = tls_listen
        env["HAPROXY_TLS_CERT"] = str(certificate.bundle)
    for index, backend in enumerate(backends, start=1):
        env[f"GATEWAY_BACKEND_{index}"] = host_port(backend)
    return env


def nginx_values(
    backends: Sequence[str], listen: str, tls_listen: str, certificate: Certificate
) -> dict[str, str]:
    """The values ``deploy/nginx.conf.template`` is rendered with."""
    if not backends:
        raise ValueError("nginx needs at least one backend")
    servers = " ".join(f"server {host_port(b)} max_fails=2 fail_timeout=5s;" for b in backends)
    return {
        "NGINX_LISTEN": listen,
        "NGINX_TLS_LISTEN": tls_listen,
        "NGINX_TLS_CERT": str(certificate.cert),
        "NGINX_TLS_KEY": str(certificate.key),
        "GATEWAY_UPSTREAMS": servers,
    }


class _Process:
    """A child process with a log file in ``self.dir``; subclasses build argv/env."""

    name = "process"

    def __init__(self, directory: Path | None, port: int | None = None) -> None:
        self._own_dir = directory is None
        self.dir = Path(directory) if directory else Path(tempfile.mkdtemp(prefix=f"{self.name}-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self._fixed_port = port is not None  # else a free port is picked at each start
        self.port = port or 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.dir / f"{self.name}.log"

    def log(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return f"(no {self.name} log)"
        return "\n".join(text.splitlines()[-lines:])

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _spawn(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        main = threading.current_thread() is threading.main_thread()
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                env=env,
                preexec_fn=_pdeathsig if main else None,
            )
        _live.add(self)
        return self.proc

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise _Exited(f"{self.name} exited with {self.proc.returncode}:\n{self.log()}")

    def signal(self, signum: int, timeout: float = STOP_TIMEOUT) -> int | None:
        """Send ``signum`` and wait (SIGKILL after ``timeout``); the exit code."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signum)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.proc = None
        _live.discard(self)
        return proc.returncode

    def kill(self) -> int | None:
        return self.signal(signal.SIGKILL)

    def close(self) -> None:
        self.signal(signal.SIGTERM)
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class _Exited(RuntimeError):
    pass


class Proxy(_Process):
    """haproxy or nginx from the shipped deploy file, in front of ``backends``.

    ``proxy.url`` is ``http://127.0.0.1:<port>``. ``start()`` (or ``with``) returns once
    the proxy accepts TCP connections; it does not wait for the backends.
    """

    def __init__(
        self,
        kind: ProxyKind,
        backends: Sequence[str],
        *,
        port: int | None = None,
        directory: Path | None = None,
        config: Path | None = None,
        tls: bool = False,
    ) -> None:
        if kind not in ("haproxy", "nginx"):
            raise ValueError(f"unknown proxy kind {kind!r}")
        self.name = kind
        super().__init__(directory, port)
        self.kind: ProxyKind = kind
        self.backends = [host_port(b) for b in backends]
        # The TLS listener (HTTP/2 and HTTP/1.1): always on for nginx, whose template
        # requires it; for haproxy only with ``tls=True`` (its TLS bind is optional).
        self.tls = tls or kind == "nginx"
        self.tls_port = 0
        self.certificate: Certificate | None = None
        # The shipped file unless a test passes a variant (e.g. a deliberately bad one).
        self.source = (
            Path(config) if config else HAPROXY_CFG if kind == "haproxy" else NGINX_TEMPLATE
        )

    @property
    def config_path(self) -> Path:
        return self.source if self.kind == "haproxy" else self.dir / "nginx.conf"

    @property
    def tls_url(self) -> str:
        """``https://127.0.0.1:<port>``: the TLS listener (HTTP/2 by ALPN)."""
        return f"https://{HOST}:{self.tls_port}"

    def _prepare(self) -> tuple[list[str], dict[str, str]]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        tls_listen: str | None = None
        if self.tls:
            if self.certificate is None:
                self.certificate = self_signed_certificate(self.dir)
            if not self.tls_port:
                self.tls_port = free_port(exclude=[self.port])
            tls_listen = f"{HOST}:{self.tls_port}"
        if self.kind == "haproxy":
            env.update(haproxy_env(self.backends, self.address, tls_listen, self.certificate))
            argv = [HAPROXY_BIN, "-db", "-f", str(self.source), "-p", str(self.dir / "haproxy.pid")]
            return argv, env
        assert tls_listen is not None and self.certificate is not None
        values = nginx_values(self.backends, self.address, tls_listen, self.certificate)
        text = render_template(self.source.read_text(), values)
        self.config_path.write_text(text)
        error_log = self.dir / "error.log"
        directives = f"daemon off; pid {self.dir / 'nginx.pid'}; error_log {error_log} info;"
        argv = [
            NGINX_BIN,
            "-p", str(self.dir),
            "-c", str(self.config_path),
            "-e", str(error_log),
            "-g", directives,
        ]  # fmt: skip
        return argv, env

    def check(self) -> subprocess.CompletedProcess[str]:
        """Validate the config as it would be started (``haproxy -c`` / ``nginx -t``)."""
        if not self.port:
            self.port = free_port()
        argv, env = self._prepare()
        if self.kind == "haproxy":
            argv = [HAPROXY_BIN, "-c", "-f", str(self.source)]
        else:
            argv = [*argv, "-t"]
        return subprocess.run(
            argv, env=env, cwd=self.dir, capture_output=True, text=True, timeout=30
        )

    def start(self) -> Self:
        if self.running:
            return self
        attempts = 1 if self._fixed_port else 5
        for attempt in range(attempts):
            if not self._fixed_port:
                self.port = free_port()
                self.tls_port = 0  # (picked again beside it)
            argv, env = self._prepare()
            self._spawn(argv, env)
            try:
                wait_until(
                    f"{self.kind} on {self.address}", self._accepts, START_TIMEOUT, self._details
                )
                return self
            except _Exited:
                self.proc = None
                if "in use" not in self._details() or attempt == attempts - 1:
                    raise
            except BaseException:
                self.kill()
                raise
        raise AssertionError("unreachable")

    def _accepts(self) -> bool:
        self._check_alive()
        for port in (self.port, self.tls_port) if self.tls else (self.port,):
            with socket.create_connection((HOST, port), timeout=1):
                pass
        return True

    def _details(self) -> str:
        parts = [self.log()]
        error_log = self.dir / "error.log"
        if error_log.exists():
            parts.append(error_log.read_text(errors="replace")[-4000:])
        return "\n".join(parts)

    def stop(self) -> None:
        # SIGTERM is the fast stop for both (open SSE connections are cut, not drained).
        self.signal(signal.SIGTERM)

    def __enter__(self) -> Self:
        return self.start()

    def __repr__(self) -> str:
        return f"<Proxy {self.kind} {self.url} -> {self.backends}>"


class GatewayProcess(_Process):
    """``gateway serve`` as a subprocess on a free 127.0.0.1 port (``.url``).

    Settings are passed as flags; ``key_prefix`` (env ``GATEWAY_REDIS_KEY_PREFIX``) lets
    tests sharing one Redis stay apart. The parent's ``GATEWAY_*`` variables are not
    inherited. ``start()`` (or ``with``) returns once ``GET /healthz`` answers 200.
    """

    name = "gateway"

    def __init__(
        self,
        redis_url: str | None = None,
        api_key: str | None = None,
        heartbeat: float | None = None,
        *,
        key_prefix: str | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        directory: Path | None = None,
    ) -> None:
        super().__init__(directory, port)
        self.redis_url = redis_url
        self.api_key = api_key
        self.heartbeat = heartbeat
        self.key_prefix = key_prefix
        self.args = list(args)
        self.extra_env = dict(env or {})

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _argv(self) -> list[str]:
        argv = [sys.executable, "-m", "gateway", "serve", "--host", HOST, "--port", str(self.port)]
        if self.redis_url:
            argv += ["--redis-url", self.redis_url]
        if self.api_key:
            argv += ["--api-keys", self.api_key]
        if self.heartbeat is not None:
            argv += ["--heartbeat-interval-seconds", str(self.heartbeat)]
        return argv + self.args

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        if self.key_prefix:
            env["GATEWAY_REDIS_KEY_PREFIX"] = self.key_prefix
        env.update(self.extra_env)
        return env

    def start(self) -> Self:
        if self.running:
            return self
        attempts = 1 if self._fixed_port else 5
        for attempt in range(attempts):
            if not self._fixed_port:
                self.port = free_port()
            self._spawn(self._argv(), self._env())
            try:
                wait_until(f"gateway {self.url}/healthz", self.healthy, START_TIMEOUT, self.log)
                return self
            except _Exited:
                self.proc = None
                if "in use" not in self.log() or attempt == attempts - 1:
                    raise
            except BaseException:
                self.kill()
                raise
        raise AssertionError("unreachable")

    def healthy(self) -> bool:
        self._check_alive()
        return httpx.get(self.url + "/healthz", timeout=1).status_code == 200

    def terminate(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM (graceful: SSE responses end cleanly) and wait; the exit code."""
        return self.signal(signal.SIGTERM, timeout)

    def metric(self, name: str) -> float:
        """Sum of the samples of ``name`` (e.g. ``gateway_events_delivered_total``)."""
        text = httpx.get(self.url + "/metrics", headers=self.headers, timeout=5).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def __enter__(self) -> Self:
        return self.start()

    def __repr__(self) -> str:
        return f"<GatewayProcess {self.url} running={self.running}>"
