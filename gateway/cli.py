"""The `gateway` command line: `serve`, `demo`, `token`.

`gateway serve` is the one place where settings are built from the environment:
the flags the user actually gave are passed to `Settings(...)`, and pydantic-settings
fills every other field from its `GATEWAY_*` environment variable, then the default.
A flag beats its environment variable. The flags are generated from `Settings`, one
per field (`--<name>`, help from the field's description): `gateway serve --help`
lists them all, and a new field is a new flag with no change here.

Startup refuses (a one-line message on stderr, exit code 2, before any port is bound)
invalid settings, which include an empty API key, a JWT secret shorter than 32 bytes,
an example key or secret shipped in the repository, a `GATEWAY_*` variable that looks
like a typo of a setting, open mode (no API key, no JWT secret) on a non-loopback host
unless `--allow-open-nonloopback` forces it, and open mode with `--cors-origins '*'`
unless `--allow-open-any-origin` forces it (see `gateway.settings`). Other unknown
`GATEWAY_*` variables (Kubernetes service links, a wrapper script's own) are ignored
with one warning line in the log, once, by the process that reads the environment.

SIGTERM or SIGINT: uvicorn stops accepting, SSE responses end cleanly (clients reconnect
elsewhere with Last-Event-ID), connections still open after `SHUTDOWN_GRACE_SECONDS`
are cancelled, the demo producer ENDs its run, the bridge closes, and the process
exits 0.

`--workers N` (N > 1; the Redis bridge only, since memory-bridge workers would share
no runs: that rule is part of `Settings`; `--demo` runs in one process only): the
process started is a parent that serves nothing and opens no bridge. It builds and
validates the settings as above, binds the one listening socket (failure: one line,
exit 3), and hands both to N worker processes (`gateway.supervisor`, multiprocessing's
"spawn" start method): each worker receives the parent's frozen `Settings` object
pickled, never re-reading the environment or the flags, and runs exactly what a
single `gateway serve` runs (`run_server`), on the inherited socket instead of binding
its own: its own event loop, bridge, Redis pool of `redis_max_connections`, metrics
and readiness. The kernel gives each new connection to one of the workers accepting
on the socket. uvicorn's own supervisor (`uvicorn.supervisors.Multiprocess`, behind
`uvicorn.run(workers=N)`) is not used: it needs the app as an import string, so each
worker would build the app from module state or the environment instead of from
these settings; it runs a plain `uvicorn.Server`, without `GatewayServer`'s SSE drain;
and its worker class is not documented API. What it runs underneath,
`uvicorn.Server.serve(sockets=...)`, is what each worker runs.

SIGTERM or SIGINT to the parent sends SIGTERM to every worker, each stops as described
above, and the parent exits 0 once they all exited 0 (a worker still running after
`WORKER_STOP_SECONDS` is killed). A worker that ends on its own makes the parent stop
the others and exit non-zero, for the service manager to restart the set; a parent
killed outright takes its workers with it.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import sys
import warnings
from collections.abc import Mapping, Sequence
from types import FrameType, UnionType
from typing import TYPE_CHECKING, Any, Final, Literal, NoReturn, Union, get_args, get_origin

import click
from click.core import ParameterSource
from pydantic import ValidationError
from pydantic.fields import FieldInfo

from .settings import ENV_PREFIX, Settings, UnknownSettingsWarning

if TYPE_CHECKING:
    import anyio
    import uvicorn


EXIT_CONFIG: Final = 2
EXIT_STARTUP_FAILURE: Final = 3
SHUTDOWN_GRACE_SECONDS: Final = 5
# A worker still running this long after its SIGTERM is killed: its graceful shutdown
# (drain, the grace for open connections, closing the bridge) takes about the grace.
WORKER_STOP_SECONDS: Final = SHUTDOWN_GRACE_SECONDS + 10
LISTEN_BACKLOG: Final = 2048  # uvicorn's default backlog
DEMO_PAUSE_SECONDS: Final = 3.0  # between `serve --demo` runs (run_demo's default)


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
        loc = err.get("loc", ())
        message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        field = Settings.model_fields.get(str(loc[0])) if loc else None
        if field is None:  # a rule over several settings: the message says it all
            parts.append(message)
        elif not field.repr:  # a secret: never echo what was given
            parts.append(f"{loc[0]}: {message}")
        else:
            where = ".".join(str(p) for p in loc)
            parts.append(f"{where}: {message} (got {err.get('input')!r})")
    return "invalid settings: " + "; ".join(parts)


def build_settings(given: Mapping[str, Any], notes: list[str] | None = None) -> Settings:
    """Settings from the explicitly given flags plus the environment; ConfigError if bad.

    `notes` (when given) collects the warnings about ignored environment variables, for
    the caller to log once logging is configured; otherwise they are Python warnings."""
    try:
        if notes is None:
            return Settings(**given)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", UnknownSettingsWarning)
            settings = Settings(**given)
        for warning in caught:
            if issubclass(warning.category, UnknownSettingsWarning):
                notes.append(str(warning.message))
            else:  # not ours: passed on as it came
                warnings.warn_explicit(
                    warning.message, warning.category, warning.filename, warning.lineno
                )
        return settings
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None
    except ValueError as exc:  # e.g. a malformed complex env value
        raise ConfigError(f"invalid settings: {exc}") from None


# -- flags generated from Settings ---------------------------------------------------------


def _flag_type(name: str, annotation: Any) -> tuple[Any, bool]:
    """The click type of a field's flag, and whether the flag repeats."""
    args = tuple(a for a in get_args(annotation) if a is not type(None))
    if get_origin(annotation) in (Union, UnionType) and len(args) == 1:
        return _flag_type(name, args[0])  # `X | None`: the flag takes an X
    if get_origin(annotation) is Literal:
        return click.Choice([str(a) for a in args]), False
    if get_origin(annotation) is tuple and args[:1] == (str,):
        return click.STRING, True
    if annotation in (str, int, float):
        return annotation, False
    raise TypeError(f"Settings.{name}: no flag for type {annotation!r} (extend _flag_type)")


def _shown(default: Any) -> str:
    if isinstance(default, bool):
        return "on" if default else "off"
    if isinstance(default, tuple):
        return ",".join(default) or "none"
    return "none" if default is None else str(default)


def _setting_option(name: str, field: FieldInfo) -> click.Option:
    if not field.description:
        raise TypeError(f"Settings.{name} needs a description (it is the flag's help)")
    flag = "--" + name.replace("_", "-")
    note = f"env {ENV_PREFIX}{name.upper()}; default: {_shown(field.get_default())}"
    if field.annotation is bool:
        decls = [f"{flag}/--no-{flag[2:]}", name]
        return click.Option(decls, default=None, help=f"{field.description} [{note}]")
    click_type, repeats = _flag_type(name, field.annotation)
    if repeats:
        note = "repeatable; comma-separated in the " + note
    return click.Option(
        [flag, name],
        type=click_type,
        multiple=repeats,
        default=None,
        help=f"{field.description} [{note}]",
    )


def setting_options() -> list[click.Option]:
    """One `gateway serve` option per settings field, in the fields' order."""
    return [_setting_option(name, field) for name, field in Settings.model_fields.items()]


def given_settings(ctx: click.Context) -> dict[str, Any]:
    """The settings the command line gave explicitly (the environment fills the rest)."""
    return {
        name: ctx.params[name]
        for name in Settings.model_fields
        if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE
    }


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
    server: uvicorn.Server,
    started: anyio.Event,
    settings: Settings,
    api_key: str | None,
    pause: float = DEMO_PAUSE_SECONDS,
) -> None:
    from .client.demo import AuthHint, DemoRequests, run_demo
    from .http.edge.observe import request_log

    await started.wait()  # only once the port accepts connections
    url = _display_base_url(server, settings)
    # The demo's own successful requests log at DEBUG: one INFO line per turn remains.
    auth: AuthHint = "api_key" if settings.api_keys else "token" if settings.jwt_secret else "none"
    requests = DemoRequests()
    request_log.addFilter(requests.filter)
    try:
        async with requests.client() as client:
            await run_demo(
                url,
                api_key,
                auth_hint=auth,
                pause=pause,
                client=client,
            )
    finally:
        request_log.removeFilter(requests.filter)


class _Demo:
    """The demo producer's task. It is stopped first at shutdown, while the server still
    accepts requests: it is a producer over HTTP, and it ENDs its run on the way out."""

    def __init__(self, pause: float = DEMO_PAUSE_SECONDS) -> None:
        import anyio

        self.scope = anyio.CancelScope()
        self.done = anyio.Event()
        self.pause = pause

    async def run(
        self, server: uvicorn.Server, started: anyio.Event, settings: Settings, key: str | None
    ) -> None:
        try:
            with self.scope:
                await _demo_when_started(server, started, settings, key, self.pause)
        finally:
            self.done.set()

    async def stop(self) -> None:
        import anyio

        self.scope.cancel()
        with anyio.move_on_after(SHUTDOWN_GRACE_SECONDS):
            await self.done.wait()


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


async def _serve(
    settings: Settings,
    demo: bool,
    stop: _StopSignals,
    sockets: list[socket.socket] | None,
    demo_pause: float = DEMO_PAUSE_SECONDS,
) -> int:
    """Run the server until it is told to stop; returns the process exit code. `sockets`:
    listen on these (a worker of `run_workers`) instead of binding `settings.host`/`port`."""
    import anyio

    from . import gc_policy
    from .bridge.provider import open_bridge
    from .http.app import create_app
    from .http.serve.server import GatewayServer, server_config

    demo_key: str | None = None
    shown = settings  # what the demo's log lines describe: the gateway as configured
    if demo:
        from .client.demo import with_demo_key

        settings, demo_key = with_demo_key(settings)  # the demo is a producer like any other
    async with open_bridge(settings) as bridge:
        app = create_app(settings, bridge=bridge)
        config = server_config(
            app,
            settings,
            log_config=None,  # keep the logging configured by gateway.logging
            access_log=False,  # gateway.http.edge.observe logs one structured line per request
            lifespan="on",
            timeout_graceful_shutdown=SHUTDOWN_GRACE_SECONDS,
        )
        started = anyio.Event()
        demo_task = _Demo(demo_pause) if demo else None

        class Server(GatewayServer):  # drains SSE responses when shutdown starts
            async def startup(self, sockets: list[socket.socket] | None = None) -> None:
                await super().startup(sockets)
                if self.started:
                    # Before the loop handles a request: what start-up made is frozen.
                    gc_policy.apply(settings)
                    started.set()

            async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
                if demo_task is not None:
                    await demo_task.stop()
                await super().shutdown(sockets)

        server = Server(config, app)
        stop.server = server
        server.should_exit = stop.received
        exit_code = 0
        async with anyio.create_task_group() as tg:
            if demo_task is not None:
                tg.start_soon(demo_task.run, server, started, shown, demo_key)
            try:
                await server.serve(sockets=sockets)
            except SystemExit as exc:  # uvicorn's startup failure (e.g. port in use)
                exit_code = exc.code if isinstance(exc.code, int) else EXIT_STARTUP_FAILURE
            finally:
                tg.cancel_scope.cancel()
        if exit_code == 0 and not server.started:
            exit_code = EXIT_STARTUP_FAILURE
        return exit_code


def _log_notes(notes: Sequence[str]) -> None:
    for note in notes:
        logging.getLogger("gateway.settings").warning(note, extra={"event": "settings_ignored"})


def run_server(
    settings: Settings,
    demo: bool,
    sockets: list[socket.socket] | None = None,
    notes: Sequence[str] = (),
    demo_pause: float = DEMO_PAUSE_SECONDS,
) -> int:
    import anyio

    from .logging import configure_logging

    configure_logging(settings.log_format)
    _log_notes(notes)
    stop = _StopSignals()
    stop.install()  # uvicorn installs its own while serving and restores these afterwards
    try:
        import uvloop  # noqa: F401

        use_uvloop = True
    except ImportError:
        use_uvloop = False
    return anyio.run(
        _serve,
        settings,
        demo,
        stop,
        sockets,
        demo_pause,
        backend="asyncio",
        backend_options={"use_uvloop": use_uvloop},
    )


def run_workers(settings: Settings, notes: Sequence[str] = ()) -> int:
    """`settings.workers` processes serving one socket, bound here (see the module doc)."""
    from .logging import configure_logging
    from .supervisor import bind_listener, supervise

    configure_logging(settings.log_format)
    _log_notes(notes)  # here only: the workers get the settings, not the environment
    try:
        sock = bind_listener(settings.host, settings.port, LISTEN_BACKLOG)
    except OSError as exc:
        _fail(f"cannot listen on {settings.host}:{settings.port}: {exc}", EXIT_STARTUP_FAILURE)
    host, port = sock.getsockname()[:2]
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    logging.getLogger("gateway.supervisor").info(
        "gateway listening on %s with %d workers",
        url,
        settings.workers,
        extra={"event": "listening", "workers": settings.workers},
    )
    return supervise(
        _serve_worker, (settings,), sock, settings.workers, stop_timeout=WORKER_STOP_SECONDS
    )


def _serve_worker(settings: Settings, sock: socket.socket) -> None:
    """One worker of `run_workers`, in its own process: the gateway on the given socket.
    `settings` is the parent's validated object, unpickled (no environment is read)."""
    sys.exit(run_server(settings, demo=False, sockets=[sock]))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """gateway: a resumable SSE streaming gateway for AI-agent runs."""


@cli.command()
@click.option("--demo", is_flag=True, default=False, help="Also run the demo producer.")
# Seconds between demo runs; hidden: for tests that watch several runs.
@click.option("--demo-pause", type=click.FloatRange(min=0), default=DEMO_PAUSE_SECONDS, hidden=True)
@click.pass_context
def serve(ctx: click.Context, /, demo: bool, demo_pause: float, **_settings: Any) -> None:
    """Run the gateway. Every setting is a flag here and an env var GATEWAY_<NAME>."""
    notes: list[str] = []
    try:
        settings = build_settings(given_settings(ctx), notes)
        if demo and settings.workers > 1:
            raise ConfigError(
                "--demo runs in a single process: drop --workers, or point `gateway demo "
                "--url` at the workers"
            )
    except ConfigError as exc:
        _fail(str(exc))
    if settings.workers > 1:
        sys.exit(run_workers(settings, notes))
    sys.exit(run_server(settings, demo, notes=notes, demo_pause=demo_pause))


serve.params[:0] = setting_options()


@cli.command(name="demo")
@click.option("--url", default="http://127.0.0.1:8000", show_default=True)
@click.option(
    "--api-key",
    envvar="GATEWAY_API_KEYS",
    default=None,
    help="Producer API key (env GATEWAY_API_KEYS: the first of its comma-separated list).",
)
@click.option("--runs", type=click.IntRange(min=1), default=None, help="Stop after N runs.")
@click.option("--token-delay", type=click.FloatRange(min=0), default=0.05, show_default=True)
@click.option("--pause", type=click.FloatRange(min=0), default=3.0, show_default=True)
def demo_command(
    url: str, api_key: str | None, runs: int | None, token_delay: float, pause: float
) -> None:
    """Stream synthetic answers into a running gateway over HTTP."""
    import anyio

    from .client.demo import run_demo
    from .logging import configure_logging

    key = next((k.strip() for k in (api_key or "").split(",") if k.strip()), None)
    configure_logging("text")
    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(lambda: run_demo(url, key, token_delay=token_delay, pause=pause, max_runs=runs))


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
    from .http.edge.auth import mint_subscriber_token
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
