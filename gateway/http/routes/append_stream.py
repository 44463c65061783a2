"""Streamed appends (PROTOCOL 3.3): one `POST …/events` with an `application/x-ndjson`
body for a whole turn, one event a line, acknowledged as it goes.

Two tasks share the request, in one task group:

- the **reader** takes body chunks as they arrive, splits them into lines and checks
  each one as a batch's event is checked (`producer.parse_line`: JSON, name, size); the
  lines wait in a bounded queue (`max_batch_events` lines, `_Lines`), so a slow backend
  stops the reader and TCP backpressure reaches the producer;
- the **appender** takes every line waiting (up to `max_batch_events`) and appends them
  in one `publish_many` call: lines that arrive while an append is in flight go into the
  next one (group commit), and a lone line is appended at once (no linger timer). After
  each append it writes one ack line, `{"ids", "next_seq"?, "cancel_requested"}`. A client
  that stops reading acks therefore stops the appender, then the reader (nothing is
  buffered without bound), and a write pending for the send timeout drops it (the
  loop's `SendWatch`, as for SSE).

The response ends with `{"done": true, "count", "last_id"}` when the body ends, or with
one error line `{"error", "detail", "applied", "next_seq"?}`: every line before the one
that failed was appended, that one and every later one were not. Numbered streams
(`X-Producer-Seq` numbers the first line) get 3.1's rules per append, so a producer that
reconnects and resends from its first unacknowledged number duplicates nothing.

The per-line path takes no timer and no extra event-loop pass: the queue hands lines
over without a checkpoint, and the idle limit is one timer re-armed lazily
(`_arm_idle`), not a timeout scope around each read.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import anyio
import anyio.abc
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ...errors import (
    BodyIdle,
    BridgeClosed,
    GatewayError,
    PayloadTooLarge,
    SequenceRefused,
    TooManyStreams,
)
from ...timing.send_watch import SendWatch
from ..edge.errors import HttpError, gateway_error_response, public_detail
from ..state import GatewayState

MEDIA_TYPE: Final = "application/x-ndjson"
HEADERS: Final[tuple[tuple[bytes, bytes], ...]] = (
    (b"content-type", MEDIA_TYPE.encode()),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),  # nginx: pass each ack on as it is written
)
# A line holds the payload plus its envelope (`{"event": <≤64 chars>, "data": …}`): room
# for that envelope and some whitespace on top of the payload limit.
LINE_ENVELOPE_BYTES: Final = 4096


@dataclass(slots=True)
class _Line:
    name: str
    payload: Any  # values.RawJSON, encoded once


@dataclass(slots=True)
class _Failed:
    error: GatewayError | HttpError


KEEPALIVE: Final = _Line("", None)  # a blank line, queued in its place
_DISCONNECTED: Final = _Failed(BridgeClosed("the client left"))  # (never written)


@dataclass(slots=True)
class _Tally:
    """What this request has acknowledged (the `done` and error lines report it)."""

    count: int = 0
    last_id: str | None = None
    next_seq: int | None = None


_Item = _Line | _Failed | None  # None: the body ended
_EMPTY: Final = _Failed(BridgeClosed("(nothing queued)"))  # (never written)


class _Lines:
    """Lines read and not yet appended, in order, at most `limit` of them (a sentinel
    ending the stream always fits). Handed over without a checkpoint: the lines of one
    chunk are all queued before the appender wakes, so they go in one append."""

    def __init__(self, limit: int) -> None:
        self._items: deque[_Item] = deque()
        self._limit = limit
        self._ready: anyio.Event | None = None  # the appender waits for an item
        self._room: anyio.Event | None = None  # the reader waits for room
        self.closed = False  # the appender stopped: later lines have nowhere to go

    async def put(self, item: _Item) -> bool:
        while isinstance(item, _Line) and len(self._items) >= self._limit and not self.closed:
            self._room = anyio.Event()
            await self._room.wait()
        if self.closed:
            return False
        self._items.append(item)
        if self._ready is not None:
            self._ready.set()
            self._ready = None
        return True

    async def get(self) -> _Item:
        while not self._items:
            self._ready = anyio.Event()
            await self._ready.wait()
        return self._take()

    def get_nowait(self) -> _Item:
        return self._take() if self._items else _EMPTY

    def _take(self) -> _Item:
        item = self._items.popleft()
        if self._room is not None:
            self._room.set()
            self._room = None
        return item

    def close(self) -> None:
        self.closed = True
        if self._room is not None:
            self._room.set()


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
        self._send_timeout = settings.sse_send_timeout_seconds
        self._idle = settings.lease_seconds
        self._last_write = time.monotonic()
        self._loop = asyncio.get_running_loop()
        self._scope = anyio.CancelScope()  # the task group's, once streaming
        self._read_scope = anyio.CancelScope()  # cancelled on drain or an idle body
        self._receiving_since: float | None = None  # loop time a receive() began
        self._idle_handle: asyncio.TimerHandle | None = None
        self._idle_fired = False
        self._watch = SendWatch.of(self._loop)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = self._state
        try:
            with stream_slot(state, self._holder):
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
        except TooManyStreams as exc:
            await gateway_error_response(exc)(scope, receive, send)

    async def _stream(self, receive: Receive, send: Send) -> None:
        lines = _Lines(self._group_limit)
        async with anyio.create_task_group() as tg:
            self._scope = tg.cancel_scope
            tg.start_soon(self._read, receive, lines)
            tg.start_soon(self._append, lines, send)

    # -- reader ---------------------------------------------------------------------

    async def _read(self, receive: Receive, lines: _Lines) -> None:
        """Body chunks → checked lines, in order; then None when the body ended, or the
        failure that ends the stream (a bad line, an idle body, the gateway draining)."""
        remove = self._state.subscriptions.on_drain(self._read_scope.cancel)
        self._arm_idle(self._idle)
        try:
            with self._read_scope:
                last = await self._read_lines(receive, lines)
        finally:
            remove()
            if self._idle_handle is not None:
                self._idle_handle.cancel()
        if self._idle_fired:
            last = _Failed(
                BodyIdle(
                    f"the body sent nothing for {self._idle:g} s (the lease); "
                    "send a blank line to keep an idle stream open"
                )
            )
        elif self._read_scope.cancelled_caught:
            # Shutting down: the lines read so far are appended, then the producer is
            # told to go on elsewhere from `next_seq`.
            last = _Failed(BridgeClosed("the gateway is shutting down; send the rest again"))
        if last is _DISCONNECTED:
            self._scope.cancel()  # the client left: nothing more can be acknowledged
            return
        if not await lines.put(last) or last is not None:
            return
        # The body ended: wait for the client to leave, or for the appender to finish.
        while (await receive())["type"] != "http.disconnect":
            pass
        self._scope.cancel()

    def _arm_idle(self, delay: float) -> None:
        self._idle_handle = self._loop.call_later(delay, self._check_idle)

    def _check_idle(self) -> None:
        """The idle timer: fires the idle limit only while the reader waits for the
        client (not while it waits for room in the queue: that is the gateway's delay)."""
        since = self._receiving_since
        left = self._idle if since is None else since + self._idle - self._loop.time()
        if left > 0:
            self._arm_idle(left)
            return
        self._idle_fired = True
        self._read_scope.cancel()

    async def _read_lines(self, receive: Receive, lines: _Lines) -> _Failed | None:
        partial = bytearray()
        while True:
            self._receiving_since = self._loop.time()
            message = await receive()
            self._receiving_since = None
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
                        name, payload = self._parse(line)
                    except (GatewayError, HttpError) as exc:
                        return _Failed(exc)
                    item = _Line(name, payload)
                if not await lines.put(item):
                    return _DISCONNECTED  # the stream is over already
            if not more:
                return None

    def _too_large(self, size: int) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"a line of {size}+ bytes; the limit is {self._line_limit} "
            f"(max_event_bytes + {LINE_ENVELOPE_BYTES})"
        )

    # -- appender -------------------------------------------------------------------

    async def _append(self, lines: _Lines, send: Send) -> None:
        try:
            ended: _Failed | None = None
            finished = False
            while not finished and ended is None:
                group: list[_Line] = []
                item = await lines.get()
                while item is not _EMPTY:
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
                    item = lines.get_nowait()
                if group:
                    failure = await self._commit(group, send)
                    if failure is not None:
                        ended = failure
            if ended is not None:
                last = self._error_line(ended.error)
            else:
                done = {"done": True, "count": self._tally.count, "last_id": self._tally.last_id}
                last = orjson.dumps(done) + b"\n"
            await self._send(send, last, more=False)
        finally:
            lines.close()
        self._scope.cancel()  # done: the reader stops waiting for the client

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

    async def _commit(self, group: list[_Line], send: Send) -> _Failed | None:
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
        await self._send(send, orjson.dumps(ack) + b"\n", more=True)
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
