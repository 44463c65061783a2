"""The one frozen settings object, built at the edge (`gateway.cli`) and passed down.

Each setting is one field of `Settings` and nothing else. From the field follow:
- its environment variable, `GATEWAY_<NAME>` (for example `GATEWAY_STREAM_TTL_SECONDS`),
  the only name the environment is read under; an unprefixed `STREAM_TTL_SECONDS` or
  `API_KEYS` that another program set is ignored;
- its `gateway serve` flag, `--<name>` with dashes (`--stream-ttl-seconds`; a boolean
  gets `--<name>/--no-<name>`, a list is repeatable), which `gateway.cli` generates
  from this class with the field's `description` as the flag's help.
So adding a field is the whole of adding a setting. Every setting is startup-only.

A `GATEWAY_*` variable that names no setting is ignored with one warning naming them all
(`UnknownSettingsWarning`; `gateway serve` logs it as one line): Kubernetes puts
`GATEWAY_SERVICE_HOST`, `GATEWAY_PORT_80_TCP…` into every container of a namespace with a
Service named `gateway`, and wrapper scripts export their own `GATEWAY_…` names. One that
is a likely typo of a setting (`GATEWAY_API_KEY` for `GATEWAY_API_KEYS`: a close match by
`difflib`) is still refused, since it would leave that setting silently at its default;
Kubernetes' service-link names are never taken for typos. Kubernetes'
`GATEWAY_PORT=tcp://<ip>:<port>` (a service link, never a port number) is ignored the
same way.

Nothing else in the package reads the environment. Settings that would serve without
authentication on a non-loopback address are invalid (unless `allow_open_nonloopback`
forces it), and so are open mode with `cors_origins` `*` (any web page could read and
cancel every run; unless `allow_open_any_origin` forces it), the example secrets the
repository ships (`EXAMPLE_SECRETS`), and several workers on the memory bridge (they
would share no runs), whoever builds them: the command line and library users of
`create_app`. CORS origins are normalised to what a browser sends (scheme and host
lower-cased, a default port dropped).
"""

from __future__ import annotations

import difflib
import os
import re
import warnings
from pathlib import Path
from typing import Annotated, Final, Literal, Self
from urllib.parse import parse_qs, unquote, urlsplit

from pydantic import BeforeValidator, Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from .hosts import is_loopback

ENV_PREFIX = "GATEWAY_"
MIN_JWT_SECRET_BYTES = 32

# Redis URL query options that would set, a second time, what these settings set (the
# client library lets the URL override them): each is refused, naming the setting.
_REDIS_URL_OWNED: Final = {
    "max_connections": "redis_max_connections",
    "timeout": "redis_command_timeout_seconds",
    "socket_timeout": "redis_command_timeout_seconds",
    "socket_connect_timeout": "redis_connect_timeout_seconds",
}
_REDIS_SCHEMES: Final = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")
_REDIS_URL_FILES: Final = frozenset({"ssl_ca_certs", "ssl_certfile", "ssl_keyfile"})
# Redis URL query options the bridge cannot work with: it reads and writes Redis data as
# bytes itself (payloads kept exactly, notifications parsed as bytes).
_REDIS_URL_REFUSED: Final = {
    "decode_responses": "the gateway reads Redis replies as bytes",
    "encoding": "the gateway encodes what it writes to Redis itself",
}
# What a browser sends as `Origin`: scheme://host[:port] (a trailing slash is forgiven).
_ORIGIN_RE: Final = re.compile(
    r"(https?)://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::([0-9]{1,5}))?/?", re.IGNORECASE
)
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
# The placeholder secrets the repository ships (deploy/k8s/secret.example.yaml,
# deploy/compose.yaml's comments): anyone can read them, so they are refused as keys or
# JWT secrets; so is anything still starting with "replace-me".
EXAMPLE_SECRETS: Final = frozenset(
    {
        "replace-me-with-a-long-random-key",
        "replace-me-with-at-least-32-random-bytes-xxxxxxxx",
        "change-me",
    }
)
_PLACEHOLDER_PREFIX: Final = "replace-me"
# Names Kubernetes gives every container of a namespace for a Service named `gateway`
# (or `gateway-<name>`: service links), after the `GATEWAY_` prefix: never a typo.
_SERVICE_LINK_NAME: Final = re.compile(
    r"(\w+_)?(service_host|service_port(_\w+)?|port(_\d+_(tcp|udp|sctp)(_proto|_port|_addr)?)?)"
)
# The value Kubernetes (and Docker's legacy links) give `GATEWAY_PORT`.
_SERVICE_LINK_URL: Final = re.compile(r"(tcp|udp|sctp)://\S*")
# How close an unknown name must be to a setting's to be taken for its typo.
_TYPO_CUTOFF: Final = 0.8


class UnknownSettingsWarning(UserWarning):
    """`GATEWAY_*` environment variables that name no setting (ignored)."""


def _is_example_secret(value: str) -> bool:
    return value.strip() in EXAMPLE_SECRETS or value.strip().startswith(_PLACEHOLDER_PREFIX)


def _likely_typo(name: str) -> str | None:
    """The setting `name` (lower case, prefix removed) is probably a typo of, if any."""
    if _SERVICE_LINK_NAME.fullmatch(name):
        return None
    close = difflib.get_close_matches(name, Settings.model_fields, n=1, cutoff=_TYPO_CUTOFF)
    return close[0] if close else None


def normalise_origin(origin: str) -> str:
    """`origin` as a browser sends it in `Origin`; ValueError if it is not one."""
    if origin == "*":
        return origin
    match = _ORIGIN_RE.fullmatch(origin)
    if match is None:
        raise ValueError(f"{origin!r} is not an origin (scheme://host[:port], no path) or *")
    scheme, host, port = match.group(1).lower(), match.group(2).lower(), match.group(3)
    if port is not None:
        number = int(port)
        if not 0 < number <= 65535:
            raise ValueError(f"{origin!r}: port {port} is out of range")
        # Browsers never send the scheme's default port, nor leading zeros.
        port = None if number == _DEFAULT_PORTS[scheme] else str(number)
    return f"{scheme}://{host}" if port is None else f"{scheme}://{host}:{port}"


def _split_commas(value: object) -> object:
    # The environment gives one string ("k1,k2"); flags and code give a sequence.
    if isinstance(value, str):
        return tuple(item.strip() for item in value.split(",") if item.strip())
    return value


# A list setting: comma-separated in its environment variable, a repeatable flag.
CommaList = Annotated[tuple[str, ...], NoDecode, BeforeValidator(_split_commas)]
# A duration in seconds: positive and finite.
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
# A streamed append's line holds the payload plus its envelope (`{"event": <≤64 chars>,
# "data": …}`): room for that envelope and some whitespace on top of max_event_bytes.
STREAM_LINE_ENVELOPE_BYTES: Final = 4096


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid")

    host: str = Field("127.0.0.1", description="Bind address.")
    port: int = Field(8000, ge=0, le=65535, description="Bind port (0: any free port).")
    workers: int = Field(
        1,
        ge=1,
        description="Worker processes serving the one listening socket, each with its own "
        "bridge and Redis pool (more than 1 needs redis_url).",
    )
    redis_url: str | None = Field(
        None,
        repr=False,  # it may carry a password: never echoed, in an error or a repr
        description="Redis URL (redis://, rediss://, redis+cluster://); "
        "none: the in-process memory bridge.",
    )
    redis_key_prefix: str = Field("gw:", description="Prefix of every Redis key.")
    redis_max_connections: int = Field(
        64,
        ge=2,
        description="Connections in the Redis pool of one process; callers beyond it "
        "wait their turn, first come first served.",
    )
    redis_idle_connection_seconds: Seconds = Field(
        10.0,
        description="A pooled Redis connection unused for this long is closed: the pool "
        "opens connections as concurrency needs them and holds what the load needs.",
    )
    redis_command_timeout_seconds: Seconds = Field(
        5.0,
        description="Every Redis operation of a request or stream, retries included, "
        "answers within this (503 to writers, an unavailable frame to readers).",
    )
    redis_connect_timeout_seconds: Seconds = Field(
        2.0, description="Connecting to a Redis server gives up after this."
    )
    min_replicas_acked: int = Field(
        0,
        ge=0,
        description="A write is acknowledged only once this many Redis replicas confirm "
        "they hold it (WAIT after each write; 503 if fewer do within "
        "replica_ack_timeout_seconds); 0: once the primary has it. One Redis server "
        "(with its replicas) only, not a cluster.",
    )
    replica_ack_timeout_seconds: Seconds = Field(
        1.0,
        description="How long a write waits for min_replicas_acked replicas before it "
        "fails 503 (less than redis_command_timeout_seconds).",
    )
    fanout_window_events: int = Field(
        1_024,
        ge=16,
        description="Newest entries of each run kept in process for its local subscribers (Redis).",
    )

    max_events_per_run: int = Field(10_000, ge=1, description="Retained events per run.")
    stream_ttl_seconds: Seconds = Field(
        86_400, description="Rolling TTL of a run's keys, refreshed by each write."
    )
    ended_ttl_seconds: Seconds = Field(
        3_600, description="How long a run stays readable after its END."
    )
    heartbeat_interval_seconds: Seconds = Field(
        15.0, description="Idle seconds between SSE heartbeats; also the liveness check period."
    )
    sse_send_timeout_seconds: Seconds = Field(
        30.0,
        description="A client whose socket takes no bytes for this long is dropped (it "
        "reconnects with its cursor); until then it only falls behind.",
    )
    lease_seconds: Seconds = Field(30.0, description="Default producer lease.")
    producer_lost_grace_seconds: Seconds = Field(
        5.0,
        description="A streamed append whose connection drops (no clean end of body) "
        "leaves its producer this long to write again (on any gateway) before the run "
        "ends producer_lost.",
    )
    max_lease_seconds: Seconds = Field(3_600.0, description="Longest lease a producer may ask.")
    legacy_end_scan_enabled: bool = Field(
        True,
        description="Scan a run's retained log for an older END before writing one "
        "(see docs/operations.md before turning it off).",
    )

    api_keys: CommaList = Field(
        (), repr=False, description="API keys of producers, operators and readers."
    )
    jwt_secret: str | None = Field(
        None,
        repr=False,
        description=f"HMAC secret of subscriber tokens (at least {MIN_JWT_SECRET_BYTES} bytes); "
        "new tokens are signed with it.",
    )
    jwt_previous_secrets: CommaList = Field(
        (),
        repr=False,
        description="Older subscriber-token secrets, newest first, still accepted while the "
        "tokens signed with them expire (rotation; needs jwt_secret).",
    )
    jwt_app_keys: CommaList = Field(
        (),
        repr=False,
        description="Apps' own subscriber-token keys, `kid:secret` pairs (secret at least "
        f"{MIN_JWT_SECRET_BYTES} bytes): a token whose header names a `kid` verifies only "
        "with that key, and must name its `sessions` and expire within an hour.",
    )
    allow_open_nonloopback: bool = Field(
        False,
        description="Serve without authentication on a non-loopback address (unsafe).",
    )
    cors_origins: CommaList = Field(
        (),
        description="Browser pages on these origins may call the subscriber and session "
        'routes (CORS); empty: no cross-origin access; "*": any origin.',
    )
    allow_open_any_origin: bool = Field(
        False,
        description='Allow cors_origins "*" without authentication: any web page may then '
        "read, list and cancel every run (unsafe).",
    )
    cors_producer_routes: bool = Field(
        False, description="Also allow CORS on the producer and operator routes."
    )

    max_request_head_bytes: int = Field(
        16_384, ge=1_024, description="Largest request head (request line and headers)."
    )
    max_request_headers: int = Field(100, ge=8, description="Most headers in one request.")
    request_head_timeout_seconds: Seconds = Field(
        10.0, description="A connection must send a complete request head within this."
    )
    max_connections: int | None = Field(
        None,
        ge=1,
        description="Concurrent connections per process, 503 beyond (default: from the "
        "file limit).",
    )
    subject_stream_share: float = Field(
        0.1,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="Share of max_connections one reader (a token's subject, or an API key) "
        "may hold in open streams and /wait calls; beyond it 429 with Retry-After.",
    )

    max_event_bytes: int = Field(1_048_576, ge=64, description="Largest encoded event payload.")
    max_body_bytes: int = Field(4_194_304, ge=64, description="Largest request body.")
    max_batch_events: int = Field(1_000, ge=1, description="Most events in one batch.")
    max_append_streams_per_key: int = Field(
        256,
        ge=1,
        description="Open streamed appends (ndjson bodies) per API key in this process, 429 "
        "beyond.",
    )
    max_inflight_append_bytes: int = Field(
        64 * 1_048_576,
        ge=1,
        description="Bytes all streamed appends of this process may hold received but not "
        "yet appended (at least max_event_bytes + 4 KiB); a stream that needs more ends "
        "with the error line `overloaded`, one that would start with less than a line's "
        "worth left is 503.",
    )

    group_commit: bool = Field(
        True,
        description="Send the scripts of different runs that arrive while others are on "
        "the wire together: one write per Redis server, on a cluster one per node "
        "(gateway/redis/group.py); off: each on its own round trip.",
    )

    log_format: Literal["text", "json"] = Field("text", description="Log line format.")
    gc_tuning: bool = Field(
        True,
        description="Once started, freeze the start-up objects out of Python's cyclic "
        "collector and raise its thresholds (gateway/gc_policy.py), so that full "
        "passes, which stall the event loop for tens of ms under load, are rare and "
        "shorter; off: Python's defaults.",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        if isinstance(env_settings, EnvSettingsSource):
            _check_environment(env_settings)
        return init_settings, env_settings, dotenv_settings, file_secret_settings

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # Starlette compares origins as strings: keep each in the form browsers send.
        return tuple(dict.fromkeys(normalise_origin(origin) for origin in value))

    @field_validator("redis_url")
    @classmethod
    def _one_place_per_option(cls, url: str | None) -> str | None:
        if url is None:
            return None
        for option in parse_qs(urlsplit(url).query):
            if option in _REDIS_URL_OWNED:
                raise ValueError(
                    f"the URL's {option} option is the gateway's own setting: set "
                    f"{_REDIS_URL_OWNED[option]} instead"
                )
            if option in _REDIS_URL_REFUSED:
                raise ValueError(
                    f"the URL's {option} option is not supported: {_REDIS_URL_REFUSED[option]}"
                )
        password = urlsplit(url).password
        if password is not None and _is_example_secret(unquote(password)):
            raise ValueError(f"the URL's password {_EXAMPLE_REFUSED}")
        _check_redis_url_form(url)
        return url

    @field_validator("api_keys")
    @classmethod
    def _no_empty_key(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        if any(not key.strip() for key in keys):
            raise ValueError("an API key must not be empty")
        if any(_is_example_secret(key) for key in keys):
            raise ValueError(_EXAMPLE_REFUSED)
        return keys

    @field_validator("jwt_secret")
    @classmethod
    def _strong_secret(cls, secret: str | None) -> str | None:
        if secret:
            _check_jwt_secret(secret)
        return secret or None

    @field_validator("jwt_previous_secrets")
    @classmethod
    def _strong_previous_secrets(cls, secrets: tuple[str, ...]) -> tuple[str, ...]:
        for secret in secrets:
            _check_jwt_secret(secret)
        return secrets

    @field_validator("jwt_app_keys")
    @classmethod
    def _app_keys(cls, pairs: tuple[str, ...]) -> tuple[str, ...]:
        app_key_pairs(pairs)  # refuses a malformed, weak or repeated one
        return pairs

    @property
    def authenticated(self) -> bool:
        """Some credential is configured (else the gateway runs open)."""
        return bool(self.api_keys or self.jwt_secret or self.jwt_app_keys)

    @model_validator(mode="after")
    def _an_append_budget_that_holds_a_line(self) -> Self:
        line = self.max_event_bytes + STREAM_LINE_ENVELOPE_BYTES
        if self.max_inflight_append_bytes < line:
            raise ValueError(
                f"max_inflight_append_bytes ({self.max_inflight_append_bytes}) must hold "
                f"one streamed line at least: max_event_bytes + 4096 = {line}"
            )
        return self

    @model_validator(mode="after")
    def _previous_secrets_need_a_current_one(self) -> Self:
        if self.jwt_previous_secrets and not self.jwt_secret:
            raise ValueError(
                "jwt_previous_secrets (GATEWAY_JWT_PREVIOUS_SECRETS) needs jwt_secret "
                "(GATEWAY_JWT_SECRET), the newest secret, which new tokens are signed with"
            )
        return self

    @model_validator(mode="after")
    def _no_open_cors_for_any_origin(self) -> Self:
        open_mode = not self.authenticated
        if open_mode and "*" in self.cors_origins and not self.allow_open_any_origin:
            raise ValueError(
                "refusing cors_origins '*' without authentication: any web page could list "
                "sessions, read every run and cancel runs; set --api-keys / --jwt-secret, "
                "list the origins you trust, or force it with --allow-open-any-origin"
            )
        return self

    @model_validator(mode="after")
    def _no_open_public_bind(self) -> Self:
        open_mode = not self.authenticated
        if open_mode and not is_loopback(self.host) and not self.allow_open_nonloopback:
            raise ValueError(
                f"refusing to serve without authentication on non-loopback host "
                f"{self.host!r}: set --api-keys / --jwt-secret (GATEWAY_API_KEYS / "
                "GATEWAY_JWT_SECRET), bind to 127.0.0.1, or force it with "
                "--allow-open-nonloopback"
            )
        return self

    @model_validator(mode="after")
    def _replica_acks_need_one_redis(self) -> Self:
        if self.min_replicas_acked == 0:
            return self
        asked = f"--min-replicas-acked {self.min_replicas_acked} (GATEWAY_MIN_REPLICAS_ACKED)"
        if self.redis_url is None:
            raise ValueError(
                f"{asked} needs the Redis bridge: set --redis-url (GATEWAY_REDIS_URL); the "
                "memory bridge has no replicas"
            )
        if urlsplit(self.redis_url).scheme.endswith("+cluster"):
            # WAIT counts the replicas of the connection's own server: on a cluster a
            # write's shard connection is the cluster client's, not one the bridge keeps.
            raise ValueError(
                f"{asked} is not supported on a Redis Cluster (redis+cluster://): use 0, "
                "or one primary with replicas (Sentinel)"
            )
        if self.replica_ack_timeout_seconds >= self.redis_command_timeout_seconds:
            raise ValueError(
                f"replica_ack_timeout_seconds ({self.replica_ack_timeout_seconds:g}) must be "
                "less than redis_command_timeout_seconds "
                f"({self.redis_command_timeout_seconds:g}), which bounds the whole write"
            )
        return self

    @model_validator(mode="after")
    def _workers_share_redis(self) -> Self:
        # Memory-bridge workers would share nothing: a reader on one worker would never
        # see what a producer wrote through another.
        if self.workers > 1 and self.redis_url is None:
            raise ValueError(
                f"--workers {self.workers} (GATEWAY_WORKERS) needs the Redis bridge: set "
                "--redis-url (GATEWAY_REDIS_URL); memory-bridge workers would share no runs"
            )
        return self


def _check_redis_url_form(url: str) -> None:
    """A Redis URL the client can use, checked before anything connects; each message
    names the part at fault, never the URL (it may hold a password)."""
    parts = urlsplit(url)
    if parts.scheme not in _REDIS_SCHEMES:
        raise ValueError(
            "the URL's scheme must be one of " + ", ".join(f"{s}://" for s in _REDIS_SCHEMES)
        )
    try:
        parts.port  # noqa: B018 - parsing it is the check
    except ValueError:
        raise ValueError("the URL's port is not a number from 0 to 65535") from None
    # Files the TLS handshake reads: a missing one would otherwise surface at every
    # connection attempt as "No such file or directory", naming no file.
    for option, values in parse_qs(parts.query).items():
        want_dir = option == "ssl_ca_path"
        if option in _REDIS_URL_FILES or want_dir:
            for value in values:
                path = Path(value)
                found = path.is_dir() if want_dir else path.is_file()
                if not found or not os.access(path, os.R_OK):
                    kind = "directory" if want_dir else "file"
                    raise ValueError(f"the URL's {option} {kind} {value} is missing or unreadable")


_EXAMPLE_REFUSED: Final = (
    "is an example value shipped in the repository (anyone can read it): generate a "
    "secret, e.g. `openssl rand -hex 32`"
)


_KID: Final = re.compile(r"[A-Za-z0-9._-]{1,64}")


def app_key_pairs(pairs: tuple[str, ...]) -> dict[str, str]:
    """`jwt_app_keys` as {kid: secret}; ValueError for a malformed, weak or repeated one."""
    keys: dict[str, str] = {}
    for pair in pairs:
        kid, sep, secret = pair.partition(":")
        if not sep or _KID.fullmatch(kid) is None:
            raise ValueError(
                "each app key is `kid:secret`, the kid 1-64 characters of [A-Za-z0-9._-]"
            )
        if kid in keys:
            raise ValueError(f"app key id {kid!r} is listed twice")
        try:
            _check_jwt_secret(secret)
        except ValueError as exc:
            raise ValueError(f"app key {kid!r}: the secret {exc}") from None
        keys[kid] = secret
    return keys


def _check_jwt_secret(secret: str) -> None:
    if len(secret.encode()) < MIN_JWT_SECRET_BYTES:
        raise ValueError(f"must be at least {MIN_JWT_SECRET_BYTES} bytes (HMAC key strength)")
    if _is_example_secret(secret):
        raise ValueError(_EXAMPLE_REFUSED)


def _check_environment(env_settings: EnvSettingsSource) -> None:
    """Refuse likely typos among unknown `GATEWAY_*` variables; warn once about the rest.

    A Kubernetes service link's `GATEWAY_PORT=tcp://…` is dropped from what is read.
    """
    prefix = ENV_PREFIX.lower()  # names are read case-insensitively (lower-cased here)
    env = env_settings.env_vars
    unknown = [
        name
        for name in env
        if name.startswith(prefix) and name[len(prefix) :] not in Settings.model_fields
    ]
    port = prefix + "port"
    if _SERVICE_LINK_URL.fullmatch(env.get(port) or ""):
        env_settings.env_vars = {name: value for name, value in env.items() if name != port}
        unknown.append(port)
    typos = {name: guess for name in unknown if (guess := _likely_typo(name[len(prefix) :]))}
    if typos:
        named = ", ".join(
            f"{name.upper()} (did you mean {ENV_PREFIX}{guess.upper()}?)"
            for name, guess in sorted(typos.items())
        )
        raise ValueError(
            f"unknown settings in the environment: {named} "
            "(gateway serve --help lists every setting)"
        )
    if unknown:
        warnings.warn(
            UnknownSettingsWarning(
                "ignoring environment variables that name no setting: "
                + ", ".join(sorted(name.upper() for name in unknown))
            ),
            stacklevel=2,
        )
