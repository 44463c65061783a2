"""The SSE response: a lean ASGI streaming response over one bridge subscription.

Why not sse-starlette's `EventSourceResponse`: it formats one `ServerSentEvent` per
send (payloads as `str`, re-encoded), which defeats writing the producer's pre-encoded
bytes untouched and coalescing ready frames into one write; and its shutdown handling
monkey-patches uvicorn process-wide. This response keeps its behaviours:

- no-buffering headers (`Cache-Control: no-cache, no-transform`, `X-Accel-Buffering: no`,
  no `Connection` header), `Content-Type: text/event-stream; charset=utf-8`;
- pings: the bridge yields a heartbeat after `heartbeat_interval_seconds` idle, written
  as the comment `: heartbeat`;
- a send timeout: a client that stops reading for `send_timeout` seconds is dropped;
- prompt disconnect detection: `receive()` is watched by a task beside the stream, so a
  disconnect stops the subscription at once (not at the next heartbeat write) and every
  resource is freed;
- graceful shutdown: when the registry drains (server exit), the bridge subscription is
  stopped, frames already read are flushed, and the response ends cleanly so clients
  reconnect with `Last-Event-ID` after the jittered `retry:` hint (or, where the
  `Framing` says so, the AI SDK's ui-stream, ends incomplete: a dropped connection,
  which that client resumes instead of reading it as a finished answer).

What each item looks like on the wire is the response's `Framing` (`frames.py`).

One task reads and writes: it takes the bridge's items in batches (`subscribe_batches`:
everything ready at once) and writes each batch as one `send` (split at
`COALESCE_BYTES`), so a burst reaches the socket as one write per wake-up rather than one
per event, and no hand-off between tasks is paid per event. When the client is slow the
`send` waits (the server's flow control) and the task stops reading, so the subscription
falls behind inside the bridge's retention (and gets a gap only if it falls out of it)
without ever stalling the producer.

What may interrupt the task depends on where it is (`StreamState`, kept on
`_Stream.state`). An interruption is `_Stream.stop(Stop...)`: a `Task.cancel()` that
`_serve` tells apart from a cancellation from outside, which it re-raises.

    state    the task is                      stopped by             moves on
    BUSY     framing a batch or sending it    send timeout,          to READING when it asks
             (its first state)                disconnect             the bridge for a batch
    READING  waiting in the bridge            disconnect, drain      to BUSY when a batch comes,
                                              (a token expiry too)   the bridge ends or fails,
                                                                     or a drain is taken
    CLOSING  in `_serve`'s cleanup: closing   nothing                never: the response returns
             the subscription (shielded)

Any state moves to CLOSING when `_serve` leaves its loop. A drain that comes while BUSY
only sets `draining`: the shutdown frame is written before the next read. What ended the
response (`Outcome`, the request log line's `outcome`) is set along the way.

A subscriber-side backend failure ends the response with an `unavailable` frame (no
`id:`), never touching the producer. A disconnect never cancels the producer either.

Observability (docs/operations.md): with `metrics`, each write adds its bytes to
`gateway_sse_bytes_out_total` and, when it carries events, their count to
`gateway_events_delivered_total` and one delivery-lag observation (the newest event of
the write); the resume outcome, gaps and drains are counted once per response. The
stream outcome and events delivered go to the request log line (`observe`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from enum import Enum, StrEnum
from typing import Any, Final, Literal

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from ...bridge.base import close_subscription
from ...errors import BackendUnavailable, BridgeClosed, TooManyStreams
from ...timing.send_watch import SendWatch
from ...values import End, Heartbeat, StreamEvent, StreamGap, StreamItem
from ..edge.errors import handled_error_response, public_detail
from ..edge.observe import body_send, lifecycle, record_of
from ..metrics import Metrics, ResumeOutcome
from .frames import RUN, Framing
from .subscriptions import READER_KEY, SubscriptionRegistry

log = logging.getLogger(__name__)

SSE_HEADERS: Final[tuple[tuple[bytes, bytes], ...]] = (
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
)
COALESCE_BYTES: Final = 64 * 1024
SEND_TIMEOUT: Final = 30.0

Subscribe = Callable[[], AsyncGenerator[Sequence[StreamItem], None]]
# How the reader asked to start: no cursor, a malformed one, or a valid one (whose
# outcome, exact or a gap, is known at the subscription's first item).
ResumeStart = Literal["from_start", "malformed_cursor", "cursor"]


class SSEResponse(Response):
    """ASGI response streaming one subscription as SSE (a `Response` only for routing).

    `subscribe` (a `subscribe_batches` call) is made once the response has started;
    `None` means the stream is already known to be over and only `final_frame` (an `end`
    frame) is written. `on_delivered(n)` is told how many data events each write carried.
    `metrics` and `resume` feed the metrics (see the module doc); both are optional.
    """

    def __init__(
        self,
        *,
        run_id: str,
        subscribe: Subscribe | None,
        registry: SubscriptionRegistry,
        final_frame: bytes = b"",
        extra_headers: tuple[tuple[bytes, bytes], ...] = (),
        on_delivered: Callable[[int], None] | None = None,
        send_timeout: float = SEND_TIMEOUT,
        metrics: Metrics | None = None,
        resume: ResumeStart | None = None,
        expires_at: float | None = None,
        framing: Framing = RUN,
    ) -> None:
        self.run_id = run_id
        self.status_code = 200
        self.background = None
        self._subscribe = subscribe
        self._registry = registry
        self._final_frame = final_frame
        self._sse_headers = SSE_HEADERS + extra_headers
        self._on_delivered = on_delivered
        self._send_timeout = send_timeout
        self._metrics = metrics
        self._resume = resume
        self._count_first = resume == "cursor"  # a resume's outcome, from its first item
        self._expires_at = expires_at  # unix seconds: the reader's token expires then
        self._framing = framing
        self._request_id: str | None = None
        self._started_ms = 0.0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        record = record_of(scope)
        self._request_id = None if record is None else record.request_id
        self._started_ms = time.time() * 1000
        reader: str | None = scope.get(READER_KEY)
        # (an ended run's response is over at once: it needs no share)
        if self._subscribe is not None and await self._over_share(scope, receive, send, reader):
            return
        with self._registry.track(self.run_id, "sse", reader):
            await send(
                {"type": "http.response.start", "status": 200, "headers": list(self._sse_headers)}
            )
            if self._resume == "from_start":
                self._count_resume("from_start")
            elif self._resume == "malformed_cursor":
                self._count_resume("malformed_cursor")
            if self._subscribe is None:
                if self._resume == "cursor":
                    self._count_resume("exact")
                outcome = Outcome.SEND_TIMEOUT
                with anyio.move_on_after(self._send_timeout):
                    body = self._framing.opening() + self._final_frame
                    await send({"type": "http.response.body", "body": body, "more_body": False})
                    if self._metrics is not None:
                        self._metrics.bytes_out.inc(len(body))
                    outcome = Outcome.END
                if record is not None:
                    record.outcome, record.events_delivered = outcome, 0
                return
            stream = _Stream(self._send_timeout, asyncio.current_task())
            try:
                await self._serve(receive, send, self._subscribe, stream)
            finally:
                if record is not None:
                    record.outcome, record.events_delivered = stream.outcome, stream.sent

    async def _over_share(
        self, scope: Scope, receive: Receive, send: Send, reader: str | None
    ) -> bool:
        """Answer 429 (and say True) when `reader` already holds its share of the open
        streams. Admitted, it returns without suspending: the caller tracks the stream
        before any other request can be admitted."""
        try:
            self._registry.admit(reader)
        except TooManyStreams as exc:
            response = handled_error_response(Request(scope, receive), exc)
            assert response is not None  # a GatewayError always has an answer
            await response(scope, receive, send)
            return True
        return False

    def _count_resume(self, outcome: ResumeOutcome) -> None:
        if self._metrics is not None:
            self._metrics.resumes[outcome].inc()

    def _first_item(self, item: StreamItem) -> None:
        """Count a valid cursor's resume outcome from the subscription's first item."""
        if isinstance(item, StreamGap):
            if item.reason == "trimmed":
                self._count_resume("gap_trimmed")
            elif item.reason == "stream_removed":
                self._count_resume("gap_stream_removed")
            # bridge_closed: the gateway is shutting down; not a resume outcome
        else:
            self._count_resume("exact")

    async def _serve(
        self, receive: Receive, send: Send, subscribe: Subscribe, stream: _Stream
    ) -> None:
        """Stream in this task, with the disconnect watcher beside it.

        A bare asyncio task rather than an anyio task group: an idle stream is what a
        process holds thousands of. Drain is a registry callback, not a waiting task.
        Disconnect, drain and send timeout interrupt this task with `Task.cancel()`
        (`_Stream.stop`), which is told apart from a cancellation from outside.
        """
        send = body_send(send)  # (the response has started: only bodies are sent here)
        watcher = asyncio.get_running_loop().create_task(self._watch_disconnect(receive, stream))
        remove_drain = self._registry.on_drain(stream.drain)
        expiry = None
        if self._expires_at is not None:  # ends like a drain, with its own last frame
            delay = max(0.0, self._expires_at - time.time())
            expiry = asyncio.get_running_loop().call_later(delay, stream.expire)
        batches = subscribe()
        try:
            opening = self._framing.opening()
            if opening:
                await self._write(send, stream, opening, 0, None, more=True)
            while True:
                try:
                    await self._pump(batches, send, stream)
                    return
                except asyncio.CancelledError:
                    if not stream.interrupted():
                        raise  # not ours: the server is cancelling this request
                    if stream.stopped is not Stop.DRAIN:
                        return
                    # `_pump` sees `draining` first and ends with the shutdown frame, a
                    # write that may still time out or meet a disconnect.
                    stream.stopped = None
        except asyncio.CancelledError:
            if not stream.interrupted():  # (while the retry hint was being written)
                raise
        except OSError:  # the client went away mid-write (servers other than uvicorn)
            stream.outcome = Outcome.DISCONNECT
        finally:
            stream.state = StreamState.CLOSING  # nothing interrupts the cleanup
            remove_drain()
            if expiry is not None:
                expiry.cancel()
            watcher.cancel()
            # Close the bridge subscription (shielded) so every resource is freed when
            # the response returns.
            await close_subscription(batches)
            await asyncio.wait([watcher])
            if stream.stopped is Stop.SEND_TIMEOUT:
                stream.outcome = Outcome.SEND_TIMEOUT
                log.info("sse: client of run %s too slow to read; dropping it", self.run_id)
            elif stream.stopped is Stop.DISCONNECT:
                stream.outcome = Outcome.DISCONNECT

    async def _watch_disconnect(self, receive: Receive, stream: _Stream) -> None:
        while True:
            message: Message = await receive()
            if message["type"] == "http.disconnect":
                stream.stop(Stop.DISCONNECT)
                return

    async def _pump(self, batches: AsyncIterator[Any], send: Send, stream: _Stream) -> None:
        """Read a batch, write it; until a terminal item, a drain or a backend failure.

        The one write loop of every SSE stream: a run's (any `Framing`) and the session
        feed's, which differ only in how a batch becomes frames (`_write_batch`) and in
        the `unavailable` frame (`_unavailable_frame`).
        """
        while True:
            if stream.draining:
                if stream.expired:
                    frame = self._framing.token_expired()
                    await self._last_frame(send, stream, frame, Outcome.TOKEN_EXPIRED)
                else:
                    await self._last_frame(send, stream, self._framing.shutdown(), Outcome.DRAIN)
                return
            stream.state = StreamState.READING
            try:
                batch = await anext(batches)
            except StopAsyncIteration:  # bridges end with a terminal item; end cleanly anyway
                await self._last_frame(send, stream, b"", Outcome.END)
                return
            except (BackendUnavailable, BridgeClosed, OSError) as exc:
                self._unavailable(exc)
                # what a client may see of it: never the server's address
                frame = self._unavailable_frame(public_detail(exc))
                await self._last_frame(send, stream, frame, Outcome.UNAVAILABLE)
                return
            finally:
                stream.state = StreamState.BUSY
            if await self._write_batch(send, stream, batch):
                return
            del batch  # (not held while the next is awaited: a replay, till a heartbeat)

    def _unavailable_frame(self, detail: str) -> bytes | None:
        return self._framing.unavailable(self.run_id, detail)

    async def _write_batch(self, send: Send, stream: _Stream, batch: Sequence[StreamItem]) -> bool:
        """Write one batch of a run's items as one write; True when it ended the stream."""
        if self._count_first:
            self._count_first = False
            self._first_item(batch[0])
        framing = self._framing
        if len(batch) == 1 and type(batch[0]) is StreamEvent:  # a live reader's usual batch
            event = batch[0]
            frame = framing.event(event)
            if frame:
                await self._write(send, stream, frame, 1, event.id, more=True)
            return False
        chunks: list[bytes] = []
        size = events = 0
        last_id: str | None = None
        for item in batch:
            if isinstance(item, StreamEvent):
                frame = framing.event(item)
                if not frame:
                    continue  # not for this kind of stream
                events += 1
                last_id = item.id
            elif isinstance(item, Heartbeat):
                frame = framing.heartbeat()
            else:  # End or StreamGap: the last item, and the response's last write
                if isinstance(item, End):
                    chunks.append(framing.end(item))
                    stream.outcome = Outcome.END
                else:
                    chunks.append(framing.gap(self.run_id, item))
                    self._gap_served(item)
                    stream.outcome = Outcome.GAP
                await self._write(send, stream, b"".join(chunks), events, last_id, more=False)
                return True
            chunks.append(frame)
            size += len(frame)
            if size >= COALESCE_BYTES:
                await self._write(send, stream, b"".join(chunks), events, last_id, more=True)
                chunks, size, events, last_id = [], 0, 0, None
        if chunks:
            body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            await self._write(send, stream, body, events, last_id, more=True)
        return False

    async def _last_frame(
        self, send: Send, stream: _Stream, frame: bytes | None, outcome: Outcome
    ) -> None:
        """End the response with `frame`; None: leave it incomplete (the server drops
        the connection, which the framing's client reads as an interrupted stream)."""
        if outcome is Outcome.DRAIN and self._metrics is not None:
            self._metrics.drained.inc()
        stream.outcome = outcome
        if frame is None:
            return
        stream.state = StreamState.BUSY  # an interruption (drain) is over: this write may time out
        await self._write(send, stream, frame, 0, None, more=False)

    async def _write(
        self,
        send: Send,
        stream: _Stream,
        body: bytes,
        delivered: int,
        last_id: str | None,
        *,
        more: bool,
    ) -> None:
        await stream.send(send, body, more=more)
        metrics = self._metrics
        if metrics is not None:
            metrics.bytes_out.inc(len(body))
        if delivered:
            stream.sent += delivered
            if self._on_delivered is not None:
                self._on_delivered(delivered)
            if metrics is not None:
                metrics.delivered(delivered)
                if last_id is not None:
                    metrics.lag.observe(self._lag_seconds(last_id))

    def _unavailable(self, exc: Exception) -> None:
        if isinstance(exc, BridgeClosed):
            log.info("sse: run %s subscription ended: bridge closed", self.run_id)
            return
        if self._metrics is not None:
            self._metrics.unavailable("sse")
        lifecycle(
            "backend_unavailable",
            "sse subscription failed",
            level=logging.WARNING,
            route_kind="sse",
            run_id=self.run_id,
            request_id=self._request_id,
            error=type(exc).__name__,
        )

    def _gap_served(
        self, gap: StreamGap, run_id: str | None = None, session_id: str | None = None
    ) -> None:
        """Count the gap and log it, naming its run (this response's unless given) and,
        for a session feed, the session."""
        if self._metrics is not None:
            self._metrics.gaps[gap.reason].inc()
        lifecycle(
            "gap",
            "gap served",
            run_id=self.run_id if run_id is None else run_id,
            session_id=session_id,
            request_id=self._request_id,
            reason=gap.reason,
            requested_event_id=gap.requested_event_id,
            earliest_available_event_id=gap.earliest_available_event_id,
            latest_available_event_id=gap.latest_available_event_id,
        )

    def _lag_seconds(self, event_id: str) -> float:
        """Now minus the later of the event's publish time (its id's ms) and our start."""
        published_ms = float(event_id[: event_id.find("-")])
        lag_ms = time.time() * 1000 - max(published_ms, self._started_ms)
        return lag_ms / 1000 if lag_ms > 0 else 0.0


class Outcome(StrEnum):
    """What ended a response: the request log line's `outcome` (these exact strings)."""

    END = "end"  # the run's END, or a bridge that ended without one
    GAP = "gap"
    DISCONNECT = "disconnect"
    SEND_TIMEOUT = "send_timeout"
    DRAIN = "drain"
    TOKEN_EXPIRED = "token_expired"
    UNAVAILABLE = "unavailable"


class StreamState(Enum):
    """Where the streaming task is, which decides what may interrupt it (module doc)."""

    BUSY = "busy"  # framing or sending: a send timeout or a disconnect may stop it
    READING = "reading"  # waiting in the bridge: a disconnect or a drain may stop it
    CLOSING = "closing"  # cleaning up: nothing may


class Stop(Enum):
    """Why the streaming task was interrupted (`_Stream.stop`). Never logged as such: the
    response's outcome (`end`, `disconnect`, `send_timeout`, ...) is what reaches the
    request log and the metrics."""

    DISCONNECT = "disconnect"
    DRAIN = "drain"  # also a token expiry, which ends the response like a drain
    SEND_TIMEOUT = "send timeout"


# A stop whose cancellation was not delivered is repeated this often (seconds): one
# `Task.cancel()` is not enough on Python 3.11, where `asyncio.wait_for` (inside
# libraries) drops a cancellation that arrives as its inner task finishes.
INSIST_SECONDS: Final = 0.25


class _Stream:
    """State of one streaming response, and how others stop its task (single loop).

    `stop(reason)` cancels the task when it waits where `reason` applies, and repeats
    the cancellation until the task has taken it (a dropped cancellation must not leave
    a response streaming to nobody); the task then sees `stopped` set and ends the
    response accordingly. Every cancellation sent is counted and withdrawn when taken,
    so one from outside that arrives meanwhile is still seen and re-raised. Slotted, no
    closures: every open response holds one.
    """

    __slots__ = (
        "_cancels",
        "_task",
        "_watch",
        "draining",
        "expired",
        "outcome",
        "sent",
        "state",
        "stopped",
        "timeout",
    )

    def __init__(self, timeout: float, task: asyncio.Task[Any] | None) -> None:
        self.timeout = timeout
        self.stopped: Stop | None = None
        self.draining = False
        self.expired = False
        self.state = StreamState.BUSY
        self.outcome = Outcome.END  # what ended the response (for the request log line)
        self.sent = 0  # data events written
        self._task = task
        self._cancels = 0  # our cancellations of the task not yet withdrawn
        self._watch = SendWatch.of(asyncio.get_running_loop())

    async def send(self, send: Send, body: bytes, *, more: bool) -> None:
        self._watch.begin(self)
        try:
            await send({"type": "http.response.body", "body": body, "more_body": more})
        finally:
            self._watch.end(self)

    def send_timed_out(self) -> None:
        """The send in flight has been pending for `timeout` seconds (`SendWatch`)."""
        self.stop(Stop.SEND_TIMEOUT)

    def drain(self) -> None:
        """Server shutdown: end the response after the write in flight, or at once."""
        self.draining = True
        if self.state is StreamState.READING:
            self.stop(Stop.DRAIN)

    def expire(self) -> None:
        """The reader's token expired: end the response like a drain does."""
        self.expired = True
        self.drain()

    def interrupted(self) -> bool:
        """Whether the cancellation being handled is only our own `stop`s (then they are
        withdrawn); False when one came from outside too, which must propagate."""
        if self.stopped is None or self._task is None:
            return False
        while self._cancels:
            self._task.uncancel()
            self._cancels -= 1
        return self._task.cancelling() == 0

    def stop(self, reason: Stop) -> None:
        """Interrupt the task (disconnect, drain, send timeout) if `reason` applies now."""
        if self.stopped is not None or self._task is None or self.state is StreamState.CLOSING:
            return
        if reason is Stop.SEND_TIMEOUT and not self._watch.sending(self):
            return
        if reason is Stop.DRAIN and self.state is not StreamState.READING:
            return
        self.stopped = reason
        self._cancel()

    def _cancel(self) -> None:
        assert self._task is not None
        self._cancels += 1
        self._task.cancel()
        asyncio.get_running_loop().call_later(INSIST_SECONDS, self._insist)

    def _insist(self) -> None:
        """Cancel again if the last cancellation was not taken (see INSIST_SECONDS)."""
        task = self._task
        if (
            self._cancels
            and task is not None
            and not task.done()
            and self.state is not StreamState.CLOSING
        ):
            self._cancel()
