"""Encoding of SSE frames (docs/protocol.md §4), as bytes ready for the socket.

A data event's payload is the compact JSON the bridge encoded once at publish
(`StreamEvent.data`); it is written as is, never decoded and re-encoded. Only `id:`
lines belong to data events: `end`, `gap` and `unavailable` frames carry none, so a
client's reconnect cursor always points at a real event.
"""

from __future__ import annotations

import random
from typing import Any, Final

import orjson

from ..values import End, StreamEvent, StreamGap

HEARTBEAT_FRAME: Final = b": heartbeat\n\n"
SHUTDOWN_FRAME: Final = b": shutdown, reconnect with Last-Event-ID\n\n"

# The retry hint is jittered per connection so a deploy does not cause a reconnect storm.
RETRY_MIN_MS: Final = 1000
RETRY_MAX_MS: Final = 3000


def retry_frame(rng: random.Random | None = None) -> bytes:
    ms = (rng or random).randint(RETRY_MIN_MS, RETRY_MAX_MS)
    return b"retry: %d\n\n" % ms


def event_frame(item: StreamEvent) -> bytes:
    """The event's frame, built on first use and kept on the (shared) event."""
    frame = item.wire
    if frame is None:
        frame = item.wire = _event_frame(item)
    return frame


def _event_frame(item: StreamEvent) -> bytes:
    data = item.data
    if b"\n" in data or b"\r" in data:  # never from orjson; keep the frame intact anyway
        data = b"\ndata: ".join(data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n"))
    return b"id: %s\nevent: %s\ndata: %s\n\n" % (item.id.encode(), item.event.encode(), data)


def _named(event: bytes, payload: Any) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (event, orjson.dumps(payload))


def end_frame(end: End) -> bytes:
    payload: dict[str, Any] = {"status": end.status}
    if end.error is not None:
        payload["error"] = end.error
    return _named(b"end", payload)


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
    return _named(b"gap", gap_payload(run_id, gap))


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
