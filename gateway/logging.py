"""Process logging, configured once by the command line from `Settings.log_format`.

- ``text``: ``2024-01-01T00:00:00.000Z INFO gateway.http: message key=value ...``
- ``json``: one JSON object per line (orjson): ``ts``, ``level``, ``logger``, ``msg``,
  then the record's extra fields (``run_id``, ``session_id``, ``request_id``,
  ``outcome``, ...) and ``exc`` for a traceback.

Payload contents are never logged: callers pass identifiers and outcomes as extras,
and the formatter drops extra fields whose names denote payloads or secrets
(`REDACTED_FIELDS`). The `access_token` query parameter is masked in uvicorn's access
log lines, so subscriber tokens do not end up in log files.
"""

from __future__ import annotations

import functools
import logging
import re
import sys
import time
from typing import Any, Final, Literal

import orjson

LogFormat = Literal["text", "json"]

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD_ATTRS: Final = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)).keys()
) | {"message", "asctime", "taskName", "color_message"}

REDACTED_FIELDS: Final = frozenset(
    {
        "data",
        "payload",
        "body",
        "text",
        "input_message",
        "events",
        "error_detail",
        "token",
        "producer_token",
        "access_token",
        "api_key",
        "authorization",
        "jwt_secret",
        "jwt_app_keys",
        "password",
    }
)

_ACCESS_TOKEN_RE: Final = re.compile(r"(access_token=)[^&\s\"]*")


@functools.lru_cache(maxsize=4)
def _second(whole: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))


def _timestamp(created: float) -> str:
    # A busy process logs many lines a second: the formatted second is reused.
    return f"{_second(int(created))}.{int(created * 1000) % 1000:03d}Z"


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {
        key: value
        for key, value in vars(record).items()
        if key not in _STANDARD_ATTRS and not key.startswith("_") and key not in REDACTED_FIELDS
    }


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": _timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in _extras(record).items():
            entry.setdefault(key, value)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


class TextFormatter(logging.Formatter):
    """Human-readable lines; extra fields are appended as key=value."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record.created)} {record.levelname} {record.name}: "
        line += record.getMessage()
        extras = _extras(record)
        if extras:
            line += " " + " ".join(f"{k}={v}" for k, v in extras.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class RedactAccessTokenFilter(logging.Filter):
    """Masks `access_token=` query values in (uvicorn access) log records."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(
            isinstance(a, str) and "access_token=" in a for a in args
        ):
            record.args = tuple(
                _ACCESS_TOKEN_RE.sub(r"\1***", a) if isinstance(a, str) else a for a in args
            )
        if isinstance(record.msg, str) and "access_token=" in record.msg:
            record.msg = _ACCESS_TOKEN_RE.sub(r"\1***", record.msg)
        return True


def configure_logging(log_format: LogFormat = "text", level: int | str = logging.INFO) -> None:
    """Route the root logger (and uvicorn's loggers) to stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    handler.addFilter(RedactAccessTokenFilter())
    # No formatter here prints a record's thread or process: do not look them up for
    # every record (the request log writes one line per request).
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    if hasattr(logging, "logAsyncioTasks"):  # Python 3.12+
        logging.logAsyncioTasks = False
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        uv = logging.getLogger(name)
        for old in list(uv.handlers):
            uv.removeHandler(old)
        uv.propagate = True
        uv.setLevel(level)
    # The producer client's HTTP library logs every request at INFO; the gateway's own
    # request log already has one line per request.
    logging.getLogger("httpx").setLevel(logging.WARNING)
