"""The session feed route: `GET /v1/sessions/{session_id}/stream`, one SSE response that
follows every turn of a session (the turn order and rules: `gateway.sessions.feed`).

Its frames (`turn`, the runs' events, `turn_end`, and `gap` or the retired `end` last,
each with a session cursor as its id) are its framing's: `framings/session_feed.py`.

A reconnect with `Last-Event-ID` (or `?last_event_id=`) resumes after that frame. One
with a `gap` or `retired` cursor is a client reconnecting only because the feed ended:
204, which tells an `EventSource` to stop. A malformed cursor is a 422 before the stream
starts. Readers: an API key, open mode, or a subscriber token whose `sessions` claim
names the session (a token scoped to runs only is a 403).

The response is the run stream's (`sse.SSEResponse`: disconnect watcher, drain, send
timeout, coalesced writes) with that framing; while it follows a turn, that turn's
run is watched by the liveness monitor like any run with a reader here. A feed opened
with a token ends when the token expires, as the run stream does (its last frame the
`token expired` comment; the client reconnects with a fresh token and its cursor).
"""

from __future__ import annotations

import functools
from typing import Final

from starlette.requests import Request
from starlette.responses import Response

from ...names import check_session_id
from ...sessions.cursor import SessionCursor, parse_session_cursor
from ...sessions.feed import follow_session
from ..edge import access
from ..edge.routing import SSERoute
from ..framings.session_feed import SessionFeedFraming, feed_items
from ..openapi import LAST_EVENT_ID, SSE, STREAM_ERRORS, Operation, Reply, document
from ..responses import no_content
from ..schemas import StreamQuery
from ..state import GatewayState, gateway_state
from ..streaming.observer import StreamObserver
from ..streaming.sse import SSEResponse
from ..streaming.subscriptions import SubscriptionRegistry
from .subscriber import cursor_of


class _LivenessWatch:
    """Tells the subscription registry which run the feed follows now (None: between
    turns), so that the liveness monitor watches it like any run with a reader here."""

    __slots__ = ("_registry", "_watched")

    def __init__(self, registry: SubscriptionRegistry) -> None:
        self._registry = registry
        self._watched: str | None = None

    def __call__(self, run_id: str | None) -> None:
        if self._watched is not None:
            self._registry.unwatch_run(self._watched)
        self._watched = run_id
        if run_id is not None:
            self._registry.watch_run(run_id)


def feed_cursor(request: Request) -> SessionCursor | None:
    raw = cursor_of(request)
    if raw is None or raw == "":
        return None
    return parse_session_cursor(raw)


@document(
    Operation(
        "The session feed: one SSE response that follows every turn of a session",
        "subscriber",
        {
            200: Reply(
                "`turn`, the run's events, `turn_end` per turn; `gap` or `end` (retired) "
                "last; ids are session cursors",
                media=SSE.media,
            ),
            204: Reply("The cursor is a `gap` or `retired` id: stop reconnecting"),
        },
        STREAM_ERRORS,
        query=StreamQuery,
        headers=(LAST_EVENT_ID,),
    )
)
async def stream_session(request: Request) -> Response:
    principal = access.subscriber(request)
    session_id = check_session_id(request.path_params["session_id"])
    principal.check_session(session_id)
    cursor = feed_cursor(request)
    if cursor is not None and cursor.kind in ("gap", "retired"):
        return no_content()  # a reconnect only because the feed ended: stop
    state: GatewayState = gateway_state(request)
    follow = functools.partial(
        follow_session,
        state.bridge,
        state.sessions,
        session_id,
        cursor,
        state.settings.heartbeat_interval_seconds,
        _LivenessWatch(state.subscriptions),
    )
    framing = SessionFeedFraming(session_id)
    return SSEResponse(
        steps=lambda: feed_items(follow()),
        framing=framing,
        observer=StreamObserver(
            state.metrics, session_id=session_id, run_of=lambda: framing.run_id
        ),
        registry=state.subscriptions,
        track=None,
        send_timeout=state.settings.sse_send_timeout_seconds,
        expires_at=principal.expires_at,  # the feed ends when the reader's token does
    )


routes: Final = [
    SSERoute("/v1/sessions/{session_id}/stream", stream_session),
]
