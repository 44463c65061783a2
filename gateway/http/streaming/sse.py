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

What each item looks like on the wire, and how a response ends when no item ended it, is
the `Framing` the route passes in (`framing.py`; one per stream kind, under
`gateway/http/framings/`); what the response reports is the `StreamObserver` it passes in
(`observer.py`). The response itself never changes with the kind of stream.

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

Observability: the observer (`observer.py`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from enum import Enum, StrEnum
from typing import Any, Final, Generic

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from ...bridge.base import close_subscription
from ...errors import BackendUnavailable, BridgeClosed, TooManyStreams
from ...timing.send_watch import SendWatch
from ...values import StreamEvent, StreamGap
from ..edge.errors import handled_error_response, public_detail
from ..edge.observe import body_send, record_of
from .framing import Closing, Framing, ItemT, Steps
from .observer import StreamObserver
from .subscriptions import READER_KEY, SubscriptionRegistry

SSE_HEADERS: Final[tuple[tuple[bytes, bytes], ...]] = (
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
)
COALESCE_BYTES: Final = 64 * 1024
SEND_TIMEOUT: Final = 30.0


class SSEResponse(Response, Generic[ItemT]):
    """ASGI response streaming one subscription as SSE (a `Response` only for routing).

    `steps` (a subscription: batches of the stream's items) is called once the response
    has started; `None` means the stream is already known to be over and only
    `final_frame` is written. `framing` says what each item is on the wire and how the
    response ends otherwise; `observer` reports it (metrics, logs, resume counts).
    `track` is the run the subscription registry counts the stream under (None for a
    session feed, whose runs change). `expires_at` (unix seconds): the reader's token
    expires then, and the response ends like a drain, with the framing's last frame.
    """

    def __init__(
        self,
        *,
        steps: Steps[ItemT] | None,
        framing: Framing[ItemT],
        observer: StreamObserver,
        registry: SubscriptionRegistry,
        track: str | None,
        final_frame: bytes = b"",
        extra_headers: tuple[tuple[bytes, bytes], ...] = (),
        send_timeout: float = SEND_TIMEOUT,
        expires_at: float | None = None,
    ) -> None:
        self.status_code = 200
        self.background = None
        self._steps = steps
        self._framing = framing
        self._observer = observer
        self._registry = registry
        self._track = track
        self._final_frame = final_frame
        self._sse_headers = SSE_HEADERS + extra_headers
        self._send_timeout = send_timeout
        self._expires_at = expires_at

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        record = record_of(scope)
        reader: str | None = scope.get(READER_KEY)
        # (a stream that is over at once needs no share)
        if self._steps is not None and await self._over_share(scope, receive, send, reader):
            return
        with self._registry.track(self._track, "sse", reader):
            await send(
                {"type": "http.response.start", "status": 200, "headers": list(self._sse_headers)}
            )
            self._observer.started(
                None if record is None else record.request_id, streaming=self._steps is not None
            )
            if self._steps is None:
                outcome = Outcome.SEND_TIMEOUT
                with anyio.move_on_after(self._send_timeout):
                    body = self._framing.opening() + self._final_frame
                    await send({"type": "http.response.body", "body": body, "more_body": False})
                    self._observer.wrote(len(body), 0, None)
                    outcome = Outcome.END
                if record is not None:
                    record.outcome, record.events_delivered = outcome, 0
                return
            stream = _Stream(self._send_timeout, asyncio.current_task())
            try:
                await self._serve(receive, send, self._steps, stream)
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

    async def _serve(
        self, receive: Receive, send: Send, steps: Steps[ItemT], stream: _Stream
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
        batches = steps()
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
                self._observer.send_timed_out()
            elif stream.stopped is Stop.DISCONNECT:
                stream.outcome = Outcome.DISCONNECT

    async def _watch_disconnect(self, receive: Receive, stream: _Stream) -> None:
        while True:
            message: Message = await receive()
            if message["type"] == "http.disconnect":
                stream.stop(Stop.DISCONNECT)
                return

    async def _pump(
        self, batches: AsyncIterator[Sequence[ItemT]], send: Send, stream: _Stream
    ) -> None:
        """Read a batch, write it; until a terminal item, a drain or a backend failure.
        The one write loop of every SSE stream, whatever its framing."""
        framing = self._framing
        while True:
            if stream.draining:
                if stream.expired:
                    frame = framing.closing(Closing.TOKEN_EXPIRED, "")
                    await self._last_frame(send, stream, frame, Outcome.TOKEN_EXPIRED)
                else:
                    frame = framing.closing(Closing.SHUTDOWN, "")
                    await self._last_frame(send, stream, frame, Outcome.DRAIN)
                return
            stream.state = StreamState.READING
            try:
                batch = await anext(batches)
            except StopAsyncIteration:  # bridges end with a terminal item; end cleanly anyway
                await self._last_frame(send, stream, b"", Outcome.END)
                return
            except (BackendUnavailable, BridgeClosed, OSError) as exc:
                self._observer.unavailable(exc)
                # what a client may see of it: never the server's address
                frame = framing.closing(Closing.UNAVAILABLE, public_detail(exc))
                await self._last_frame(send, stream, frame, Outcome.UNAVAILABLE)
                return
            finally:
                stream.state = StreamState.BUSY
            if await self._write_batch(send, stream, batch):
                return
            del batch  # (not held while the next is awaited: a replay, till a heartbeat)

    async def _write_batch(self, send: Send, stream: _Stream, batch: Sequence[ItemT]) -> bool:
        """Write one batch as one write (split at `COALESCE_BYTES`); True when a terminal
        item ended the stream."""
        observer, framing = self._observer, self._framing
        first = batch[0]
        observer.first_item(first)
        if len(batch) == 1 and isinstance(first, StreamEvent):  # a live reader's usual batch
            frame = framing.frame(first)
            if frame:
                await self._write(send, stream, frame, 1, first.id, more=True)
            return False
        terminal = framing.terminal
        chunks: list[bytes] = []
        size = events = 0
        last_id: str | None = None
        for item in batch:
            frame = framing.frame(item)
            if isinstance(item, terminal):  # the last item, and the response's last write
                chunks.append(frame)
                if isinstance(item, StreamGap):
                    observer.gap(item)
                    stream.outcome = Outcome.GAP
                else:
                    stream.outcome = Outcome.END
                await self._write(send, stream, b"".join(chunks), events, last_id, more=False)
                return True
            if not frame:
                continue  # not for this kind of stream
            if isinstance(item, StreamEvent):
                events += 1
                last_id = item.id
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
        if outcome is Outcome.DRAIN:
            self._observer.drained()
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
        stream.sent += delivered
        self._observer.wrote(len(body), delivered, last_id)


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
