"""Streamed appends (PROTOCOL 3.3): one `POST …/events` with an `application/x-ndjson`
body for a whole turn, one event a line, acknowledged as it goes.

Three tasks share the request, in one task group:

- the **reader** takes body chunks as they arrive, splits them into lines and checks
  each one as a batch's event is checked (`producer.parse_line`: JSON, name, size); the
  lines go into a bounded channel (`max_batch_events` lines), so a slow backend stops
  the reader and TCP backpressure reaches the producer;
- the **appender** takes every line waiting in that channel (up to `max_batch_events`)
  and appends them in one `publish_many` call: lines that arrive while an append is in
  flight go into the next one (group commit), and a lone line is appended at once (no
  linger timer);
- the **writer** sends one ack line per append, `{"ids", "next_seq"?, "cancel_requested"}`,
  joining the acks waiting into one write. The acks wait in a bounded channel, so a client
  that stops reading them stops the appender, then the reader (nothing is buffered without
  bound); a write pending for the send timeout drops the client.

The response ends with `{"done": true, "count", "last_id"}` when the body ends, or with
one error line `{"error", "detail", "applied", "next_seq"?}`: every line before the one
that failed was appended, that one and every later one were not. Numbered streams
(`X-Producer-Seq` numbers the first line) get 3.1's rules per append, so a producer that
reconnects and resends from its first unacknowledged number duplicates nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
import anyio.abc
import orjson
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from ..errors import (
    BodyIdle,
    BridgeClosed,
    GatewayError,
    PayloadTooLarge,
    SequenceRefused,
    TooManyAppendStreams,
)
from .errors import HttpError, gateway_error_response, public_detail
from .state import GatewayState

MEDIA_TYPE: Final = "application/x-ndjson"
HEADERS: Final[tuple[tuple[bytes, bytes], ...]] = (
    (b"content-type", MEDIA_TYPE.encode()),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),  # nginx: pass each ack on as it is written
)
# A line holds the payload plus its envelope (`{"event": <≤64 chars>, "data": …}`): room
# for that envelope and some whitespace on top of the payload limit.
LINE_ENVELOPE_BYTES: Final = 4096
ACKS_WAITING: Final = 16  # acks written-but-unsent before the appender waits for the writer


@dataclass(slots=True)
class _Line:
    name: str
    payload: Any  # values.RawJSON, encoded once
    data: Any  # the decoded value, for the session's turn record


@dataclass(slots=True)
class _Failed:
    error: GatewayError | HttpError


KEEPALIVE: Final = _Line("", None, None)  # a blank line, queued in its place
_DISCONNECTED: Final = _Failed(BridgeClosed("the client left"))  # (never written)


@dataclass(slots=True)
class _Tally:
    """What this request has acknowledged (the `done` and error lines report it)."""

    count: int = 0
    last_id: str | None = None
    next_seq: int | None = None
    started: float = field(default_factory=time.monotonic)


def stream_key(request: Request) -> bytes:
    """Whose limit an open stream counts against: a digest of the credential (the route
    authorised it already), so the table never holds a key itself."""
    credential = request.headers.get("authorization", "")
    return hashlib.sha256(credential.encode("utf-8", "surrogateescape")).digest()


@contextlib.contextmanager
def stream_slot(state: GatewayState, key: bytes) -> Iterator[None]:
    """One of the key's `max_append_streams_per_key` slots, held while the stream is open."""
    open_now = state.append_streams.get(key, 0)
    limit = state.settings.max_append_streams_per_key
    if open_now >= limit:
        raise TooManyAppendStreams(
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
        parse: Callable[[bytes], tuple[str, Any, Any]],
    ) -> None:
        self.status_code = 200
        self._parse = parse  # one line → (name, encoded payload, data), or a 4xx error
        self.background = None
        self._request = request
        self._state = state
        self._run_id = run_id
        self._token = token
        self._tally = _Tally(next_seq=seq)
        settings = state.settings
        self._line_limit = settings.max_event_bytes + LINE_ENVELOPE_BYTES
        self._group_limit = settings.max_batch_events
        self._send_timeout = settings.sse_send_timeout_seconds
        self._idle = settings.lease_seconds
        self._last_write = time.monotonic()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = self._state
        try:
            with stream_slot(state, stream_key(self._request)):
                try:
                    lease = await state.bridge.renew_lease(self._run_id, producer_token=self._token)
                except GatewayError as exc:  # fenced, ended: a plain 409, nothing streamed
                    await gateway_error_response(exc)(scope, receive, send)
                    return
                # The body may stay silent for as long as the lease it would keep alive.
                self._idle = max(0.1, lease.lease_expires_at - time.time())
                self._last_write = time.monotonic()
                start = {"type": "http.response.start", "status": 200, "headers": list(HEADERS)}
                await send(start)
                await self._stream(receive, send)
        except TooManyAppendStreams as exc:
            await gateway_error_response(exc)(scope, receive, send)

    async def _stream(self, receive: Receive, send: Send) -> None:
        lines_in, lines_out = anyio.create_memory_object_stream[_Line | _Failed | None](
            self._group_limit
        )
        acks_in, acks_out = anyio.create_memory_object_stream[tuple[bytes, bool]](ACKS_WAITING)
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._read, receive, lines_in, tg.cancel_scope)
            tg.start_soon(self._append, lines_out, acks_in)
            tg.start_soon(self._write, send, acks_out, tg.cancel_scope)

    # -- reader ---------------------------------------------------------------------

    async def _read(
        self,
        receive: Receive,
        lines: MemoryObjectSendStream[_Line | _Failed | None],
        scope: anyio.CancelScope,
    ) -> None:
        """Body chunks → checked lines, in order; then None when the body ended, or the
        failure that ends the stream (a bad line, an idle body, the gateway draining)."""
        async with lines:
            with anyio.CancelScope() as drain:
                remove = self._state.subscriptions.on_drain(drain.cancel)
                try:
                    last = await self._read_lines(receive, lines)
                finally:
                    remove()
            if drain.cancelled_caught:
                # Shutting down: the lines read so far are appended, then the producer is
                # told to go on elsewhere from `next_seq`.
                last = _Failed(BridgeClosed("the gateway is shutting down; send the rest again"))
            if last is _DISCONNECTED:
                scope.cancel()  # the client left: nothing more can be acknowledged
                return
            if not await _put(lines, last) or last is not None:
                return
            # The body ended: wait for the client to leave, or for the writer to finish.
            while (await receive())["type"] != "http.disconnect":
                pass
            scope.cancel()

    async def _read_lines(
        self, receive: Receive, lines: MemoryObjectSendStream[_Line | _Failed | None]
    ) -> _Failed | None:
        partial = bytearray()
        while True:
            message: Message | None = None
            with anyio.move_on_after(self._idle):
                message = await receive()
            if message is None:
                return _Failed(
                    BodyIdle(
                        f"the body sent nothing for {self._idle:g} s (the lease); "
                        "send a blank line to keep an idle stream open"
                    )
                )
            if message["type"] == "http.disconnect":
                return _DISCONNECTED
            chunk: bytes = message.get("body", b"")
            more = bool(message.get("more_body", False))
            pieces = chunk.split(b"\n")
            if not more and pieces[-1] == b"" and not partial:
                pieces.pop()
            for index, piece in enumerate(pieces):
                if more and index == len(pieces) - 1:
                    partial += piece  # the rest of this line comes in a later chunk
                    if len(partial) > self._line_limit:
                        return _Failed(self._too_large(len(partial)))
                    break
                line = bytes(partial + piece) if partial else piece
                partial.clear()
                if len(line) > self._line_limit:
                    return _Failed(self._too_large(len(line)))
                item: _Line
                if not line.strip():
                    item = KEEPALIVE  # the producer is alive: renew the lease
                else:
                    try:
                        name, payload, data = self._parse(line)
                    except (GatewayError, HttpError) as exc:
                        return _Failed(exc)
                    item = _Line(name, payload, data)
                if not await _put(lines, item):
                    return _DISCONNECTED  # the stream is over already
            if not more:
                return None

    def _too_large(self, size: int) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"a line of {size}+ bytes; the limit is {self._line_limit} "
            f"(max_event_bytes + {LINE_ENVELOPE_BYTES})"
        )

    # -- appender -------------------------------------------------------------------

    async def _append(
        self,
        lines: MemoryObjectReceiveStream[_Line | _Failed | None],
        acks: MemoryObjectSendStream[tuple[bytes, bool]],
    ) -> None:
        async with lines, acks:
            ended: _Failed | None = None
            finished = False
            while not finished and ended is None:
                group: list[_Line] = []
                item = await lines.receive()
                while True:
                    if item is None:
                        finished = True
                        break
                    if isinstance(item, _Failed):
                        ended = item
                        break
                    if item is not KEEPALIVE:
                        group.append(item)
                    elif not group:  # (a write renews the lease anyway)
                        ended = await self._keep_alive()
                        if ended is not None:
                            break
                    if len(group) >= self._group_limit:
                        break
                    try:
                        item = lines.receive_nowait()
                    except anyio.WouldBlock:
                        break
                if group:
                    failure = await self._commit(group, acks)
                    if failure is not None:
                        ended = failure
            if ended is not None:
                await acks.send((self._error_line(ended.error), True))
            else:
                done = {"done": True, "count": self._tally.count, "last_id": self._tally.last_id}
                await acks.send((orjson.dumps(done) + b"\n", True))

    async def _keep_alive(self) -> _Failed | None:
        """A blank line: renew the lease, unless a write did within a third of it."""
        if time.monotonic() - self._last_write < self._idle / 3:
            return None
        try:
            with anyio.CancelScope(shield=True):
                await self._state.bridge.renew_lease(self._run_id, producer_token=self._token)
        except GatewayError as exc:
            return _Failed(exc)
        self._last_write = time.monotonic()
        return None

    async def _commit(
        self, group: list[_Line], acks: MemoryObjectSendStream[tuple[bytes, bool]]
    ) -> _Failed | None:
        """Append one group; its ack line, or the failure that ends the stream."""
        state = self._state
        tally = self._tally
        events = [(line.name, line.payload) for line in group]
        try:
            # Shielded: once sent, an append finishes (its turn record is written in the
            # same step), even when the client leaves meanwhile (the bridge's own timeouts
            # bound it).
            with anyio.CancelScope(shield=True):
                result = await state.bridge.publish_many(
                    self._run_id, events, producer_token=self._token, seq=tally.next_seq
                )
            if result.appended:
                state.metrics.events_published.inc(result.appended)
        except GatewayError as exc:
            return _Failed(exc)
        self._last_write = time.monotonic()
        tally.count += len(result.ids)
        tally.last_id = result.ids[-1]
        ack: dict[str, Any] = {"ids": list(result.ids)}
        if tally.next_seq is not None:
            tally.next_seq += len(result.ids)
            ack["next_seq"] = tally.next_seq
        ack["cancel_requested"] = result.cancel_requested
        await acks.send((orjson.dumps(ack) + b"\n", False))
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

    # -- writer ---------------------------------------------------------------------

    async def _write(
        self,
        send: Send,
        acks: MemoryObjectReceiveStream[tuple[bytes, bool]],
        scope: anyio.CancelScope,
    ) -> None:
        async with acks:
            while True:
                body, last = await acks.receive()
                parts = [body]
                while not last:  # every ack waiting goes in one write
                    try:
                        body, last = acks.receive_nowait()
                    except anyio.WouldBlock:
                        break
                    parts.append(body)
                sent = False
                with anyio.move_on_after(self._send_timeout):
                    await send(
                        {
                            "type": "http.response.body",
                            "body": b"".join(parts),
                            "more_body": not last,
                        }
                    )
                    sent = True
                if not sent or last:
                    scope.cancel()  # done, or a client that stopped reading: dropped
                    return


async def _put(
    lines: MemoryObjectSendStream[_Line | _Failed | None], item: _Line | _Failed | None
) -> bool:
    """Queue a line without a checkpoint while there is room: the lines of one chunk are
    all queued before the appender wakes, so they go in one append (`send` would yield
    after each, and the appender would take them one by one). False once the appender
    has stopped (the stream ended with an error line meanwhile)."""
    try:
        try:
            lines.send_nowait(item)
        except anyio.WouldBlock:
            await lines.send(item)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        return False
    return True


def is_streamed(request: Request) -> bool:
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    return media_type == MEDIA_TYPE
