"""Streamed appends (PROTOCOL 3.3): one `POST …/events` with an `application/x-ndjson`
body for a whole turn, one event a line, acknowledged as it goes.

One task serves the request, in a loop: it takes what the body brought since it last
asked (uvicorn keeps the bytes that arrive meanwhile, up to its high-water mark, then
stops reading the socket: TCP backpressure reaches the producer), splits it into lines,
checks each one as a batch's event is checked (`producer.parse_line`: JSON, name, size),
and appends them in `publish_many` calls of up to `max_batch_events` lines, writing one
ack line after each, `{"ids", "next_seq"?, "cancel_requested"}`. Lines that arrive while
an append is in flight are therefore in the next one (group commit), and a lone line is
appended at once (no linger timer). A client that stops reading acks stops the loop
(nothing is buffered without bound), and a write pending for the send timeout drops it
(the loop's `SendWatch`, as for SSE).

The response ends with `{"done": true, "count", "last_id"}` when the body ends, or with
one error line `{"error", "detail", "applied", "next_seq"?}`: every line before the one
that failed was appended, that one and every later one were not. Numbered streams
(`X-Producer-Seq` numbers the first line) get 3.1's rules per append, so a producer that
reconnects and resends from its first unacknowledged number duplicates nothing.

The per-line path takes no timer, no task hand-off and no cancel scope of its own: one
task (a line handed from a reader task to an appender task cost a wake-up, an event and
a scheduling pass per line, about a tenth of the CPU per token at 100 tokens/s), one
cancel scope for the whole body (the drain and the idle limit cancel it), and the idle
limit is one timer re-armed lazily (`_arm_idle`).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import anyio
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ...errors import (
    BodyIdle,
    BridgeClosed,
    GatewayError,
    Overloaded,
    PayloadTooLarge,
    SequenceRefused,
    TooManyStreams,
)
from ...settings import STREAM_LINE_ENVELOPE_BYTES
from ...timing.send_watch import SendWatch
from ..edge.errors import HttpError, gateway_error_response, public_detail
from ..edge.observe import body_send
from ..state import GatewayState

MEDIA_TYPE: Final = "application/x-ndjson"
HEADERS: Final[tuple[tuple[bytes, bytes], ...]] = (
    (b"content-type", MEDIA_TYPE.encode()),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),  # nginx: pass each ack on as it is written
)
# A line holds the payload plus its envelope (`{"event": <≤64 chars>, "data": …}`): room
# for that envelope and some whitespace on top of the payload limit.
LINE_ENVELOPE_BYTES: Final = STREAM_LINE_ENVELOPE_BYTES


# A checked line: (event name, payload encoded once as values.RawJSON), as
# `publish_many` takes it.
_Line = tuple[str, Any]


@dataclass(slots=True)
class _Failed:
    error: GatewayError | HttpError


_DISCONNECTED: Final = _Failed(BridgeClosed("the client left"))  # (never written)
_DRAINED: Final = _Failed(BridgeClosed("(draining)"))  # (replaced before it is written)


@dataclass(slots=True)
class _Tally:
    """What this request has acknowledged (the `done` and error lines report it): `count`
    lines acknowledged (an error line's `applied`), `appended` of them appended by this
    request (the `done` line's `count`: a resent line applied before is acknowledged again,
    not appended again)."""

    count: int = 0
    appended: int = 0
    last_id: str | None = None
    next_seq: int | None = None


@contextlib.contextmanager
def stream_slot(state: GatewayState, key: str) -> Iterator[None]:
    """One of the key's `max_append_streams_per_key` slots, held while the stream is open."""
    open_now = state.append_streams.get(key, 0)
    limit = state.settings.max_append_streams_per_key
    if open_now >= limit:
        raise TooManyStreams(
            f"at most {limit} streamed appends may be open per API key; end one or send batches"
        )
    state.append_streams[key] = open_now + 1
    try:
        yield
    finally:
        left = state.append_streams[key] - 1
        if left:
            state.append_streams[key] = left
        else:
            del state.append_streams[key]


class AppendStreamResponse(Response):
    """The ASGI response of a streamed append (a `Response` only for routing).

    It starts with the checks that can still answer with a plain 4xx (the per-key limit,
    the token and lease, renewed here to learn the lease's length), then streams.
    """

    def __init__(
        self,
        *,
        request: Request,
        state: GatewayState,
        run_id: str,
        token: str,
        seq: int | None,
        parse: Callable[[bytes], tuple[str, Any]],
        holder: str,
    ) -> None:
        self.status_code = 200
        self._holder = holder  # whose `max_append_streams_per_key` this stream counts against
        self._parse = parse  # one line → (name, encoded payload), or a 4xx error
        self.background = None
        self._request = request
        self._state = state
        self._run_id = run_id
        self._token = token
        self._tally = _Tally(next_seq=seq)
        settings = state.settings
        self._line_limit = settings.max_event_bytes + LINE_ENVELOPE_BYTES
        self._group_limit = settings.max_batch_events
        self._budget = settings.max_inflight_append_bytes  # the process's, `_hold`
        self._held = 0  # bytes of the budget this stream holds (received, not appended)
        self._send_timeout = settings.sse_send_timeout_seconds
        self._idle = settings.lease_seconds
        self._last_write = time.monotonic()
        self._loop = asyncio.get_running_loop()
        self._scope = anyio.CancelScope()  # the stream's: cancelled by the send timeout
        self._read_scope = anyio.CancelScope()  # the body's: cancelled on drain or when idle
        self._receiving_since: float | None = None  # loop time a receive() began
        self._idle_handle: asyncio.TimerHandle | None = None
        self._idle_fired = False
        self._draining = False
        self._watch = SendWatch.of(self._loop)
        self._mark = secrets.token_hex(8)  # this stream, to the backend (`cut_lease`)
        self._body_broke = False  # the connection broke before the body's end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = self._state
        try:
            with stream_slot(state, self._holder):
                # Not started without room for one largest line in the budget.
                if state.append_bytes + self._line_limit > self._budget:
                    await gateway_error_response(self._overloaded())(scope, receive, send)
                    return
                try:
                    # the run's current stream: only its drop may cut the lease (`_dropped`)
                    lease = await state.bridge.renew_lease(
                        self._run_id, producer_token=self._token, stream=self._mark
                    )
                except GatewayError as exc:  # fenced, ended: a plain 409, nothing streamed
                    await gateway_error_response(exc)(scope, receive, send)
                    return
                # The body may stay silent for as long as the lease it would keep alive.
                self._idle = max(0.1, lease.lease_expires_at - time.time())
                self._last_write = time.monotonic()
                start = {"type": "http.response.start", "status": 200, "headers": list(HEADERS)}
                await send(start)
                await self._stream(receive, body_send(send))  # (acks: one call less)
        except TooManyStreams as exc:
            await gateway_error_response(exc)(scope, receive, send)

    async def _stream(self, receive: Receive, send: Send) -> None:
        remove = self._state.subscriptions.on_drain(self._drain)
        self._arm_idle(self._idle)
        try:
            with self._scope:
                ended: _Failed | None = None
                with self._read_scope:
                    ended = await self._take_body(receive, send)
                if ended is _DISCONNECTED:
                    # the client left: nothing more can be acknowledged. If its connection
                    # broke mid-body, its producer may be gone: `producer_lost` follows
                    # unless it writes again within the grace (liveness.DropWatch).
                    if self._body_broke and self._state.drops is not None:
                        self._state.drops.dropped(
                            self._run_id, self._token, self._mark, self._tally.last_id
                        )
                    return
                if self._idle_fired:
                    ended = _Failed(
                        BodyIdle(
                            f"the body sent nothing for {self._idle:g} s (the lease); "
                            "send a blank line to keep an idle stream open"
                        )
                    )
                elif ended is _DRAINED or self._read_scope.cancelled_caught:
                    # Shutting down: the lines appended so far stay, and the producer is
                    # told to go on elsewhere from `next_seq`.
                    ended = _Failed(
                        BridgeClosed("the gateway is shutting down; send the rest again")
                    )
                if ended is not None:
                    last = self._error_line(ended.error)
                else:
                    tally = self._tally
                    done = {"done": True, "count": tally.appended, "last_id": tally.last_id}
                    last = orjson.dumps(done) + b"\n"
                await self._send(send, last, more=False)
        finally:
            remove()
            if self._idle_handle is not None:
                self._idle_handle.cancel()
            self._release(self._held)

    def _hold(self, size: int) -> bool:
        """Take `size` bytes of the process's budget for streamed appends, or refuse."""
        state = self._state
        if state.append_bytes + size > self._budget:
            return False
        state.append_bytes += size
        self._held += size
        return True

    def _release(self, size: int) -> None:
        self._state.append_bytes -= size
        self._held -= size

    def _overloaded(self) -> Overloaded:
        return Overloaded(
            f"the gateway holds {self._budget} bytes of streamed lines not yet appended "
            "(max_inflight_append_bytes); send the rest again shortly"
        )

    def _drain(self) -> None:
        """The gateway is shutting down: the body is read no further. A wait for the
        client is interrupted at once; an append in flight is finished and acknowledged
        first (nothing interrupts an append, so it needs no shield of its own)."""
        self._draining = True
        if self._receiving_since is not None:
            self._read_scope.cancel()

    def _arm_idle(self, delay: float) -> None:
        self._idle_handle = self._loop.call_later(delay, self._check_idle)

    def _check_idle(self) -> None:
        """The idle timer: fires the idle limit only while the loop waits for the client
        (not while it appends or writes: that is the gateway's delay, or the client's
        acks)."""
        since = self._receiving_since
        left = self._idle if since is None else since + self._idle - self._loop.time()
        if left > 0:
            self._arm_idle(left)
            return
        self._idle_fired = True
        self._read_scope.cancel()

    async def _take_body(self, receive: Receive, send: Send) -> _Failed | None:
        """Read, check and append the body's lines in order, an ack after each append;
        None when the body ended, or the failure that ends the stream (a bad line, a
        refused append, the client gone)."""
        partial = bytearray()
        group: list[_Line] = []
        limit = self._group_limit
        # (the last chunk, line and payload are let go before waiting for the next chunk:
        # a stream waiting for its producer holds only its partial line)
        chunk = line = b""
        pieces: list[bytes] = []
        payload: Any = None
        while True:
            if self._draining:
                return _DRAINED
            # What this stream holds of the budget: the line still arriving (`partial`).
            self._release(self._held - len(partial))
            chunk = line = b""
            pieces, payload = [], None
            self._receiving_since = self._loop.time()
            message = await receive()
            self._receiving_since = None
            if message["type"] == "http.disconnect":
                self._body_broke = True  # (a disconnect after the whole body is never read)
                return _DISCONNECTED
            chunk = message.get("body", b"")
            more = bool(message.get("more_body", False))
            if not self._hold(len(chunk)):  # the process holds its budget's worth of lines
                return _Failed(self._overloaded())
            pieces = chunk.split(b"\n")
            if not more and pieces[-1] == b"" and not partial:
                pieces.pop()
            failed: _Failed | None = None
            for index, piece in enumerate(pieces):
                if more and index == len(pieces) - 1:
                    partial += piece  # the rest of this line comes in a later chunk
                    if len(partial) > self._line_limit:
                        failed = _Failed(self._too_large(len(partial)))
                    break
                if partial:
                    partial += piece
                    line = bytes(partial)
                    partial.clear()
                else:
                    line = piece
                if len(line) > self._line_limit:
                    failed = _Failed(self._too_large(len(line)))
                    break
                if not line.strip():
                    if not group:  # the producer is alive (a write renews the lease anyway)
                        failed = await self._keep_alive()
                        if failed is not None:
                            break
                    continue
                try:
                    name, payload = self._parse(line)
                except (GatewayError, HttpError) as exc:
                    failed = _Failed(exc)
                    break
                line = b""
                group.append((name, payload))
                if len(group) >= limit:
                    failed = await self._commit(group, send)
                    group = []
                    if failed is not None:
                        return failed
                    if self._draining:  # the lines after these are not appended
                        return _DRAINED
            if group:  # every line before a bad one is appended, then the error is told
                refused = await self._commit(group, send)
                group = []
                if refused is not None:
                    return refused
            if failed is not None:
                return failed
            if not more:
                return None

    async def _keep_alive(self) -> _Failed | None:
        """A blank line: renew the lease, unless a write did within a third of it."""
        if time.monotonic() - self._last_write < self._idle / 3:
            return None
        try:
            with anyio.CancelScope(shield=True):
                await self._state.bridge.renew_lease(
                    self._run_id, producer_token=self._token, stream=self._mark
                )
        except GatewayError as exc:
            return _Failed(exc)
        self._last_write = time.monotonic()
        return None

    async def _commit(self, group: list[_Line], send: Send) -> _Failed | None:
        """Append one group; its ack line, or the failure that ends the stream."""
        state = self._state
        tally = self._tally
        if self._scope.cancel_called:  # dropped by the send timeout: append nothing more
            return _DISCONNECTED
        try:
            # Never interrupted: the body's scope is cancelled only while the loop waits
            # for the client (`_drain`, `_check_idle`), and the stream's only while it
            # writes (`send_timed_out`), so once sent an append finishes (its turn record
            # is written in the same step) within the bridge's own timeouts. (A shield
            # would cost a cancel scope per append: a twentieth of a token's CPU.)
            result = await state.bridge.publish_many(
                self._run_id, group, producer_token=self._token, seq=tally.next_seq
            )
            if result.appended:
                state.metrics.events_published.inc(result.appended)
        except GatewayError as exc:
            return _Failed(exc)
        self._last_write = time.monotonic()
        tally.count += len(result.ids)
        tally.appended += result.appended
        tally.last_id = result.ids[-1]
        ack: dict[str, Any] = {"ids": list(result.ids)}
        if tally.next_seq is not None:
            tally.next_seq += len(result.ids)
            ack["next_seq"] = tally.next_seq
        ack["cancel_requested"] = result.cancel_requested
        await self._send(send, orjson.dumps(ack, option=orjson.OPT_APPEND_NEWLINE), more=True)
        return None

    def _error_line(self, exc: GatewayError | HttpError) -> bytes:
        body: dict[str, Any]
        if isinstance(exc, HttpError):
            body = {"error": exc.code, "detail": exc.detail}
        else:
            body = {"error": exc.code, "detail": public_detail(exc), **exc.details()}
        body["applied"] = self._tally.count
        if self._tally.next_seq is not None:
            expected = exc.expected if isinstance(exc, SequenceRefused) else None
            body["next_seq"] = expected if expected is not None else self._tally.next_seq
        return orjson.dumps(body) + b"\n"

    def _too_large(self, size: int) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"a line of {size}+ bytes; the limit is {self._line_limit} "
            f"(max_event_bytes + {LINE_ENVELOPE_BYTES})"
        )

    # -- writing (the send timeout is the loop's SendWatch, one timer for all) --------

    async def _send(self, send: Send, body: bytes, *, more: bool) -> None:
        self._watch.begin(self)
        try:
            await send({"type": "http.response.body", "body": body, "more_body": more})
        finally:
            self._watch.end(self)

    @property
    def timeout(self) -> float:
        return self._send_timeout

    def send_timed_out(self) -> None:
        """A write pending for the send timeout: a client that stopped reading, dropped."""
        self._scope.cancel()


def is_streamed(request: Request) -> bool:
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    return media_type == MEDIA_TYPE
