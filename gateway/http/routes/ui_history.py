"""`GET /v1/sessions/{session_id}/ui-messages?limit=50`: a chat's history for the AI SDK.

The session's turns as `UIMessage[]` (a bare JSON array, what `useChat({messages})`
takes), shaped by `gateway.sessions.ui_messages` from the turns reader
(`SessionStore.list_turns`, the same `limit`: 1..200 turns, default 50, the newest ones,
oldest first). Access is the turns reader's: an API key (or open mode), or a subscriber
token whose claims name the session (403 otherwise). An unknown or retired session is
`[]`. The END error of a turn that ended otherwise than `success` comes from its run
record (`bridge.get_run`), one read per such turn.
"""

from __future__ import annotations

from typing import Any, Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ...names import check_session_id
from ...sessions.ui_messages import needs_error, ui_messages
from ..edge import access
from ..openapi import SESSION_ERRORS, Operation, Reply, document
from ..responses import json_response
from ..schemas import LimitQuery, UIMessage
from ..state import gateway_state


@document(
    Operation(
        "The session's turns as AI SDK `UIMessage[]`, to restore a chat",
        "subscriber",
        {
            200: Reply(
                "The messages, oldest first (`[]`: unknown or retired)", UIMessage, array=True
            )
        },
        SESSION_ERRORS,
        query=LimitQuery,
    )
)
async def list_ui_messages(request: Request) -> Response:
    principal = access.subscriber(request)
    session_id = check_session_id(request.path_params["session_id"])
    principal.check_session(session_id)
    limit = LimitQuery.parse(request.query_params).limit
    state = gateway_state(request)
    turns = await state.sessions.list_turns(session_id, limit)
    running = await state.sessions.running_turn(session_id) if turns else None
    errors: dict[str, Any] = {}
    for turn in turns:
        if needs_error(turn):
            info = await state.bridge.get_run(str(turn["run_id"]))
            if info is not None and info.error is not None:
                errors[info.run_id] = info.error
    return json_response(ui_messages(turns, running, errors))


routes: Final = [Route("/v1/sessions/{session_id}/ui-messages", list_ui_messages, methods=["GET"])]
