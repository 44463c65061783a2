"""What an SSE response reports, passed in by its route: metrics, log lines and the
resume count (docs/operations.md). The response (`sse.py`) calls it at each write and
at its ending; it never looks at what is being streamed.

With `metrics`, each write adds its bytes to `gateway_sse_bytes_out_total` and, when it
carries events, their count to `gateway_events_delivered_total` and one delivery-lag
observation (the newest event of the write); the resume outcome, gaps and drains are
counted once per response. The stream outcome and events delivered go to the request
log line (`observe`), set by the response.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Final, Literal

from ...errors import BridgeClosed
from ...values import GapReason, StreamGap
from ..edge.observe import lifecycle
from ..metrics import Metrics, ResumeOutcome

log = logging.getLogger(__name__)

# How the reader asked to start: no cursor, a malformed one, or a valid one (whose
# outcome, exact or a gap, is known at the subscription's first item).
ResumeStart = Literal["from_start", "malformed_cursor", "cursor"]
# A resume that ends in a gap, by the gap's reason (bridge_closed: the gateway is shutting
# down, which says nothing of the cursor).
GAP_OUTCOMES: Final[Mapping[GapReason, ResumeOutcome | None]] = {
    "trimmed": "gap_trimmed",
    "stream_removed": "gap_stream_removed",
    "unknown_position": "gap_unknown_position",
    "bridge_closed": None,
}


class StreamObserver:
    """Reports one response. `run_of` names the run a gap belongs to when that changes
    along the stream (the session feed); otherwise it is `run_id`."""

    __slots__ = (
        "_count_first",
        "_run_of",
        "_started_ms",
        "metrics",
        "request_id",
        "resume",
        "run_id",
        "session_id",
    )

    def __init__(
        self,
        metrics: Metrics | None,
        *,
        run_id: str | None = None,
        session_id: str | None = None,
        resume: ResumeStart | None = None,
        run_of: Callable[[], str] | None = None,
    ) -> None:
        self.metrics = metrics
        self.run_id = run_id
        self.session_id = session_id
        self.resume = resume
        self.request_id: str | None = None
        self._run_of = run_of
        self._count_first = resume == "cursor"  # a resume's outcome, from its first item
        self._started_ms = 0.0

    def started(self, request_id: str | None, *, streaming: bool) -> None:
        """The response started; `streaming` False: it is over at once (an ended run)."""
        self.request_id = request_id
        self._started_ms = time.time() * 1000
        if self.resume in ("from_start", "malformed_cursor"):
            self._count_resume(self.resume)
        elif self.resume == "cursor" and not streaming:
            self._count_first = False
            self._count_resume("exact")

    def first_item(self, item: object) -> None:
        """Count a valid cursor's resume outcome from the subscription's first item."""
        if not self._count_first:
            return
        self._count_first = False
        if isinstance(item, StreamGap):
            outcome = GAP_OUTCOMES[item.reason]
            if outcome is not None:
                self._count_resume(outcome)
        else:
            self._count_resume("exact")

    def wrote(self, size: int, events: int, last_id: str | None) -> None:
        metrics = self.metrics
        if metrics is None:
            return
        metrics.bytes_out.inc(size)
        if events:
            metrics.delivered(events)
            if last_id is not None:
                metrics.lag.observe(self._lag_seconds(last_id))

    def gap(self, gap: StreamGap) -> None:
        if self.metrics is not None:
            self.metrics.gaps[gap.reason].inc()
        lifecycle(
            "gap",
            "gap served",
            run_id=self.run_id if self._run_of is None else self._run_of(),
            session_id=self.session_id,
            request_id=self.request_id,
            reason=gap.reason,
            requested_event_id=gap.requested_event_id,
            earliest_available_event_id=gap.earliest_available_event_id,
            latest_available_event_id=gap.latest_available_event_id,
        )

    def drained(self) -> None:
        if self.metrics is not None:
            self.metrics.drained.inc()

    def send_timed_out(self) -> None:
        log.info("sse: client of %s too slow to read; dropping it", self._subject())

    def unavailable(self, exc: Exception) -> None:
        if isinstance(exc, BridgeClosed):
            log.info("sse: %s subscription ended: bridge closed", self._subject())
            return
        if self.metrics is not None:
            self.metrics.unavailable("sse")
        lifecycle(
            "backend_unavailable",
            "sse subscription failed",
            level=logging.WARNING,
            route_kind="sse",
            run_id=self.run_id,
            session_id=self.session_id,
            request_id=self.request_id,
            error=type(exc).__name__,
        )

    def _subject(self) -> str:
        return f"run {self.run_id}" if self.run_id is not None else f"session {self.session_id}"

    def _count_resume(self, outcome: ResumeOutcome) -> None:
        if self.metrics is not None:
            self.metrics.resumes[outcome].inc()

    def _lag_seconds(self, event_id: str) -> float:
        """Now minus the later of the event's publish time (its id's ms) and our start."""
        published_ms = float(event_id[: event_id.find("-")])
        lag_ms = time.time() * 1000 - max(published_ms, self._started_ms)
        return lag_ms / 1000 if lag_ms > 0 else 0.0
