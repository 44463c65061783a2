"""The `gateway` command line: `serve`, `demo`, `token`.

`gateway serve` is the one place where settings are built from the environment:
the flags the user actually gave are passed to `Settings(...)`, and pydantic-settings
fills every other field from `GATEWAY_*` environment variables, then the defaults.
A flag beats its environment variable.

    flag                             env var                      default
    --host                           GATEWAY_HOST                 127.0.0.1
    --port                           GATEWAY_PORT                 8000
    --redis-url                      GATEWAY_REDIS_URL            (none: in-process memory bridge)
    --max-events-per-run             GATEWAY_MAX_EVENTS_PER_RUN   10000
    --stream-ttl                     GATEWAY_STREAM_TTL           86400 (seconds)
    --heartbeat-interval             GATEWAY_HEARTBEAT_INTERVAL   15 (seconds)
    --api-key (repeatable)           GATEWAY_API_KEY              (none; comma separated in env)
    --jwt-secret                     GATEWAY_JWT_SECRET           (none)
    --legacy-end-scan/--no-...       GATEWAY_LEGACY_END_SCAN      true
    --log-format text|json           GATEWAY_LOG_FORMAT           text
    --allow-open-nonloopback         GATEWAY_ALLOW_OPEN_NONLOOPBACK  false
    --cors-origin (repeatable)       GATEWAY_CORS_ORIGINS         (none; comma separated in env)
    --cors-producer-routes           GATEWAY_CORS_PRODUCER_ROUTES false
    --demo                           (flag only)                  off

Startup refuses (a one-line message on stderr, exit code 2, before any port is bound):
invalid settings; a JWT secret shorter than 32 bytes; and open mode (no API key, no JWT
secret) on a non-loopback host unless `--allow-open-nonloopback` forces it.

SIGTERM or SIGINT: uvicorn stops accepting, SSE responses end cleanly (clients reconnect
elsewhere with Last-Event-ID), connections still open after `SHUTDOWN_GRACE_SECONDS`
are cancelled, the demo producer ENDs its run, the bridge closes, and the process
exits 0.
"""

from __future__ import annotations

import contextlib
import ipaddress
import signal
import socket
import sys
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any, Final, NoReturn

import click
from click.core import ParameterSource
from pydantic import ValidationError

from .settings import Settings

if TYPE_CHECKING:
    import anyio
    import uvicorn

    from .bridge.base import StreamBridge

EXIT_CONFIG: Final = 2
EXIT_STARTUP_FAILURE: Final = 3
SHUTDOWN_GRACE_SECONDS: Final = 5
MIN_JWT_SECRET_BYTES: Final = 32

# CLI parameter name -> Settings field name.
_SETTINGS_FIELDS: Final = {
    "host": "host",
    "port": "port",
    "redis_url": "redis_url",
    "max_events_per_run": "max_events_per_run",
    "stream_ttl": "stream_ttl_seconds",
    "heartbeat_interval": "heartbeat_interval_seconds",
    "api_key": "api_keys",
    "jwt_secret": "jwt_secret",
    "legacy_end_scan": "legacy_end_scan_enabled",
    "log_format": "log_format",
    "allow_open_nonloopback": "allow_open_nonloopback",
    "cors_origin": "cors_origins",
    "cors_producer_routes": "cors_producer_routes",
}


class ConfigError(Exception):
    """A startup configuration problem: reported in one line, exit code 2."""


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _fail(message: str, code: int = EXIT_CONFIG) -> NoReturn:
    click.echo(f"gateway: error: {_one_line(message)}", err=True)
    sys.exit(code)


def format_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(p) for p in err.get("loc", ())) or "settings"
        parts.append(f"{where}: {err.get('msg', 'invalid')} (got {err.get('input')!r})")
    return "invalid settings: " + "; ".join(parts)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 (also bracketed, or IPv4-mapped) and `localhost`."""
    name = host.strip().strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def build_settings(given: dict[str, Any]) -> Settings:
    """Settings from the explicitly given flags plus the environment; ConfigError if bad."""
    try:
        settings = Settings(**given)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None
    except ValueError as exc:  # e.g. a malformed complex env value
        raise ConfigError(f"invalid settings: {exc}") from None
    check_startup_policy(settings)
    return settings


def check_startup_policy(settings: Settings) -> None:
    if any(not key.strip() for key in settings.api_keys):
        raise ConfigError("an API key must not be empty")
    if settings.jwt_secret and len(settings.jwt_secret.encode()) < MIN_JWT_SECRET_BYTES:
        raise ConfigError(
            f"jwt_secret must be at least {MIN_JWT_SECRET_BYTES} bytes (HMAC key strength)"
        )
    open_mode = not settings.api_keys and not settings.jwt_secret
    if open_mode and not is_loopback(settings.host) and not settings.allow_open_nonloopback:
        raise ConfigError(
            f"refusing to serve without authentication on non-loopback host {settings.host!r}: "
            "set --api-key / --jwt-secret (GATEWAY_API_KEY / GATEWAY_JWT_SECRET), bind to "
            "127.0.0.1, or force it with --allow-open-nonloopback"
        )


# -- serve --------------------------------------------------------------------------------


def _display_base_url(server: uvicorn.Server, settings: Settings) -> str:
    host = settings.host.strip("[]")
    port = settings.port
    for srv in getattr(server, "servers", []):
        for sock in getattr(srv, "sockets", None) or []:
            port = int(sock.getsockname()[1])
            break
        break
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


async def _demo_when_started(
    server: uvicorn.Server, started: anyio.Event, bridge: StreamBridge, settings: Settings
) -> None:
    from .demo import run_demo

    await started.wait()  # only once the port accepts connections
    await run_demo(
        bridge,
        base_url=_display_base_url(server, settings),
        auth_hint="api_key" if settings.api_keys else "token" if settings.jwt_secret else "none",
    )


class _StopSignals:
    """SIGTERM/SIGINT outside uvicorn's own handlers (before it serves, after it stopped).

    Before serving, a signal marks the server to exit as soon as it has started; after
    a graceful shutdown uvicorn re-raises the signal it caught, which lands here and is
    absorbed, so the process exits 0 instead of dying by the signal.
    """

    def __init__(self) -> None:
        self.received = False
        self.server: uvicorn.Server | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.received = True
        if self.server is not None:
            self.server.should_exit = True

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self)
        signal.signal(signal.SIGINT, self)


async def _serve(settings: Settings, demo: bool, stop: _StopSignals) -> int:
    """Run the server until it is told to stop; returns the process exit code."""
    import anyio
    import uvicorn

    from .bridge.provider import open_bridge
    from .http.app import create_app
    from .http.server import GatewayServer

    async with open_bridge(settings) as bridge:
        app = create_app(settings, bridge=bridge)
        config = uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            log_config=None,  # keep the logging configured by gateway.logging
            access_log=False,  # gateway.http.observe logs one structured line per request
            lifespan="on",
            timeout_graceful_shutdown=SHUTDOWN_GRACE_SECONDS,
        )
        started = anyio.Event()

        class Server(GatewayServer):  # drains SSE responses when shutdown starts
            async def startup(self, sockets: list[socket.socket] | None = None) -> None:
                await super().startup(sockets)
                if self.started:
                    started.set()

        server = Server(config, app)
        stop.server = server
        server.should_exit = stop.received
        exit_code = 0
        async with anyio.create_task_group() as tg:
            if demo:
                tg.start_soon(_demo_when_started, server, started, bridge, settings)
            try:
                await server.serve()
            except SystemExit as exc:  # uvicorn's startup failure (e.g. port in use)
                exit_code = exc.code if isinstance(exc.code, int) else EXIT_STARTUP_FAILURE
            finally:
                tg.cancel_scope.cancel()
        if exit_code == 0 and not server.started:
            exit_code = EXIT_STARTUP_FAILURE
        return exit_code


def run_server(settings: Settings, demo: bool) -> int:
    import anyio

    from .logging import configure_logging

    configure_logging(settings.log_format)
    stop = _StopSignals()
    stop.install()  # uvicorn installs its own while serving and restores these afterwards
    try:
        import uvloop  # noqa: F401

        use_uvloop = True
    except ImportError:
        use_uvloop = False
    return anyio.run(
        _serve, settings, demo, stop, backend="asyncio", backend_options={"use_uvloop": use_uvloop}
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """gateway: a resumable SSE streaming gateway for AI-agent runs."""


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Bind address.")
@click.option("--port", type=int, default=8000, show_default=True, help="Bind port.")
@click.option("--redis-url", default=None, help="Redis URL; absent: in-process memory bridge.")
@click.option("--max-events-per-run", type=int, default=None, help="Retained events per run.")
@click.option("--stream-ttl", type=float, default=None, help="Rolling TTL of a run (seconds).")
@click.option(
    "--heartbeat-interval", type=float, default=None, help="Idle seconds between heartbeats."
)
@click.option("--api-key", multiple=True, help="API key (repeatable).")
@click.option("--jwt-secret", default=None, help="HMAC secret of subscriber tokens.")
@click.option(
    "--legacy-end-scan/--no-legacy-end-scan",
    default=None,
    help="Scan for an older END before writing one (default on).",
)
@click.option("--log-format", type=click.Choice(["text", "json"]), default=None)
@click.option(
    "--allow-open-nonloopback",
    is_flag=True,
    default=False,
    help="Serve without authentication on a non-loopback address (unsafe).",
)
@click.option(
    "--cors-origin",
    multiple=True,
    help="Origin whose pages may read streams and sessions (repeatable; * for any).",
)
@click.option(
    "--cors-producer-routes",
    is_flag=True,
    default=False,
    help="Also allow those origins on producer and operator routes.",
)
@click.option("--demo", is_flag=True, default=False, help="Also run the demo producer.")
@click.pass_context
def serve(ctx: click.Context, /, demo: bool, **params: Any) -> None:
    """Run the gateway. Every flag may also be given as GATEWAY_<NAME>."""
    given: dict[str, Any] = {}
    for name, field in _SETTINGS_FIELDS.items():
        if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE:
            value = params[name]
            given[field] = tuple(value) if name in ("api_key", "cors_origin") else value
    try:
        settings = build_settings(given)
    except ConfigError as exc:
        _fail(str(exc))
    sys.exit(run_server(settings, demo))


@cli.command(name="demo")
@click.option("--url", default="http://127.0.0.1:8000", show_default=True)
@click.option(
    "--api-key",
    envvar="GATEWAY_API_KEY",
    default=None,
    help="Producer API key (env GATEWAY_API_KEY; the first of a comma-separated list).",
)
@click.option("--runs", type=click.IntRange(min=1), default=None, help="Stop after N runs.")
@click.option("--token-delay", type=click.FloatRange(min=0), default=0.05, show_default=True)
@click.option("--pause", type=click.FloatRange(min=0), default=3.0, show_default=True)
def demo_command(
    url: str, api_key: str | None, runs: int | None, token_delay: float, pause: float
) -> None:
    """Stream synthetic answers into a running gateway over HTTP."""
    import anyio

    from .demo import run_demo_http
    from .logging import configure_logging

    key = next((k.strip() for k in (api_key or "").split(",") if k.strip()), None)
    configure_logging("text")
    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(
            lambda: run_demo_http(url, key, token_delay=token_delay, pause=pause, max_runs=runs)
        )


@cli.command()
@click.option("--jwt-secret", envvar="GATEWAY_JWT_SECRET", required=True)
@click.option("--run", "runs", multiple=True, help="Run id the token may read (repeatable).")
@click.option("--session", "sessions", multiple=True, help="Session id (repeatable).")
@click.option("--ttl", type=click.FloatRange(min=1), default=3600.0, show_default=True)
@click.option("--subject", default=None, help="Optional `sub` claim (for logs).")
def token(
    jwt_secret: str,
    runs: tuple[str, ...],
    sessions: tuple[str, ...],
    ttl: float,
    subject: str | None,
) -> None:
    """Print a subscriber token (JWT) scoped to runs and/or sessions."""
    from .errors import InvalidInput
    from .http.auth import mint_subscriber_token
    from .names import check_run_id, check_session_id

    if not runs and not sessions:
        _fail("give at least one --run or --session")
    try:
        for run_id in runs:
            check_run_id(run_id)
        for session_id in sessions:
            check_session_id(session_id)
    except InvalidInput as exc:
        _fail(str(exc))
    click.echo(
        mint_subscriber_token(
            jwt_secret, runs=runs, sessions=sessions, ttl_seconds=ttl, subject=subject
        )
    )


@cli.group(name="legacy-end-scan")
def legacy_end_scan() -> None:
    """Tools for retiring the legacy END scan (see docs/operations.md)."""


@legacy_end_scan.command(name="audit")
@click.option("--redis-url", envvar="GATEWAY_REDIS_URL", required=True, help="Redis URL.")
@click.option("--prefix", envvar="GATEWAY_REDIS_KEY_PREFIX", default="gw:", show_default=True)
@click.option("--count", type=click.IntRange(min=1), default=500, show_default=True)
@click.option("--json", "as_json", is_flag=True, default=False, help="One JSON object.")
def legacy_end_scan_audit(redis_url: str, prefix: str, count: int, as_json: bool) -> None:
    """Read-only: may the legacy END scan be turned off? Exit 0 now, 1 later, 2 never."""
    from redis.exceptions import RedisError

    from .audit import EXIT_REDIS_ERROR, connect, render, run_audit
    from .errors import InvalidInput

    try:
        report = run_audit(connect(redis_url), prefix, count)
    except InvalidInput as exc:
        _fail(str(exc))
    except (RedisError, OSError, ValueError) as exc:
        _fail(f"Redis: {exc}", EXIT_REDIS_ERROR)
    click.echo(render(report, as_json))
    sys.exit(report.exit_code)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: click errors become one stderr line and exit code 2."""
    try:
        code = cli.main(
            args=list(argv) if argv is not None else None,
            prog_name="gateway",
            standalone_mode=False,
        )
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc), err=True)
        sys.exit(EXIT_CONFIG)
    except click.ClickException as exc:
        _fail(exc.format_message(), exc.exit_code if exc.exit_code else EXIT_CONFIG)
    except click.Abort:
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
