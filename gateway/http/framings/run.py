"""The run stream's framing (`GET /v1/runs/{run_id}/stream`).

    id: <event id>  event: <name>  data: the producer's payload, byte for byte
    id: end         event: end     data: {"status"[, "error"]}         last
    id: gap         event: gap     data: the gap (`gap_payload`)        last
    : heartbeat

Terminal frames carry a terminal id (`id: end`, `id: gap`). It is not a position, so a
gap never moves a client past events it was not sent; a client that reconnects only
because the response ended sends it back as `Last-Event-ID` and is answered 204 (what
makes a WHATWG `EventSource` stop reconnecting; see `frames.TERMINAL_CURSORS`). The
`unavailable` frame carries no id: the client reconnects with its real cursor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, assert_never

from ...values import End, Heartbeat, StreamEvent, StreamGap, StreamItem
from ..streaming.frames import (
    END_ID,
    GAP_ID,
    HEARTBEAT_FRAME,
    SHUTDOWN_FRAME,
    TOKEN_EXPIRED_FRAME,
    event_frame,
    json_frame,
    retry_frame,
)
from ..streaming.framing import Closing

TERMINAL: Final[tuple[type, ...]] = (End, StreamGap)


def end_payload(end: End) -> dict[str, Any]:
    payload: dict[str, Any] = {"status": end.status}
    if end.error is not None:
        payload["error"] = end.error
    return payload


def gap_payload(run_id: str, gap: StreamGap) -> dict[str, Any]:
    return {
        "code": "stream_replay_gap",
        "run_id": run_id,
        "requested_event_id": gap.requested_event_id,
        "earliest_available_event_id": gap.earliest_available_event_id,
        "latest_available_event_id": gap.latest_available_event_id,
        "reason": gap.reason,
        "recovery": "reload_durable_state",
    }


def unavailable_payload(where: dict[str, str], detail: str) -> dict[str, str]:
    """The subscriber-side backend failed: the response ends; reconnect with the cursor."""
    return {"code": "backend_unavailable", **where, "detail": detail, "recovery": "reconnect"}


def closing_frame(why: Closing, unavailable: dict[str, str], detail: str) -> bytes:
    """The clean ending every reconnecting client understands (run and session feed)."""
    match why:
        case Closing.SHUTDOWN:
            return SHUTDOWN_FRAME
        case Closing.TOKEN_EXPIRED:
            return TOKEN_EXPIRED_FRAME
        case Closing.UNAVAILABLE:
            return json_frame(b"unavailable", unavailable_payload(unavailable, detail))
        case _:
            assert_never(why)


@dataclass(frozen=True, slots=True)
class RunFraming:
    """The frames of one run's stream (made per response: the gap names the run)."""

    run_id: str

    @property
    def terminal(self) -> tuple[type, ...]:
        return TERMINAL

    def opening(self) -> bytes:
        return retry_frame()

    def frame(self, item: StreamItem) -> bytes:
        if type(item) is StreamEvent:  # the usual item first, by exact type
            return event_frame(item)
        match item:
            case StreamEvent():
                return event_frame(item)
            case Heartbeat():
                return HEARTBEAT_FRAME
            case End():
                return json_frame(b"end", end_payload(item), END_ID)
            case StreamGap():
                return self.gap(item)
            case _:
                assert_never(item)

    def gap(self, gap: StreamGap) -> bytes:
        return json_frame(b"gap", gap_payload(self.run_id, gap), GAP_ID)

    def closing(self, why: Closing, detail: str) -> bytes | None:
        return closing_frame(why, {"run_id": self.run_id}, detail)
