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
the Redis bridge's command client, `MemorySessionStore` beside the memory bridge. Hooks
for the producer routes (`record_claim`, `record_events`, `record_end`) never fail a
producer's write: the run log is the source of truth, and a failed turn update is
logged, not raised (raising after the bridge accepted the write would make the producer
retry and duplicate).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import GatewayError
from ..names import check_session_id
from ..sessions.base import SessionStore, parse_flag, parse_limit
from ..sessions.turns import touches_turn
from ..values import EndStatus
from . import access
from .responses import json_response
from .state import gateway_state

log = logging.getLogger(__name__)


def session_store(request: Request) -> SessionStore:
    """The app's session store (built beside the bridge when the app starts)."""
    return gateway_state(request).sessions


# -- hooks for the producer routes --------------------------------------------------------


async def record_claim(
    request: Request, session_id: str | None, run_id: str, input_message: Any
) -> None:
    """After a successful claim with a session: open (or keep) the turn."""
    if session_id is not None:
        await _quietly(
            "start_turn",
            session_store(request).start_turn(session_id, run_id, input_message, time.time()),
        )


async def record_events(
    request: Request, session_id: str | None, run_id: str, events: Sequence[tuple[str, Any]]
) -> None:
    """After the bridge accepted event(s) of a run recorded under `session_id`.

    Batches with no event a turn folds in cost the store nothing (no read, no write).
    """
    if session_id is not None and touches_turn(events):
        await _quietly(
            "apply_events",
            session_store(request).apply_events(session_id, run_id, list(events), time.time()),
        )


async def record_end(
    request: Request, session_id: str | None, run_id: str, status: EndStatus
) -> None:
    """After an END (the producer's, or a recovery END) of a run under `session_id`."""
    if session_id is not None:
        await _quietly(
            "end_turn", session_store(request).end_turn(session_id, run_id, status, time.time())
        )


async def _quietly(what: str, operation: Any) -> None:
    # Runs after the bridge applied the write: whatever happens here, the producer's
    # request succeeds (an error would make it retry and duplicate).
    try:
        await operation
    except GatewayError as exc:
        log.warning("session turn %s failed: %s", what, exc)
    except Exception:
        log.exception("session turn %s failed", what)


# -- routes ---------------------------------------------------------------------------------


async def list_sessions(request: Request) -> Response:
    principal = access.subscriber(request)
    limit = parse_limit(request.query_params.get("limit"))
    parked = parse_flag(request.query_params.get("parked"), "parked")
    store = session_store(request)
    if principal.full_access:
        rows = await store.list_sessions(limit, parked)
    else:
        rows = (await store.session_rows(principal.sessions, parked))[:limit]
    return json_response({"sessions": rows})


async def list_turns(request: Request) -> Response:
    principal = access.subscriber(request)
    session_id = check_session_id(request.path_params["session_id"])
    principal.check_session(session_id)
    limit = parse_limit(request.query_params.get("limit"))
    turns = await session_store(request).list_turns(session_id, limit)
    return json_response({"turns": turns})


async def delete_session(request: Request) -> Response:
    access.operator(request)
    session_id = check_session_id(request.path_params["session_id"])
    raw = request.query_params.get("retire")
    retire = True if raw is None else parse_flag(raw, "retire")
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
