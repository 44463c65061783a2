"""The session feed route: `GET /v1/sessions/{session_id}/stream`, one SSE response that
follows every turn of a session (the turn order and rules: `gateway.sessions.feed`).

Frames (every one carries a session cursor as its `id:`, `gateway.sessions.cursor`):

    id: r1/0-0         event: turn       data: {"run_id", "input_message", "created_at"}
    id: r1/<event id>  event: <name>     data: the run's payload, byte for byte
    id: r1/end         event: turn_end   data: {"run_id", "status"[, "error"]}
    id: r1/gap         event: gap        data: the run gap payload + "session_id"; ends
    id: retired        event: end        data: {"status": "retired", "session_id"}; ends
    : heartbeat        between turns too

A reconnect with `Last-Event-ID` (or `?last_event_id=`) resumes after that frame. One
with a `gap` or `retired` cursor is a client reconnecting only because the feed ended:
204, which tells an `EventSource` to stop. A malformed cursor is a 422 before the stream
starts. Readers: an API key, open mode, or a subscriber token whose `sessions` claim
names the session (a token scoped to runs only is a 403).

The response is the run stream's (`sse.SSEResponse`: disconnect watcher, drain, send
timeout, coalesced writes) with its own framing; while it follows a turn, that turn's
run is watched by the liveness monitor like any run with a reader here. A feed opened
with a token ends when the token expires, as the run stream does (its last frame the
`token expired` comment; the client reconnects with a fresh token and its cursor).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator, Callable
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ...names import check_session_id
from ...sessions.cursor import RETIRED as RETIRED_CURSOR
from ...sessions.cursor import TURN_START, SessionCursor, parse_session_cursor
from ...sessions.feed import FeedStep, Retired, TurnOpened, follow_session
from ...values import End, Heartbeat, StreamEvent, StreamGap, encode_json
from ..edge import access
from ..edge.observe import record_of
from ..edge.routing import SSERoute
from ..openapi import LAST_EVENT_ID, SSE, STREAM_ERRORS, Operation, Reply, document
from ..responses import no_content
from ..schemas import StreamQuery
from ..state import GatewayState, gateway_state
from ..streaming.frames import HEARTBEAT_FRAME, event_frame, gap_payload
from ..streaming.sse import COALESCE_BYTES, Outcome, SSEResponse, _Stream
from ..streaming.subscriptions import READER_KEY, SubscriptionRegistry
from .subscriber import cursor_of

Follow = Callable[[Callable[[str | None], None]], AsyncGenerator[FeedStep, None]]


def _frame(cursor: bytes, event: bytes, payload: Any) -> bytes:
    # the one encoder: no frame carries a raw U+2028, U+2029 or U+0085 (values.py)
    return b"id: %s\nevent: %s\ndata: %s\n\n" % (cursor, event, encode_json(payload))


def turn_frame(opened: TurnOpened) -> bytes:
    payload = {
        "run_id": opened.run_id,
        "input_message": opened.input_message,
        "created_at": opened.created_at,
    }
    return _frame(f"{opened.run_id}/{TURN_START}".encode(), b"turn", payload)


def turn_end_frame(run_id: str, end: End) -> bytes:
    payload: dict[str, Any] = {"run_id": run_id, "status": end.status}
    if end.error is not None:
        payload["error"] = end.error
    return _frame(f"{run_id}/end".encode(), b"turn_end", payload)


def feed_gap_frame(session_id: str, run_id: str, gap: StreamGap) -> bytes:
    payload = {**gap_payload(run_id, gap), "session_id": session_id}
    return _frame(f"{run_id}/gap".encode(), b"gap", payload)


def retired_frame(session_id: str) -> bytes:
    payload = {"status": "retired", "session_id": session_id}
    return _frame(RETIRED_CURSOR.encode(), b"end", payload)


def feed_event_frame(run_id: bytes, item: StreamEvent) -> bytes:
    """The run stream's frame of the event (built once, shared) with a session cursor."""
    return b"id: %s/%s" % (run_id, event_frame(item)[4:])


def feed_unavailable_frame(session_id: str, detail: str) -> bytes:
    payload = {
        "code": "backend_unavailable",
        "session_id": session_id,
        "detail": detail,
        "recovery": "reconnect",
    }
    return b"event: unavailable\ndata: %s\n\n" % encode_json(payload)


class SessionFeedResponse(SSEResponse):
    """`SSEResponse` over a session feed rather than one run (same lifecycle)."""

    def __init__(
        self,
        *,
        session_id: str,
        follow: Follow,
        registry: SubscriptionRegistry,
        send_timeout: float,
        metrics: Any = None,
        expires_at: float | None = None,
    ) -> None:
        super().__init__(
            run_id=session_id,
            subscribe=None,
            registry=registry,
            send_timeout=send_timeout,
            metrics=metrics,
            expires_at=expires_at,
        )
        self.session_id = session_id
        self._follow = follow
        self._watched: str | None = None

    def _on_turn(self, run_id: str | None) -> None:
        """The run the feed follows now (None: between turns): liveness watches it."""
        if self._watched is not None:
            self._registry.unwatch_run(self._watched)
        self._watched = run_id
        if run_id is not None:
            self._registry.watch_run(run_id)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        record = record_of(scope)
        self._request_id = None if record is None else record.request_id
        reader: str | None = scope.get(READER_KEY)
        if await self._over_share(scope, receive, send, reader):
            return
        with self._registry.track(None, "sse", reader):
            await send(
                {"type": "http.response.start", "status": 200, "headers": list(self._sse_headers)}
            )
            stream = _Stream(self._send_timeout, asyncio.current_task())
            try:
                await self._serve(
                    receive,
                    send,
                    lambda: self._follow(self._on_turn),  # type: ignore[arg-type, return-value]
                    stream,
                )
            finally:
                self._on_turn(None)
                if record is not None:
                    record.outcome, record.events_delivered = stream.outcome, stream.sent

    def _unavailable_frame(self, detail: str) -> bytes | None:
        return feed_unavailable_frame(self.session_id, detail)

    async def _write_batch(  # type: ignore[override]
        self, send: Send, stream: _Stream, batch: FeedStep
    ) -> bool:
        """Write one step of the feed (the run it is in, its items); True when it ended
        the feed. Its `End` is a turn's end (`turn_end`), not the response's."""
        run_id, items = batch
        chunks: list[bytes] = []
        size = events = 0
        last_id: str | None = None
        run = (run_id or "").encode()
        for item in items:
            if isinstance(item, StreamEvent):
                frame = feed_event_frame(run, item)
                events += 1
                last_id = item.id
            elif isinstance(item, Heartbeat):
                frame = HEARTBEAT_FRAME
            elif isinstance(item, TurnOpened):
                frame = turn_frame(item)
            elif isinstance(item, End):
                frame = turn_end_frame(run_id or "", item)
            else:  # StreamGap or RETIRED: the feed's last write
                if isinstance(item, Retired):
                    chunks.append(retired_frame(self.session_id))
                    stream.outcome = Outcome.END
                else:
                    assert isinstance(item, StreamGap)
                    chunks.append(feed_gap_frame(self.session_id, run_id or "", item))
                    self._gap_served(item, run_id or "", self.session_id)
                    stream.outcome = Outcome.GAP
                await self._write(send, stream, b"".join(chunks), events, last_id, more=False)
                return True
            chunks.append(frame)
            size += len(frame)
            if size >= COALESCE_BYTES:
                await self._write(send, stream, b"".join(chunks), events, last_id, more=True)
                chunks, size, events, last_id = [], 0, 0, None
        if chunks:
            await self._write(send, stream, b"".join(chunks), events, last_id, more=True)
        return False


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
        _follow, state, session_id, cursor, state.settings.heartbeat_interval_seconds
    )
    return SessionFeedResponse(
        session_id=session_id,
        follow=follow,
        registry=state.subscriptions,
        send_timeout=state.settings.sse_send_timeout_seconds,
        metrics=state.metrics,
        expires_at=principal.expires_at,  # the feed ends when the reader's token does
    )


def _follow(
    state: GatewayState,
    session_id: str,
    cursor: SessionCursor | None,
    heartbeat_interval: float,
    on_turn: Callable[[str | None], None],
) -> AsyncGenerator[FeedStep, None]:
    return follow_session(
        state.bridge, state.sessions, session_id, cursor, heartbeat_interval, on_turn
    )


routes: Final = [
    SSERoute("/v1/sessions/{session_id}/stream", stream_session),
]
