"""Encoding of SSE frames (docs/protocol.md §4), as bytes ready for the socket, one
`Framing` per kind of stream.

A data event's payload is the compact JSON the bridge encoded once at publish
(`StreamEvent.data`); it is written as is, never decoded and re-encoded.

Shapes chosen so that no parser hands an application an empty event (httpx-sse and
`@microsoft/fetch-event-source` dispatch one for any blank line, even after a lone
`retry:` or comment line): the `retry:` hint, heartbeats and the shutdown comment are
single lines *without* a blank line after them. A `retry:` line is applied by every
parser when it is read; a lone comment line is ignored; the next real frame's blank
line dispatches that frame only.

Terminal frames: `end` and `gap` carry a terminal id (`id: end`, `id: gap`). It is not a
position, so a gap never moves a client past events it was not sent; a client that
reconnects only because the response ended sends it back as `Last-Event-ID` and is
answered 204 (what makes a WHATWG `EventSource` stop reconnecting; see
`TERMINAL_CURSORS`). `unavailable` carries no id: the client reconnects with its real
cursor.

`RUN` is the framing of `/v1/runs/{id}/stream`; `LANGGRAPH` adds, after a gap, the
`error` event that the LangGraph SDK treats as terminal (it reconnects after any other
clean close); `UI_MESSAGES` (`ui_stream.py`) writes AI SDK UI message streams.
"""

from __future__ import annotations

import random
from typing import Any, Final

from ...values import End, StreamEvent, StreamGap, encode_json

HEARTBEAT_FRAME: Final = b": heartbeat\n"
SHUTDOWN_FRAME: Final = b": shutdown, reconnect with Last-Event-ID\n"
TOKEN_EXPIRED_FRAME: Final = b": token expired, reconnect with a fresh token and Last-Event-ID\n"

# `id:` of the terminal frames; sent back as a cursor they are answered with 204.
END_ID: Final = "end"
GAP_ID: Final = "gap"
TERMINAL_CURSORS: Final = frozenset({END_ID, GAP_ID})

# The retry hint is jittered per connection so a deploy does not cause a reconnect storm.
RETRY_MIN_MS: Final = 1000
RETRY_MAX_MS: Final = 3000


def retry_frame(rng: random.Random | None = None) -> bytes:
    ms = (rng or random).randint(RETRY_MIN_MS, RETRY_MAX_MS)
    return b"retry: %d\n" % ms


def event_frame(item: StreamEvent) -> bytes:
    """The event's frame, built on first use and kept on the (shared) event."""
    frame = item.wire
    if frame is None:
        frame = item.wire = _event_frame(item)
    return frame


def _one_line(data: bytes) -> bytes:
    if b"\n" in data or b"\r" in data:  # never from orjson; keep the frame intact anyway
        data = b"\ndata: ".join(data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n"))
    return data


def _event_frame(item: StreamEvent) -> bytes:
    data = _one_line(item.data)
    return b"id: %s\nevent: %s\ndata: %s\n\n" % (item.id.encode(), item.event.encode(), data)


def _named(event: bytes, payload: Any, event_id: str | None = None) -> bytes:
    frame = b"event: %s\ndata: %s\n\n" % (event, encode_json(payload))
    return frame if event_id is None else b"id: %s\n%s" % (event_id.encode(), frame)


def end_payload(end: End) -> dict[str, Any]:
    payload: dict[str, Any] = {"status": end.status}
    if end.error is not None:
        payload["error"] = end.error
    return payload


def end_frame(end: End) -> bytes:
    return _named(b"end", end_payload(end), END_ID)


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


def gap_frame(run_id: str, gap: StreamGap) -> bytes:
    return _named(b"gap", gap_payload(run_id, gap), GAP_ID)


def unavailable_frame(run_id: str, detail: str) -> bytes:
    """The subscriber-side backend failed: the response ends; reconnect with the cursor."""
    return _named(
        b"unavailable",
        {
            "code": "backend_unavailable",
            "run_id": run_id,
            "detail": detail,
            "recovery": "reconnect",
        },
    )


class Framing:
    """How one kind of SSE stream writes each item (stateless: one shared instance).

    `shutdown` and `unavailable` return None when the response must end as a dropped
    connection instead (a client that reads a clean end as "finished" then resumes).
    """

    opening_retry: bool = True

    def opening(self) -> bytes:
        return retry_frame() if self.opening_retry else b""

    def event(self, item: StreamEvent) -> bytes:
        return event_frame(item)

    def heartbeat(self) -> bytes:
        return HEARTBEAT_FRAME

    def end(self, end: End) -> bytes:
        return end_frame(end)

    def gap(self, run_id: str, gap: StreamGap) -> bytes:
        return gap_frame(run_id, gap)

    def unavailable(self, run_id: str, detail: str) -> bytes | None:
        return unavailable_frame(run_id, detail)

    def shutdown(self) -> bytes | None:
        return SHUTDOWN_FRAME

    def token_expired(self) -> bytes | None:
        """The reader's token expired: end cleanly so it reconnects with a fresh one."""
        return TOKEN_EXPIRED_FRAME if self.shutdown() is not None else None


class LangGraphFraming(Framing):
    """The run framing, plus a terminal `error` event after a gap (LangGraph SDK routes).

    The SDK stops only after `end` or `error`; after any other close it asks the run's
    status and reconnects, a gap included (it would loop on the gap without bound).
    """

    def gap(self, run_id: str, gap: StreamGap) -> bytes:
        error = {
            "error": "stream_replay_gap",
            "message": "events after the cursor are no longer retained; reload the thread",
        }
        return gap_frame(run_id, gap) + _named(b"error", error)


RUN: Final = Framing()
LANGGRAPH: Final = LangGraphFraming()
