"""Conversions at the Redis boundary, shared by every module that talks to Redis."""

from __future__ import annotations

import math


def as_text(value: bytes | str) -> str:
    """A reply value as text (clients built with or without `decode_responses`)."""
    return value.decode() if isinstance(value, bytes) else value


def ceil_ms(seconds: float) -> int:
    """Seconds as whole milliseconds for PEXPIRE and friends: rounded up, at least 1.

    Rounding down could turn a short TTL into 0, which Redis treats as "expire now".
    """
    return max(1, math.ceil(seconds * 1000))
