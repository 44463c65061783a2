"""Reading and validating request input: bounded JSON bodies, fields, query parameters.

Every failure raises a 4xx (`HttpError` or `InvalidInput`/`PayloadTooLarge`), never
anything that becomes a 500. JSON is decoded with orjson, which refuses NaN/Infinity,
invalid UTF-8 and lone surrogates (all `400 invalid_json`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Final

import orjson
from starlette.requests import Request

from ...errors import InvalidInput, PayloadTooLarge
from .errors import HttpError

_MISSING: Final = object()

# orjson decodes integers outside [-2**63, 2**64 - 1] as floats, which would change the
# producer's number; such bodies are refused instead. Only a run of 19+ digits can be one.
_LONG_DIGITS: Final = re.compile(rb"[0-9]{19}")
# Strings and numbers of a valid JSON text (outside strings only numbers hold digits).
_TOKENS: Final = re.compile(rb'"(?:[^"\\]|\\.)*"|-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?')
_SECONDS_RE: Final = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,9})?")
_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**64 - 1


def require_json(request: Request) -> None:
    """415 unless the request says `Content-Type: application/json` (body or not).

    A browser sends a cross-origin `POST` without asking first (no CORS preflight) only
    with a form or `text/plain` content type; requiring JSON on every `POST` keeps web
    pages from driving the producer and cancel routes of a gateway they can reach.
    """
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != "application/json":
        raise HttpError(
            "unsupported_media_type", "send the request with Content-Type: application/json"
        )


async def read_json_object(
    request: Request, max_bytes: int, *, allow_empty: bool
) -> dict[str, Any]:
    """The request body as a JSON object, read up to `max_bytes` (413 beyond); the
    request must say it is JSON (`require_json`)."""
    require_json(request)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"request body exceeds {max_bytes} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(f"request body exceeds {max_bytes} bytes")
        chunks.append(chunk)
    body = b"".join(chunks)
    if not body.strip():
        if allow_empty:
            return {}
        raise HttpError("invalid_json", "request body must be a JSON object")
    return parse_json_object(body, "request body")


def parse_json_object(body: bytes, what: str) -> dict[str, Any]:
    """`body` as a JSON object, every integer kept exactly (also one line of a streamed
    append, `append_stream.py`); 400 `invalid_json`, 422 otherwise."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise HttpError("invalid_json", f"{what} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} must be a JSON object")
    if _LONG_DIGITS.search(body):
        _check_integers(body)
    return value


def _check_integers(body: bytes) -> None:
    for match in _TOKENS.finditer(body):
        token = match.group()
        if token[:1] == b'"' or b"." in token or b"e" in token or b"E" in token:
            continue
        # (int() refuses thousands of digits: a token that long is out of range anyway)
        if len(token) > 21 or not _INT_MIN <= int(token) <= _INT_MAX:
            raise HttpError(
                "number_out_of_range",
                f"integer {token[:40].decode()}{'...' if len(token) > 40 else ''} is outside "
                "the 64-bit range the gateway keeps exactly; send it as a string",
            )


def reject_unknown(body: Mapping[str, Any], allowed: frozenset[str]) -> None:
    if body.keys() <= allowed:  # (every event of a batch, every line of a stream)
        return
    unknown = sorted(set(body) - allowed)
    raise InvalidInput(f"unexpected field(s): {', '.join(unknown)[:200]}")


def req_str(body: Mapping[str, Any], key: str) -> str:
    value = body.get(key, _MISSING)
    if value is _MISSING:
        raise InvalidInput(f"{key} is required")
    if not isinstance(value, str):
        raise InvalidInput(f"{key} must be a string")
    return value


def check_seconds(key: str, value: float, *, maximum: float, allow_zero: bool = False) -> float:
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise InvalidInput(f"{key} must be a finite number {'>=' if allow_zero else '>'} 0")
    if value > maximum:
        raise InvalidInput(f"{key} must be at most {maximum:g}")
    return value


def query_seconds_value(key: str, raw: object, default: float) -> float:
    """`raw` (a query parameter's text, None when absent) as seconds; see `query_seconds`."""
    if raw is None or raw == "":
        return default
    # ASCII digits only: float() also takes other scripts' digits, `_`, spaces, `inf`
    if not isinstance(raw, str) or not _SECONDS_RE.fullmatch(raw):
        raise InvalidInput(f"{key} must be a number of seconds (ASCII digits, e.g. 2.5)")
    value = float(raw)
    if not math.isfinite(value) or value < 0:
        raise InvalidInput(f"{key} must be a finite number >= 0")
    return value
