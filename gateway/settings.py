"""The one frozen settings object, built at the edge (`gateway.cli`) and passed down.

Each setting is one field of `Settings` and nothing else. From the field follow:
- its environment variable, `GATEWAY_<NAME>` (for example `GATEWAY_STREAM_TTL_SECONDS`),
  the only name the environment is read under; an unprefixed `STREAM_TTL_SECONDS` or
  `API_KEYS` that another program set is ignored;
- its `gateway serve` flag, `--<name>` with dashes (`--stream-ttl-seconds`; a boolean
  gets `--<name>/--no-<name>`, a list is repeatable), which `gateway.cli` generates
  from this class with the field's `description` as the flag's help.
So adding a field is the whole of adding a setting. Every setting is startup-only. A
`GATEWAY_*` variable that names no setting is refused (a typo would otherwise be a
setting silently left at its default).

Nothing else in the package reads the environment. Settings that would serve without
authentication on a non-loopback address are invalid (unless `allow_open_nonloopback`
forces it), and so are several workers on the memory bridge (they would share no
runs), whoever builds them: the command line and library users of `create_app`.
"""

from __future__ import annotations

import re
from typing import Annotated, Final, Literal, Self
from urllib.parse import parse_qs, urlsplit

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
# Redis URL query options the bridge cannot work with: it reads and writes Redis data as
# bytes itself (payloads kept exactly, notifications parsed as bytes).
_REDIS_URL_REFUSED: Final = {
    "decode_responses": "the gateway reads Redis replies as bytes",
    "encoding": "the gateway encodes what it writes to Redis itself",
}
# What a browser sends as `Origin`: scheme://host[:port] (a trailing slash is forgiven).
_ORIGIN_RE: Final = re.compile(
    r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?/?|https?://\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?/?"
)


def _split_commas(value: object) -> object:
    # The environment gives one string ("k1,k2"); flags and code give a sequence.
    if isinstance(value, str):
        return tuple(item.strip() for item in value.split(",") if item.strip())
    return value


# A list setting: comma-separated in its environment variable, a repeatable flag.
CommaList = Annotated[tuple[str, ...], NoDecode, BeforeValidator(_split_commas)]
# A duration in seconds: positive and finite.
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]


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
    redis_command_timeout_seconds: Seconds = Field(
        5.0,
        description="Every Redis operation of a request or stream, retries included, "
        "answers within this (503 to writers, an unavailable frame to readers).",
    )
    redis_connect_timeout_seconds: Seconds = Field(
        2.0, description="Connecting to a Redis server gives up after this."
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
        description=f"HMAC secret of subscriber tokens (at least {MIN_JWT_SECRET_BYTES} bytes).",
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

    max_event_bytes: int = Field(1_048_576, ge=64, description="Largest encoded event payload.")
    max_body_bytes: int = Field(4_194_304, ge=64, description="Largest request body.")
    max_batch_events: int = Field(1_000, ge=1, description="Most events in one batch.")
    max_append_streams_per_key: int = Field(
        256, ge=1, description="Open streamed appends (ndjson bodies) per API key, 429 beyond."
    )

    log_format: Literal["text", "json"] = Field("text", description="Log line format.")

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
            prefix = ENV_PREFIX.lower()  # names are read case-insensitively
            unknown = sorted(
                name.upper()
                for name in env_settings.env_vars
                if name.startswith(prefix) and name[len(prefix) :] not in cls.model_fields
            )
            if unknown:
                raise ValueError(
                    f"unknown settings in the environment: {', '.join(unknown)} "
                    "(gateway serve --help lists every setting)"
                )
        return init_settings, env_settings, dotenv_settings, file_secret_settings

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for origin in value:
            if origin != "*" and not _ORIGIN_RE.fullmatch(origin):
                raise ValueError(
                    f"{origin!r} is not an origin (scheme://host[:port], no path) or *"
                )
        return tuple(origin.rstrip("/") for origin in value)

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
        return url

    @field_validator("api_keys")
    @classmethod
    def _no_empty_key(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        if any(not key.strip() for key in keys):
            raise ValueError("an API key must not be empty")
        return keys

    @field_validator("jwt_secret")
    @classmethod
    def _strong_secret(cls, secret: str | None) -> str | None:
        if secret and len(secret.encode()) < MIN_JWT_SECRET_BYTES:
            raise ValueError(f"must be at least {MIN_JWT_SECRET_BYTES} bytes (HMAC key strength)")
        return secret or None

    @model_validator(mode="after")
    def _no_open_public_bind(self) -> Self:
        open_mode = not self.api_keys and not self.jwt_secret
        if open_mode and not is_loopback(self.host) and not self.allow_open_nonloopback:
            raise ValueError(
                f"refusing to serve without authentication on non-loopback host "
                f"{self.host!r}: set --api-keys / --jwt-secret (GATEWAY_API_KEYS / "
                "GATEWAY_JWT_SECRET), bind to 127.0.0.1, or force it with "
                "--allow-open-nonloopback"
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
