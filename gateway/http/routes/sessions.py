"""Session routes (docs/protocol.md §6) and the hooks the producer routes call to record turns.

    GET    /v1/sessions?limit=50&parked=true     subscriber  {"sessions": [rows]}
    GET    /v1/sessions/{session_id}/turns?limit  subscriber  {"turns": [records]}
    DELETE /v1/sessions/{session_id}?retire=true  operator    {"session_id", "retired",
                                                               "removed_runs": [ids]}

Readers: an API key (or open mode) lists every session; a subscriber token lists only
the sessions its claims name, and reads the turns of those only (403 otherwise).
`limit` is 1..200 (default 50); anything else is a 4xx (`invalid_input`). A retired
session reads as empty (`{"turns": []}`), never as an error that reveals it existed.

`DELETE` defaults to `retire=true` (the irreversible one; pass `retire=false` to clear).
It removes the turns, then the run logs of those turns (`bridge.cleanup`). A clear while
a turn is running answers 409 `session_active`.

The store lives beside the bridge (`gateway.sessions.provider`): `RedisSessionStore` on
the Redis bridge's command client, `MemorySessionStore` beside the memory bridge. The turn
records are written by the bridge, in the same atomic step as the claim, append or END
they reflect (docs/protocol.md §6): the producer routes have nothing to add.
"""

from __future__ import annotations

import logging
from typing import Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ...names import check_session_id
from ...sessions.base import SessionStore
from ..edge import access
from ..openapi import SESSION_ERRORS, Operation, Reply, document
from ..responses import json_response
from ..schemas import (
    DeleteSessionQuery,
    LimitQuery,
    SessionDeleted,
    SessionList,
    SessionsQuery,
    TurnList,
)
from ..state import gateway_state

log = logging.getLogger(__name__)


def session_store(request: Request) -> SessionStore:
    """The app's session store (built beside the bridge when the app starts)."""
    return gateway_state(request).sessions


# -- routes ---------------------------------------------------------------------------------


@document(
    Operation(
        "The session index, newest first (a scoped token: the sessions it names)",
        "subscriber",
        {200: Reply("The sessions", SessionList)},
        SESSION_ERRORS,
        query=SessionsQuery,
    )
)
async def list_sessions(request: Request) -> Response:
    principal = access.subscriber(request)
    query = SessionsQuery.parse(request.query_params)
    limit, parked = query.limit, query.parked
    store = session_store(request)
    if principal.full_access:
        rows = await store.list_sessions(limit, parked)
    else:
        rows = (await store.session_rows(principal.sessions, parked))[:limit]
    return json_response({"sessions": rows})


@document(
    Operation(
        "A session's turns, the newest `limit` of them, oldest first",
        "subscriber",
        {200: Reply("The turns (none for an unknown or retired session)", TurnList)},
        SESSION_ERRORS,
        query=LimitQuery,
    )
)
async def list_turns(request: Request) -> Response:
    principal = access.subscriber(request)
    session_id = check_session_id(request.path_params["session_id"])
    principal.check_session(session_id)
    limit = LimitQuery.parse(request.query_params).limit
    turns = await session_store(request).list_turns(session_id, limit)
    return json_response({"turns": turns})


@document(
    Operation(
        "Retire a session (or clear its turns) and remove its runs' logs",
        "operator",
        {200: Reply("What was removed", SessionDeleted)},
        (*SESSION_ERRORS, 409),
        query=DeleteSessionQuery,
    )
)
async def delete_session(request: Request) -> Response:
    access.operator(request)
    session_id = check_session_id(request.path_params["session_id"])
    retire = DeleteSessionQuery.parse(request.query_params).retire
    state = gateway_state(request)
    run_ids = await session_store(request).delete_session(session_id, retire)
    for run_id in run_ids:
        await state.bridge.cleanup(run_id)
    return json_response({"session_id": session_id, "retired": retire, "removed_runs": run_ids})


routes: Final = [
    Route("/v1/sessions", list_sessions, methods=["GET"]),
    Route("/v1/sessions/{session_id}/turns", list_turns, methods=["GET"]),
    Route("/v1/sessions/{session_id}", delete_session, methods=["DELETE"]),
]
