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
from typing import Final

from starlette.requests import Request
from starlette.responses import Response

from ...names import check_session_id
from ...values import StreamGap, StreamItem
from ..edge import access
from ..edge.routing import SSERoute
from ..framings.ui_messages import UI_MESSAGES, UI_STREAM_HEADER
from ..openapi import STREAM_ERRORS, Operation, Reply, document
from ..state import gateway_state
from ..streaming.framing import Steps
from ..streaming.observer import StreamObserver
from ..streaming.sse import SSEResponse

# A cursor before any event id: the replay starts at the first event, or is a gap.
BEFORE_FIRST_EVENT: Final = "0-0"


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
    steps: Steps[StreamItem] | None = functools.partial(
        state.bridge.subscribe_batches, info.run_id, BEFORE_FIRST_EVENT
    )
    final_frame = b""
    if info.ended and not info.log_exists:  # nothing left to replay from the start
        gone = StreamGap(BEFORE_FIRST_EVENT, None, None, "stream_removed")
        steps, final_frame = None, UI_MESSAGES.frame(gone)
    return SSEResponse(
        steps=steps,
        framing=UI_MESSAGES,
        observer=StreamObserver(state.metrics, run_id=info.run_id),
        registry=state.subscriptions,
        track=info.run_id,
        final_frame=final_frame,
        extra_headers=(UI_STREAM_HEADER,),
        send_timeout=state.settings.sse_send_timeout_seconds,
        expires_at=principal.expires_at,  # it ends when the reader's token expires
    )


routes: Final = [SSERoute("/v1/sessions/{session_id}/ui-stream", ui_stream)]
