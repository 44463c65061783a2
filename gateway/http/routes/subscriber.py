"""Subscriber routes: run status, the SSE stream, `/wait` for END, and cancel requests.

Readers authenticate first (401 before anything about a run is revealed), then the run
is looked up (404 unknown, 403 when the credentials do not cover it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Final

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ...bridge.base import close_subscription
from ...cursor import MalformedCursor, parse_cursor
from ...errors import BridgeClosed, Forbidden, GatewayError, RunNotFound
from ...names import check_run_id
from ...values import End, RunInfo, StreamEvent, StreamGap, StreamItem
from ..edge import access
from ..edge.auth import Principal
from ..edge.bodies import require_json
from ..edge.routing import SSERoute
from ..framings.run import RunFraming
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
from ..schemas import (
    CancelAccepted,
    CancelRequest,
    Run,
    StreamQuery,
    WaitDone,
    WaitQuery,
    WaitRunning,
)
from ..state import GatewayState, gateway_state
from ..streaming.frames import TERMINAL_CURSORS
from ..streaming.framing import Framing, Steps
from ..streaming.observer import ResumeStart, StreamObserver
from ..streaming.sse import SSEResponse

DEFAULT_WAIT_SECONDS: Final = 30.0
MAX_WAIT_SECONDS: Final = 300.0


async def lookup(state: GatewayState, principal: Principal, run_id: str) -> RunInfo:
    """The run record, if the reader may see it: 404 unknown, 403 not covered."""
    return readable(principal, run_id, await state.bridge.get_run(run_id))


def readable(principal: Principal, run_id: str, info: RunInfo | None) -> RunInfo:
    """`info` if the reader may see the run: 404 unknown, 403 not covered."""
    if info is None:
        if principal.may_read_run(run_id, None):
            raise RunNotFound(f"run {run_id} not found")
        raise Forbidden("this token does not grant access to this run")
    access.reader_of(principal, info)
    return info


def cursor_of(request: Request) -> str | None:
    """The reconnect cursor: `Last-Event-ID` header, else the `last_event_id` parameter."""
    header = request.headers.get("last-event-id")
    if header is not None:
        return header
    return request.query_params.get("last_event_id")


def sse_response(
    request: Request,
    state: GatewayState,
    info: RunInfo,
    extra_headers: tuple[tuple[bytes, bytes], ...] = (),
    framing_of: Callable[[str], Framing[StreamItem]] = RunFraming,
    expires_at: float | None = None,
    subscribe: Steps[StreamItem] | None = None,
) -> Response:
    """The SSE response for a run the reader may see (docs/protocol.md §4).

    A cursor that is a terminal frame's id (`end`, `gap`) comes from a client that
    reconnected only because the response ended after that frame: 204, which tells a
    WHATWG `EventSource` to stop reconnecting. It has already seen the frame.
    `expires_at` (unix seconds): the reader's token expires then, and the response ends
    cleanly at that moment so the client reconnects with a fresh token and its cursor.
    `subscribe`: the subscription `bridge.open_stream` gave with `info` (by default one
    from the cursor is made here).
    """
    cursor = cursor_of(request)
    if cursor in TERMINAL_CURSORS:
        return Response(status_code=204)
    resume = _resume_start(cursor)
    framing = framing_of(info.run_id)
    observer = StreamObserver(state.metrics, run_id=info.run_id, resume=resume)
    steps, final_frame = subscribe, b""
    if info.ended and not info.log_exists and resume != "cursor":
        # The log is gone and the record knows how it ended. A valid cursor goes to the
        # bridge instead: one before the run's last event missed events (a gap).
        steps, final_frame = None, framing.frame(End(info.status, info.error))  # type: ignore[arg-type]
    elif steps is None:
        steps = functools.partial(state.bridge.subscribe_batches, info.run_id, cursor)
    return SSEResponse(
        steps=steps,
        framing=framing,
        observer=observer,
        registry=state.subscriptions,
        track=info.run_id,
        final_frame=final_frame,
        extra_headers=extra_headers,
        send_timeout=state.settings.sse_send_timeout_seconds,
        expires_at=expires_at,
    )


def _resume_start(cursor: str | None) -> ResumeStart:
    """How the reader starts, for `gateway_sse_resumes_total` (docs/operations.md)."""
    if cursor is None:
        return "from_start"
    try:
        parse_cursor(cursor)
    except MalformedCursor:
        return "malformed_cursor"
    return "cursor"


@document(Operation("The run record", "subscriber", {200: Reply("The run", Run)}, READER_ERRORS))
async def get_run(request: Request) -> Response:
    principal = access.subscriber(request)
    state = gateway_state(request)
    info = await lookup(state, principal, check_run_id(request.path_params["run_id"]))
    return json_response(Run.of(info))


@document(
    Operation(
        "Follow the run as Server-Sent Events",
        "subscriber",
        {200: SSE, 204: TERMINAL_CURSOR},
        STREAM_ERRORS,
        query=StreamQuery,
        headers=(LAST_EVENT_ID,),
    )
)
async def stream_run(request: Request) -> Response:
    principal = access.subscriber(request)
    state = gateway_state(request)
    run_id = check_run_id(request.path_params["run_id"])
    # The record and the subscription's first read in one round trip on Redis: a resume
    # on a gateway that never saw the run costs one (docs/architecture.md, step 4).
    found, subscribe = await state.bridge.open_stream(run_id, cursor_of(request))
    info = readable(principal, run_id, found)
    return sse_response(request, state, info, expires_at=principal.expires_at, subscribe=subscribe)


@document(
    Operation(
        "Ask the producer to stop (seen in its next write or lease reply)",
        "subscriber",
        {202: Reply("Cancel requested", CancelAccepted)},
        (*READER_ERRORS, 415),
        body=CancelRequest,
    )
)
async def cancel_run(request: Request) -> Response:
    principal = access.subscriber(request)
    require_json(request)  # no body, but never a request a web page may send unasked
    state = gateway_state(request)
    info = await lookup(state, principal, check_run_id(request.path_params["run_id"]))
    await request_cancel(state, info.run_id)
    return json_response({"run_id": info.run_id, "cancel_requested": True}, 202)


async def request_cancel(state: GatewayState, run_id: str) -> None:
    """Flag the run; its producer sees `cancel_requested` in its next reply (404 gone)."""
    if not await state.bridge.request_cancel(run_id):
        raise RunNotFound(f"run {run_id} not found")


# ---------------------------------------------------------------------------------- /wait


async def _until_end(state: GatewayState, info: RunInfo) -> RunInfo:
    """Follow the run until END; the refreshed record of the ended run.

    After a gap the record is refreshed: an ended run whose log is
    gone completes; otherwise the wait resumes from the newest retained id.
    """
    bridge = state.bridge
    run_id = info.run_id
    cursor = info.last_event_id
    misses = 0
    while True:
        if info.ended and not info.log_exists:
            return info
        gap: StreamGap | None = None
        items = bridge.subscribe(run_id, cursor)
        try:
            async for item in items:
                if isinstance(item, StreamEvent):
                    cursor = item.id
                    misses = 0
                elif isinstance(item, End):
                    fresh = await bridge.get_run(run_id)
                    if fresh is not None and fresh.ended:
                        return fresh
                    return _ended(info, item, cursor)
                elif isinstance(item, StreamGap):
                    gap = item
                    break
        finally:
            await close_subscription(items)
        if gap is not None and gap.reason == "bridge_closed":
            raise BridgeClosed("the stream bridge closed")
        fresh = await bridge.get_run(run_id)
        if fresh is None:
            raise RunNotFound(f"run {run_id} not found")
        info, cursor = fresh, fresh.last_event_id
        if info.ended and info.log_exists:
            continue  # the retained log ends: the next subscription reaches END at once
        misses += 1
        await anyio.sleep(min(state.settings.heartbeat_interval_seconds, 0.05 * 2**misses))


def _ended(info: RunInfo, end: End, cursor: str | None) -> RunInfo:
    return replace(info, status=end.status, error=end.error, last_event_id=cursor)


@document(
    Operation(
        "Block until the run's END, or until the timeout",
        "subscriber",
        {
            200: Reply("The run ended", WaitDone),
            202: Reply("Still running at the timeout (or the gateway drains)", WaitRunning),
        },
        STREAM_ERRORS,
        query=WaitQuery,
    )
)
async def wait_run(request: Request) -> Response:
    principal = access.subscriber(request)
    state = gateway_state(request)
    run_id = check_run_id(request.path_params["run_id"])
    timeout = min(WaitQuery.parse(request.query_params).timeout, MAX_WAIT_SECONDS)
    info = await lookup(state, principal, run_id)
    done = await await_end(request, state, principal, info, timeout)
    if done is None:
        return json_response({"status": "running"}, 202)
    return json_response({"status": done.status, "last_event_id": done.last_event_id})


async def await_end(
    request: Request, state: GatewayState, principal: Principal, info: RunInfo, within: float
) -> RunInfo | None:
    """The ended run's record once `info`'s run ends; None after `within` s, when the
    client leaves or when the gateway drains. Counts as a wait of the reader's share."""
    if info.ended:
        return info
    run_id = info.run_id
    outcome: list[RunInfo] = []
    failure: list[GatewayError] = []

    async def follow(scope: anyio.CancelScope) -> None:
        try:
            outcome.append(await _until_end(state, info))
        except GatewayError as exc:  # re-raised below, outside the task group
            failure.append(exc)
        scope.cancel()

    async def watch_disconnect_or_drain(scope: anyio.CancelScope) -> None:
        async with anyio.create_task_group() as inner:
            inner.start_soon(_disconnected, request, inner.cancel_scope)
            await state.subscriptions.wait_draining()
            inner.cancel_scope.cancel()
        scope.cancel()

    state.subscriptions.admit(principal.share_key)  # 429 at its share; tracked at once
    with (
        state.subscriptions.track(run_id, "wait", principal.share_key),
        anyio.move_on_after(within),
    ):
        async with anyio.create_task_group() as tg:
            tg.start_soon(follow, tg.cancel_scope)
            tg.start_soon(watch_disconnect_or_drain, tg.cancel_scope)
    if failure:
        raise failure[0]
    return outcome[0] if outcome else None


async def _disconnected(request: Request, scope: anyio.CancelScope) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


routes: Final = [
    Route("/v1/runs/{run_id}", get_run, methods=["GET"]),
    SSERoute("/v1/runs/{run_id}/stream", stream_run),
    Route("/v1/runs/{run_id}/wait", wait_run, methods=["GET"]),
    Route("/v1/runs/{run_id}/cancel", cancel_run, methods=["POST"]),
]
