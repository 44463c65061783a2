"""`GET /v1/sessions/{session_id}/ui-stream`: the running turn as an AI SDK UI message stream.

The resume endpoint of the AI SDK's `useChat({resume: true})`: point
`DefaultChatTransport`'s `prepareReconnectToStreamRequest` at it and the SDK needs
nothing else (docs/client.md).

- 204, no body, when the session has no running turn (an unknown or retired session
  too, for a reader allowed to ask about it; 403 for a token scoped elsewhere).
- Otherwise 200 `text/event-stream` with `x-vercel-ai-ui-message-stream: v1`, replaying
  the running turn from its first event: the SDK sends no cursor and rebuilds the
  message from the start. The producer publishes each UI message chunk as an event
  named `ui` (data: the chunk object); each is written as one `data:` line, byte for
  byte. Events of other names (`state`, `status`, ...) are left out.
- END `success`: `data: [DONE]`, then the end of the stream. Any other END status, and
  a gap, is an `error` chunk (`{"type": "error", "errorText": ...}`, which the SDK
  surfaces as the chat's error), then the end. A turn whose first events are no longer
  retained is a gap, never a partial message: the subscription starts at `0-0`, a
  cursor before every event, so the bridge reports anything trimmed before it.
- Graceful shutdown, a subscriber-side backend failure and the expiry of the reader's
  token end the response as a dropped connection (no final chunk): the SDK sees an
  interrupted stream, not a finished answer, and the app resumes it.
"""

from __future__ import annotations

import functools
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import Response

from ...names import check_session_id
from ...sessions.turns import UI_CHUNK_EVENT
from ...values import End, StreamEvent, StreamGap, encode_json
from ..edge import access
from ..edge.routing import SSERoute
from ..openapi import STREAM_ERRORS, Operation, Reply, document
from ..state import gateway_state
from ..streaming.frames import Framing
from ..streaming.sse import SSEResponse

UI_STREAM_HEADER: Final = (b"x-vercel-ai-ui-message-stream", b"v1")
DONE_FRAME: Final = b"data: [DONE]\n\n"
# A cursor before any event id: the replay starts at the first event, or is a gap.
BEFORE_FIRST_EVENT: Final = "0-0"


def _chunk(payload: dict[str, Any]) -> bytes:
    # the one encoder: no frame carries a raw U+2028, U+2029 or U+0085 (values.py)
    return b"data: %s\n\n" % encode_json(payload)


def error_chunk(text: str) -> bytes:
    return _chunk({"type": "error", "errorText": text})


class UIMessageFraming(Framing):
    """UI message chunks only: one `data:` line each, `[DONE]` or an `error` chunk last."""

    opening_retry = False  # the SDK does not reconnect by itself

    def event(self, item: StreamEvent) -> bytes:
        if item.event != UI_CHUNK_EVENT:
            return b""
        data = item.data
        if b"\n" in data or b"\r" in data:  # never from the bridge's encoder
            return b""
        return b"data: %s\n\n" % data

    def end(self, end: End) -> bytes:
        if end.status == "success":
            return DONE_FRAME
        text = f"the turn ended: {end.status}"
        message = end.error.get("message") if isinstance(end.error, dict) else None
        if isinstance(message, str) and message:
            text += f" ({message})"
        return error_chunk(text)

    def gap(self, run_id: str, gap: StreamGap) -> bytes:
        return error_chunk(
            f"the turn's events are no longer retained ({gap.reason}); reload the chat"
        )

    def unavailable(self, run_id: str, detail: str) -> bytes | None:
        return None

    def shutdown(self) -> bytes | None:
        return None

    def token_expired(self) -> bytes | None:
        return None  # an interrupted stream: the page resumes it (with a fresh token)


UI_MESSAGES: Final = UIMessageFraming()


@document(
    Operation(
        "The session's running turn as an AI SDK UI message stream (resume)",
        "subscriber",
        {
            200: Reply(
                "UI message chunks as `data:` lines, then `[DONE]` or an error chunk",
                media="text/event-stream",
                headers={"x-vercel-ai-ui-message-stream": "v1"},
            ),
            204: Reply("No running turn (also an unknown or retired session)"),
        },
        STREAM_ERRORS,
    )
)
async def ui_stream(request: Request) -> Response:
    principal = access.subscriber(request)
    session_id = check_session_id(request.path_params["session_id"])
    principal.check_session(session_id)
    state = gateway_state(request)
    run_id = await state.sessions.running_turn(session_id)
    info = None if run_id is None else await state.bridge.get_run(run_id)
    if info is None or info.session_id != session_id:
        return Response(status_code=204)
    access.reader_of(principal, info)
    common: dict[str, Any] = {
        "run_id": info.run_id,
        "registry": state.subscriptions,
        "extra_headers": (UI_STREAM_HEADER,),
        "metrics": state.metrics,
        "send_timeout": state.settings.sse_send_timeout_seconds,
        "framing": UI_MESSAGES,
    }
    if info.ended and not info.log_exists:  # nothing left to replay from the start
        gone = StreamGap(BEFORE_FIRST_EVENT, None, None, "stream_removed")
        return SSEResponse(subscribe=None, final_frame=UI_MESSAGES.gap(info.run_id, gone), **common)
    subscribe = functools.partial(state.bridge.subscribe_batches, info.run_id, BEFORE_FIRST_EVENT)
    # ends when the reader's token expires, as every stream does
    return SSEResponse(subscribe=subscribe, expires_at=principal.expires_at, **common)


routes: Final = [SSERoute("/v1/sessions/{session_id}/ui-stream", ui_stream)]
