"""The one frozen settings object, built at the edge from env (`GATEWAY_*`) and CLI flags.

Nothing else in the package reads the environment: `Settings` is passed down explicitly.
Every setting is startup-only.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Final, Literal

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

# What a browser sends as `Origin`: scheme://host[:port] (a trailing slash is forgiven).
_ORIGIN_RE: Final = re.compile(
    r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?/?|https?://\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?/?"
)


def _env(*names: str) -> AliasChoices:
    return AliasChoices(*names)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="GATEWAY_", frozen=True, populate_by_name=True, extra="forbid"
    )

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    redis_url: str | None = None
    redis_key_prefix: str = "gw:"
    redis_max_connections: int = Field(64, ge=2)
    # Newest entries of each run kept in process for its local subscribers (Redis).
    fanout_window_events: int = Field(1_024, ge=16)

    max_events_per_run: int = Field(10_000, ge=1)
    stream_ttl_seconds: float = Field(
        86_400, gt=0, validation_alias=_env("stream_ttl_seconds", "GATEWAY_STREAM_TTL")
    )
    ended_ttl_seconds: float = Field(
        3_600, gt=0, validation_alias=_env("ended_ttl_seconds", "GATEWAY_ENDED_TTL")
    )
    heartbeat_interval_seconds: float = Field(
        15.0,
        gt=0,
        validation_alias=_env(
            "heartbeat_interval_seconds",
            "GATEWAY_HEARTBEAT_INTERVAL",
            "GATEWAY_HEARTBEAT_INTERVAL_SECONDS",
        ),
    )
    # A client whose socket takes no bytes for this long is dropped (it reconnects with
    # its cursor); until then it only falls behind, never holding up anybody else.
    sse_send_timeout_seconds: float = Field(
        30.0,
        gt=0,
        validation_alias=_env(
            "sse_send_timeout_seconds",
            "GATEWAY_SSE_SEND_TIMEOUT",
            "GATEWAY_SSE_SEND_TIMEOUT_SECONDS",
        ),
    )
    lease_seconds: float = Field(30.0, gt=0)
    max_lease_seconds: float = Field(3_600.0, gt=0)
    legacy_end_scan_enabled: bool = Field(
        True,
        validation_alias=_env(
            "legacy_end_scan_enabled", "GATEWAY_LEGACY_END_SCAN", "GATEWAY_LEGACY_END_SCAN_ENABLED"
        ),
    )

    api_keys: Annotated[tuple[str, ...], NoDecode] = Field(
        (), validation_alias=_env("api_keys", "GATEWAY_API_KEY", "GATEWAY_API_KEYS")
    )
    jwt_secret: str | None = None
    allow_open_nonloopback: bool = False
    # Browser pages on these origins may call the subscriber and session routes (CORS;
    # `http/cors.py`). Empty: no cross-origin access. "*" allows any origin.
    cors_origins: Annotated[tuple[str, ...], NoDecode] = Field(
        (), validation_alias=_env("cors_origins", "GATEWAY_CORS_ORIGINS", "GATEWAY_CORS_ORIGIN")
    )
    # Also the producer and operator routes (server-to-server by default).
    cors_producer_routes: bool = False

    max_event_bytes: int = Field(1_048_576, ge=64)
    max_body_bytes: int = Field(4_194_304, ge=64)
    max_batch_events: int = Field(1_000, ge=1)

    log_format: Literal["text", "json"] = "text"

    @field_validator("api_keys", "cors_origins", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(k.strip() for k in value.split(",") if k.strip())
        return value

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for origin in value:
            if origin != "*" and not _ORIGIN_RE.fullmatch(origin):
                raise ValueError(
                    f"{origin!r} is not an origin (scheme://host[:port], no path) or *"
                )
        return tuple(origin.rstrip("/") for origin in value)

    @field_validator(
        "stream_ttl_seconds",
        "ended_ttl_seconds",
        "heartbeat_interval_seconds",
        "lease_seconds",
        "sse_send_timeout_seconds",
    )
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be finite")
        return value
