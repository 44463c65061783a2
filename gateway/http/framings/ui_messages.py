"""The AI SDK UI message stream's framing (`GET /v1/sessions/{session_id}/ui-stream`).

UI message chunks only: each event named `ui` (its data one UI message chunk, as the
producer published it) is one `data:` line, byte for byte; events of other names are
left out. END `success` is `data: [DONE]`; any other END, and a gap, is an `error` chunk
(which the SDK surfaces as the chat's error). No `retry:` hint (the SDK does not
reconnect by itself), and every other ending is a dropped connection: the SDK sees an
interrupted stream, which the app resumes, never a finished answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, assert_never

from ...sessions.turns import UI_CHUNK_EVENT
from ...values import End, Heartbeat, StreamEvent, StreamGap, StreamItem
from ..streaming.frames import HEARTBEAT_FRAME, frame, json_frame
from ..streaming.framing import Closing
from .run import TERMINAL

UI_STREAM_HEADER: Final = (b"x-vercel-ai-ui-message-stream", b"v1")
DONE_FRAME: Final = frame(b"[DONE]")


def error_chunk(text: str) -> bytes:
    return json_frame(None, {"type": "error", "errorText": text})


def end_text(end: End) -> str:
    text = f"the turn ended: {end.status}"
    error: Any = end.error
    message = error.get("message") if isinstance(error, dict) else None
    if isinstance(message, str) and message:
        text += f" ({message})"
    return text


def gap_chunk(gap: StreamGap) -> bytes:
    return error_chunk(f"the turn's events are no longer retained ({gap.reason}); reload the chat")


@dataclass(frozen=True, slots=True)
class UIMessageFraming:
    @property
    def terminal(self) -> tuple[type, ...]:
        return TERMINAL

    def opening(self) -> bytes:
        return b""

    def frame(self, item: StreamItem) -> bytes:
        match item:
            case StreamEvent():
                data = item.data
                if item.event != UI_CHUNK_EVENT or b"\n" in data or b"\r" in data:
                    return b""  # (a line break never comes from the bridge's encoder)
                return frame(data)
            case Heartbeat():
                return HEARTBEAT_FRAME
            case End():
                return DONE_FRAME if item.status == "success" else error_chunk(end_text(item))
            case StreamGap():
                return gap_chunk(item)
            case _:
                assert_never(item)

    def closing(self, why: Closing, detail: str) -> bytes | None:
        return None  # an interrupted stream: the page resumes it


UI_MESSAGES: Final = UIMessageFraming()
