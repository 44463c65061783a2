"""The one SSE frame encoder (docs/protocol.md §4): every frame of every stream kind is
built here, as bytes ready for the socket.

A data event's payload is the compact JSON the bridge encoded once at publish
(`StreamEvent.data`); it is written as is, never decoded and re-encoded. Any other
payload goes through `values.encode_json`, so no frame carries a raw U+2028, U+2029 or
U+0085 that a line splitter could cut a `data:` line at.

Shapes chosen so that no parser hands an application an empty event (httpx-sse and
`@microsoft/fetch-event-source` dispatch one for any blank line, even after a lone
`retry:` or comment line): the `retry:` hint, heartbeats and the shutdown comment are
single lines *without* a blank line after them. A `retry:` line is applied by every
parser when it is read; a lone comment line is ignored; the next real frame's blank
line dispatches that frame only.

Which frames a stream writes for which item is its framing (`gateway/http/framings/`).
"""

from __future__ import annotations

import random
from typing import Any, Final

from ...values import StreamEvent, encode_json

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


def frame(data: bytes, event: bytes | None = None, event_id: bytes | None = None) -> bytes:
    """One frame: `id:` and `event:` lines when given, the data (one line), a blank line."""
    head = b"" if event_id is None else b"id: %s\n" % event_id
    if event is not None:
        head += b"event: %s\n" % event
    return b"%sdata: %s\n\n" % (head, _one_line(data))


def json_frame(event: bytes | None, payload: Any, event_id: str | None = None) -> bytes:
    """A frame whose data is `payload` as compact JSON (the U+2028 rule applied)."""
    return frame(encode_json(payload), event, None if event_id is None else event_id.encode())


def event_frame(item: StreamEvent) -> bytes:
    """The event's frame, built on first use and kept on the (shared) event: every reader
    of every framing that writes it as is shares the one copy."""
    wire = item.wire
    if wire is None:
        wire = item.wire = frame(item.data, item.event.encode(), item.id.encode())
    return wire


def _one_line(data: bytes) -> bytes:
    if b"\n" in data or b"\r" in data:  # never from orjson; keep the frame intact anyway
        data = b"\ndata: ".join(data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n"))
    return data
