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
- prompt disconnect detection: `receive()` is watched concurrently with the bridge
  iterator in one task group, so a disconnect cancels the subscription at once (not at
  the next heartbeat write) and every resource is freed;
- graceful shutdown: when the registry drains (server exit), the bridge subscription is
  stopped, frames already read are flushed, and the response ends cleanly so clients
  reconnect with `Last-Event-ID` after the jittered `retry:` hint.

Frames already available are coalesced into one `send` (bounded by `COALESCE_BYTES`).
A reader task pulls the bridge into a small bounded buffer without suspending while the
bridge has items ready, so a burst reaches the writer, and the socket, as one write per
wake-up rather than one per event. When the client is slow the reader stops pulling,
so the subscription falls behind inside the bridge's retention (and gets a gap only if
it falls out of it) without ever stalling the producer.

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
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar, Final, Literal

import anyio
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from ..errors import BackendUnavailable, BridgeClosed
from ..values import End, Heartbeat, StreamEvent, StreamGap, StreamItem
from .frames import (
    HEARTBEAT_FRAME,
    SHUTDOWN_FRAME,
    end_frame,
    event_frame,
    gap_frame,
    retry_frame,
    unavailable_frame,
)
from .metrics import Metrics, ResumeOutcome
from .observe import lifecycle, record_of
from .subscriptions import SubscriptionRegistry

log = logging.getLogger(__name__)

SSE_HEADERS: Final[tuple[tuple[bytes, bytes], ...]] = (
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
)
COALESCE_BYTES: Final = 64 * 1024
SEND_TIMEOUT: Final = 30.0
CLOSE_TIMEOUT: Final = 5.0

Subscribe = Callable[[], AsyncIterator[StreamItem]]
# How the reader asked to start: no cursor, a malformed one, or a valid one (whose
# outcome, exact or a gap, is known at the subscription's first item).
ResumeStart = Literal["from_start", "malformed_cursor", "cursor"]


class SSEResponse(Response):
    """ASGI response streaming one subscription as SSE (a `Response` only for routing).

    `subscribe` is called once the response has started; `None` means the stream is
    already known to be over and only `final_frame` (an `end` frame) is written.
    `on_delivered(n)` is told how many data events each write carried. `metrics` and
    `resume` feed the metrics (see the module doc); both are optional.
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
        self._request_id: str | None = None
        self._started_ms = 0.0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        record = record_of(scope)
        self._request_id = None if record is None else record.request_id
        self._started_ms = time.time() * 1000
        with self._registry.track(self.run_id, "sse"):
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
                outcome = "send_timeout"
                with anyio.move_on_after(self._send_timeout):
                    body = retry_frame() + self._final_frame
                    await send({"type": "http.response.body", "body": body, "more_body": False})
                    if self._metrics is not None:
                        self._metrics.bytes_out.inc(len(body))
                    outcome = "end"
                if record is not None:
                    record.outcome, record.events_delivered = outcome, 0
                return
            frames = _Frames()
            try:
                await self._stream(receive, send, self._subscribe, frames)
            finally:
                if record is not None:
                    record.outcome, record.events_delivered = frames.outcome, frames.sent

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

    async def _stream(
        self, receive: Receive, send: Send, subscribe: Subscribe, frames: _Frames
    ) -> None:
        """Writer in this task, the bridge reader and the disconnect watcher beside it.

        Plain asyncio tasks rather than an anyio task group: an idle stream is what a
        process holds thousands of, and a task group with three tasks costs ~3x the
        memory of three bare tasks. Drain is a registry callback, not a waiting task.
        """
        loop = asyncio.get_running_loop()
        writer = _Writer(self._send_timeout, asyncio.current_task())
        reader = loop.create_task(self._read(subscribe, frames))
        watcher = loop.create_task(self._watch_disconnect(receive, frames, reader, writer))

        ends = _ReaderEnds(frames, reader, self._metrics)
        reader.add_done_callback(ends.reader_done)
        remove_drain = self._registry.on_drain(ends.drain)
        try:
            completed = await self._write(frames, send, writer)
            if not completed and not frames.disconnected:
                frames.outcome = "send_timeout"
                log.info("sse: client of run %s too slow to read; dropping it", self.run_id)
        finally:
            if frames.disconnected:
                frames.outcome = "disconnect"
            remove_drain()
            watcher.cancel()
            if not reader.done():
                reader.cancel()
            # The reader closes the bridge subscription (shielded) before it finishes;
            # wait for it so every resource is freed when the response returns.
            await asyncio.wait([reader, watcher])
            if not reader.cancelled() and reader.exception() is not None:
                raise reader.exception()  # type: ignore[misc]

    async def _watch_disconnect(
        self, receive: Receive, frames: _Frames, reader: asyncio.Task[None], writer: _Writer
    ) -> None:
        while True:
            message: Message = await receive()
            if message["type"] == "http.disconnect":
                frames.disconnected = True
                frames.close()
                reader.cancel()
                writer.stop("disconnect")
                return

    async def _read(self, subscribe: Subscribe, frames: _Frames) -> None:
        """Pull the bridge into `frames`; the last frame put ends the response.

        Items the bridge has ready are taken without suspending (an async generator that
        does not wait does not yield to the loop), so the writer, woken for the next loop
        iteration, finds everything that was ready and sends it in one write.
        """
        items = subscribe()
        first = self._resume == "cursor"
        try:
            async for item in items:
                if frames.closed:
                    return  # drained or disconnected: nothing more to write
                if first:
                    first = False
                    self._first_item(item)
                if isinstance(item, StreamEvent):
                    frames.put(event_frame(item), 1)
                    frames.last_id = item.id
                elif isinstance(item, Heartbeat):
                    frames.put(HEARTBEAT_FRAME, 0)
                elif isinstance(item, End):
                    frames.put(end_frame(item), 0)
                    frames.outcome = "end"
                    return
                elif isinstance(item, StreamGap):
                    frames.put(gap_frame(self.run_id, item), 0)
                    frames.outcome = "gap"
                    self._gap_served(item)
                    return
                if frames.size >= COALESCE_BYTES:
                    await frames.wait_space()  # a slow client: stop pulling
        except (BackendUnavailable, BridgeClosed, OSError) as exc:
            frames.put(unavailable_frame(self.run_id, str(exc) or "backend failure"), 0)
            frames.outcome = "unavailable"
            if isinstance(exc, BridgeClosed):
                log.info("sse: run %s subscription ended: bridge closed", self.run_id)
            else:
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
            return
        finally:
            await _aclose(items)

    def _gap_served(self, gap: StreamGap) -> None:
        if self._metrics is not None:
            self._metrics.gaps[gap.reason].inc()
        lifecycle(
            "gap",
            "gap served",
            run_id=self.run_id,
            request_id=self._request_id,
            reason=gap.reason,
            requested_event_id=gap.requested_event_id,
            earliest_available_event_id=gap.earliest_available_event_id,
            latest_available_event_id=gap.latest_available_event_id,
        )

    async def _write(self, frames: _Frames, send: Send, writer: _Writer) -> bool:
        """Write what is ready in one send per wake-up; False on send timeout/disconnect."""
        metrics = self._metrics
        try:
            first = retry_frame()
            await writer.send(send, first, more=True)
            if metrics is not None:
                metrics.bytes_out.inc(len(first))
            while True:
                if not frames.chunks and not frames.closed:
                    await frames.wait_ready()
                if frames.disconnected:
                    return False
                body, delivered, last_id = frames.take()
                more = not frames.closed
                await writer.send(send, body, more=more)
                if metrics is not None:
                    metrics.bytes_out.inc(len(body))
                if delivered:
                    frames.sent += delivered
                    if self._on_delivered is not None:
                        self._on_delivered(delivered)
                    if metrics is not None:
                        metrics.delivered(delivered)
                        if last_id is not None:
                            metrics.lag.observe(self._lag_seconds(last_id))
                if not more:
                    return True
        except asyncio.CancelledError:
            if writer.stopped is None:
                raise
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
            return False
        except OSError:  # the client went away mid-write (servers other than uvicorn)
            return False
        finally:
            writer.close()

    def _lag_seconds(self, event_id: str) -> float:
        """Now minus the later of the event's publish time (its id's ms) and our start."""
        published_ms = float(event_id[: event_id.find("-")])
        lag_ms = time.time() * 1000 - max(published_ms, self._started_ms)
        return lag_ms / 1000 if lag_ms > 0 else 0.0


class _Frames:
    """Frames the reader has pulled and the writer has not sent yet (single loop, no locks).

    Bounded: the reader waits once `size` reaches `COALESCE_BYTES` until the writer has
    taken the lot, so a slow client only stops its own reader. Waits use a future made
    on demand (an idle stream holds one, not two preallocated `asyncio.Event`s).
    """

    __slots__ = (
        "_ready",
        "_space",
        "chunks",
        "closed",
        "disconnected",
        "draining",
        "events",
        "last_id",
        "outcome",
        "sent",
        "size",
    )

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.size = 0
        self.events = 0
        self.closed = False
        self.disconnected = False
        self.draining = False
        self.last_id: str | None = None  # the newest event put since the last take
        self.outcome = "end"  # what ended the response (for the request log line)
        self.sent = 0  # data events written
        self._ready: asyncio.Future[None] | None = None  # the writer waits on it
        self._space: asyncio.Future[None] | None = None  # the reader waits on it

    def put(self, frame: bytes, events: int) -> None:
        if self.closed:
            return  # the response already has its last frame
        self.chunks.append(frame)
        self.size += len(frame)
        self.events += events
        _wake(self._ready)

    def close(self) -> None:
        self.closed = True
        _wake(self._ready)

    def take(self) -> tuple[bytes, int, str | None]:
        chunks, events, last_id = self.chunks, self.events, self.last_id
        self.chunks, self.size, self.events, self.last_id = [], 0, 0, None
        _wake(self._space)
        return (chunks[0] if len(chunks) == 1 else b"".join(chunks)), events, last_id

    async def wait_ready(self) -> None:
        while not self.chunks and not self.closed:
            self._ready = asyncio.get_running_loop().create_future()
            try:
                await self._ready
            finally:
                self._ready = None

    async def wait_space(self) -> None:
        while self.size >= COALESCE_BYTES and not self.closed:
            self._space = asyncio.get_running_loop().create_future()
            try:
                await self._space
            finally:
                self._space = None


class _ReaderEnds:
    """How the reader task ends a response: drained (server shutdown) or done.

    Methods of a slotted object rather than closures (every open response holds them).
    """

    __slots__ = ("frames", "metrics", "reader")

    def __init__(self, frames: _Frames, reader: asyncio.Task[None], metrics: Metrics | None):
        self.frames = frames
        self.reader = reader
        self.metrics = metrics

    def drain(self) -> None:
        """Server shutdown: end the response now with what was read, then stop reading.

        The response ends here rather than when the reader task notices its
        cancellation, so a drain never depends on how the bridge handles it.
        """
        if self.reader.done():
            return
        frames = self.frames
        frames.draining = True
        if not frames.disconnected and not frames.closed:
            frames.put(SHUTDOWN_FRAME, 0)
            frames.outcome = "drain"
            if self.metrics is not None:
                self.metrics.drained.inc()
            frames.close()
        self.reader.cancel()

    def reader_done(self, _task: asyncio.Task[None]) -> None:
        self.frames.close()  # the last frame put ends the response


def _wake(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


class _Writer:
    """Sends body chunks under the send timeout, watched by the loop's `_SendWatch`."""

    __slots__ = ("_task", "_watch", "stopped", "timeout")

    def __init__(self, timeout: float, task: asyncio.Task[Any] | None) -> None:
        self.timeout = timeout
        self.stopped: str | None = None
        self._task = task
        self._watch = _SendWatch.of(asyncio.get_running_loop())

    async def send(self, send: Send, body: bytes, *, more: bool) -> None:
        self._watch.begin(self)
        try:
            await send({"type": "http.response.body", "body": body, "more_body": more})
        finally:
            self._watch.end(self)

    def stop(self, reason: str) -> None:
        """Cancel the writing task if a send is in flight (timeout or disconnect)."""
        if self.stopped is None and self._watch.sending(self) and self._task is not None:
            self.stopped = reason
            self._task.cancel()

    def close(self) -> None:
        self._watch.end(self)


class _SendWatch:
    """The send timeout of every SSE response on one loop: one timer, not one per write.

    Writers register a send while it is in flight; while any is, a tick (a quarter of
    the shortest timeout, at most 1 s) stops the writers whose send has been pending for
    their timeout: a client that stopped reading is dropped within ~1.25x the timeout.
    """

    _by_loop: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _SendWatch]] = (
        weakref.WeakKeyDictionary()
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._inflight: dict[_Writer, float] = {}
        self._handle: asyncio.TimerHandle | None = None

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> _SendWatch:
        watch = cls._by_loop.get(loop)
        if watch is None:
            watch = cls._by_loop[loop] = cls(loop)
        return watch

    def begin(self, writer: _Writer) -> None:
        self._inflight[writer] = self._loop.time()
        if self._handle is None:
            self._handle = self._loop.call_later(min(1.0, writer.timeout / 4), self._tick)

    def end(self, writer: _Writer) -> None:
        self._inflight.pop(writer, None)

    def sending(self, writer: _Writer) -> bool:
        return writer in self._inflight

    def _tick(self) -> None:
        self._handle = None
        now = self._loop.time()
        for writer, since in list(self._inflight.items()):
            if now - since >= writer.timeout:
                writer.stop("send timeout")
        if self._inflight:
            tick = min(1.0, min(w.timeout for w in self._inflight) / 4)
            self._handle = self._loop.call_later(tick, self._tick)


async def _aclose(items: AsyncIterator[StreamItem]) -> None:
    """Close the bridge iterator, shielded: its cleanup runs even when we are cancelled."""
    aclose = getattr(items, "aclose", None)
    if aclose is not None:
        with anyio.move_on_after(CLOSE_TIMEOUT, shield=True):
            await aclose()
