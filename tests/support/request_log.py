"""The gateway's request log as a test sees it: which reader requests a client made.

with request_log() as log:
    ...
    log.reads_after(run_id, since)   # GET lines for that run started after `since`
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager


class RequestLog(logging.Handler):
    """The gateway's request log lines (one per finished request), by start time."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[float, str | None, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        started = time.monotonic() - float(getattr(record, "duration_ms", 0.0)) / 1000
        self.lines.append((started, getattr(record, "run_id", None), record.getMessage()))

    def reads_after(self, run_id: str, since: float) -> list[str]:
        """The reader requests (not the producer's) for `run_id` started after `since`."""
        return [
            line
            for at, rid, line in self.lines
            if rid == run_id and at > since and line.startswith("GET ")
        ]


@contextmanager
def request_log() -> Iterator[RequestLog]:
    logger = logging.getLogger("gateway.http.requests")
    handler, level = RequestLog(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
