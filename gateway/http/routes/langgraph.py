"""LangGraph-compatible routes, so the `langgraph-sdk` `runs.join_stream` can reattach.

- `GET /threads/{session_id}/runs/{run_id}/stream` (and `/join`): the same SSE as
  `/v1/runs/{run_id}/stream`, with `Location: <root>/threads/{sid}/runs/{rid}/stream`.
  The SDK remembers that Location; after a dropped connection (or a stream that closes
  without an `end`/`error` event, e.g. on a gateway restart) it asks
  `GET /threads/{sid}/runs/{rid}` and, while the status is `pending`/`running`,
  reconnects to the Location with `Last-Event-ID`.
- `GET /threads/{session_id}/runs/{run_id}`: `{run_id, thread_id, status}` in LangGraph's
  vocabulary: `running` while live; after END `success`, `error` or `interrupted`
  (`cancelled` → `interrupted`, `producer_lost` → `error`).
- `POST /threads/{session_id}/runs/{run_id}/cancel`: the SDK's `runs.cancel`, the same
  request as `POST /v1/runs/{run_id}/cancel` (the producer sees `cancel_requested`).
  The SDK posts it with no body and no `Content-Type`; that is accepted only from a
  client that sends no `Origin` header (browsers always send one on a `POST`), so a web
  page still cannot cancel runs unasked. `wait=1` (the SDK's `wait=True`) answers once
  the run has ended (200 with its LangGraph status; 202 if it still runs after
  `MAX_WAIT_SECONDS`, as `/wait` does); `action` is accepted and ignored (the producer
  decides what stopping means).

The thread is the run's session: a run recorded under another session (or none) is a
404 on these paths. Query parameters the SDK adds (`stream_mode`,
`cancel_on_disconnect`) are accepted and ignored: a disconnect never cancels a run.
"""

from __future__ import annotations

from typing import Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ...errors import RunNotFound
from ...names import check_run_id, check_session_id
from ...values import RunInfo
from ..edge import access
from ..edge.auth import Principal
from ..edge.bodies import require_json
from ..edge.routing import SSERoute
from ..framings.langgraph import langgraph_framing
from ..openapi import (
    LAST_EVENT_ID,
    READER_ERRORS,
    SSE,
    STREAM_ERRORS,
    TERMINAL_CURSOR,
    Operation,
    Reply,
    document,
)
from ..responses import json_response
from ..schemas import CancelRequest, StreamQuery, ThreadCancelled, ThreadRun
from ..state import GatewayState, gateway_state
from .subscriber import MAX_WAIT_SECONDS, await_end, lookup, request_cancel, sse_response

LANGGRAPH_STATUS: Final[dict[str, str]] = {
    "running": "running",
    "success": "success",
    "error": "error",
    "interrupted": "interrupted",
    "cancelled": "interrupted",
    "producer_lost": "error",
}


async def _thread_run(request: Request, state: GatewayState) -> tuple[str, RunInfo, Principal]:
    principal = access.subscriber(request)
    session_id = check_session_id(request.path_params["session_id"])
    info = await lookup(state, principal, check_run_id(request.path_params["run_id"]))
    if info.session_id != session_id:
        raise RunNotFound(f"run {info.run_id} is not a run of thread {session_id}")
    return session_id, info, principal


@document(
    Operation(
        "The run's SSE at the langgraph-sdk join_stream path",
        "subscriber",
        {
            200: Reply(
                SSE.description,
                media="text/event-stream",
                headers={"Location": "…/threads/{session_id}/runs/{run_id}/stream"},
            ),
            204: TERMINAL_CURSOR,
        },
        STREAM_ERRORS,
        query=StreamQuery,
        headers=(LAST_EVENT_ID,),
        description="Extra query parameters the SDK sends (`stream_mode`, "
        "`cancel_on_disconnect`) are accepted and ignored.",
    )
)
async def join_stream(request: Request) -> Response:
    state = gateway_state(request)
    session_id, info, principal = await _thread_run(request, state)
    root = request.scope.get("root_path", "")
    location = f"{root}/threads/{session_id}/runs/{info.run_id}/stream"
    return sse_response(
        request,
        state,
        info,
        ((b"location", location.encode()),),
        langgraph_framing,
        expires_at=principal.expires_at,
    )


@document(
    Operation(
        "LangGraph-style run status (what langgraph-sdk polls after a drop)",
        "subscriber",
        {200: Reply("The run status", ThreadRun)},
        READER_ERRORS,
    )
)
async def thread_run_status(request: Request) -> Response:
    state = gateway_state(request)
    session_id, info, _ = await _thread_run(request, state)
    return json_response(
        {
            "run_id": info.run_id,
            "thread_id": session_id,
            "status": LANGGRAPH_STATUS.get(info.status, "error"),
        }
    )


@document(
    Operation(
        "Ask the producer to stop (langgraph-sdk `runs.cancel`)",
        "subscriber",
        {
            200: Reply("`wait=1`: the run has ended", ThreadCancelled),
            202: Reply("Cancel requested", ThreadCancelled),
        },
        (*READER_ERRORS, 415, 429),
        body=CancelRequest,
        description="The same request as `POST /v1/runs/{run_id}/cancel`. The SDK sends no "
        "body and no `Content-Type`: accepted when the request carries no `Origin` header "
        "(a browser always sends one). `wait=1` answers when the run has ended (200, with "
        "`status`), or 202 after 300 s; `action` is accepted and ignored.",
    )
)
async def cancel_thread_run(request: Request) -> Response:
    state = gateway_state(request)
    session_id, info, principal = await _thread_run(request, state)
    if "origin" in request.headers or "content-type" in request.headers:
        require_json(request)  # never a request a web page may send unasked
    await request_cancel(state, info.run_id)
    reply = {"run_id": info.run_id, "thread_id": session_id, "cancel_requested": True}
    if request.query_params.get("wait") not in ("1", "true"):
        return json_response(reply, 202)
    done = await await_end(request, state, principal, info, MAX_WAIT_SECONDS)
    if done is None:
        return json_response({**reply, "status": "running"}, 202)
    return json_response({**reply, "status": LANGGRAPH_STATUS.get(done.status, "error")})


routes: Final = [
    Route("/threads/{session_id}/runs/{run_id}", thread_run_status, methods=["GET"]),
    Route("/threads/{session_id}/runs/{run_id}/cancel", cancel_thread_run, methods=["POST"]),
    SSERoute("/threads/{session_id}/runs/{run_id}/stream", join_stream),
    SSERoute("/threads/{session_id}/runs/{run_id}/join", join_stream),
]
