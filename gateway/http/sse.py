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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import ExitStack
from typing import Final

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


class SSEResponse(Response):
    """ASGI response streaming one subscription as SSE (a `Response` only for routing).

    `subscribe` is called once the response has started; `None` means the stream is
    already known to be over and only `final_frame` (an `end` frame) is written.
    `on_delivered(n)` is told how many data events each write carried.
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

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with ExitStack() as stack:
            stack.enter_context(self._registry.track(self.run_id, "sse"))
            await send(
                {"type": "http.response.start", "status": 200, "headers": list(self._sse_headers)}
            )
            if self._subscribe is None:
                with anyio.move_on_after(self._send_timeout):
                    body = retry_frame() + self._final_frame
                    await send({"type": "http.response.body", "body": body, "more_body": False})
                return
            await self._stream(receive, send, self._subscribe)

    async def _stream(self, receive: Receive, send: Send, subscribe: Subscribe) -> None:
        frames = _Frames()
        async with anyio.create_task_group() as tg:
            reader_scope = anyio.CancelScope()
            tg.start_soon(self._watch_disconnect, receive, tg.cancel_scope)
            tg.start_soon(self._read, subscribe, frames, reader_scope)
            tg.start_soon(self._watch_drain, reader_scope)
            completed = await self._write(frames, send)
            if not completed:
                log.info("sse: client of run %s too slow to read; dropping it", self.run_id)
            tg.cancel_scope.cancel()

    async def _watch_disconnect(self, receive: Receive, scope: anyio.CancelScope) -> None:
        while True:
            message: Message = await receive()
            if message["type"] == "http.disconnect":
                scope.cancel()
                return

    async def _watch_drain(self, reader_scope: anyio.CancelScope) -> None:
        await self._registry.wait_draining()
        reader_scope.cancel()

    async def _read(self, subscribe: Subscribe, frames: _Frames, scope: anyio.CancelScope) -> None:
        """Pull the bridge into `frames`; the last frame put ends the response.

        Items the bridge has ready are taken without suspending (an async generator that
        does not wait does not yield to the loop), so the writer, woken for the next loop
        iteration, finds everything that was ready and sends it in one write.
        """
        try:
            with scope:
                items = subscribe()
                try:
                    async for item in items:
                        if isinstance(item, StreamEvent):
                            frames.put(event_frame(item), 1)
                        elif isinstance(item, Heartbeat):
                            frames.put(HEARTBEAT_FRAME, 0)
                        elif isinstance(item, End):
                            frames.put(end_frame(item), 0)
                            return
                        elif isinstance(item, StreamGap):
                            frames.put(gap_frame(self.run_id, item), 0)
                            return
                        if frames.size >= COALESCE_BYTES:
                            await frames.wait_space()  # a slow client: stop pulling
                except (BackendUnavailable, BridgeClosed, OSError) as exc:
                    log.warning("sse: run %s subscription failed: %r", self.run_id, exc)
                    frames.put(unavailable_frame(self.run_id, str(exc) or "backend failure"), 0)
                    return
                finally:
                    await _aclose(items)
            if scope.cancel_called:  # drained by a server shutdown
                frames.put(SHUTDOWN_FRAME, 0)
        finally:
            frames.close()

    async def _write(self, frames: _Frames, send: Send) -> bool:
        """Write what is ready in one send per wake-up; False on send timeout."""
        watchdog = _SendWatchdog(self._send_timeout)
        with watchdog.scope:
            try:
                await watchdog.send(send, retry_frame(), more=True)
                while True:
                    if not frames.chunks and not frames.closed:
                        await frames.wait_ready()
                    body, delivered = frames.take()
                    more = not frames.closed
                    await watchdog.send(send, body, more=more)
                    if delivered and self._on_delivered is not None:
                        self._on_delivered(delivered)
                    if not more:
                        return True
            finally:
                watchdog.stop()
        return False


class _Frames:
    """Frames the reader has pulled and the writer has not sent yet (single loop, no locks).

    Bounded: the reader waits once `size` reaches `COALESCE_BYTES` until the writer has
    taken the lot, so a slow client only stops its own reader.
    """

    __slots__ = ("_ready", "_space", "chunks", "closed", "events", "size")

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.size = 0
        self.events = 0
        self.closed = False
        self._ready = asyncio.Event()
        self._space = asyncio.Event()

    def put(self, frame: bytes, events: int) -> None:
        self.chunks.append(frame)
        self.size += len(frame)
        self.events += events
        self._ready.set()

    def close(self) -> None:
        self.closed = True
        self._ready.set()

    def take(self) -> tuple[bytes, int]:
        chunks, events = self.chunks, self.events
        self.chunks, self.size, self.events = [], 0, 0
        self._ready.clear()
        self._space.set()
        return (chunks[0] if len(chunks) == 1 else b"".join(chunks)), events

    async def wait_ready(self) -> None:
        await self._ready.wait()

    async def wait_space(self) -> None:
        self._space.clear()
        while self.size >= COALESCE_BYTES:
            await self._space.wait()
            self._space.clear()


class _SendWatchdog:
    """The send timeout without a cancel scope and timer per write.

    One timer per response checks whether a send has been pending for `timeout`
    seconds (a client that stopped reading) and then cancels the writer's scope.
    """

    __slots__ = ("_handle", "_loop", "_since", "scope", "timeout")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.scope = anyio.CancelScope()
        self._loop = asyncio.get_running_loop()
        self._since: float | None = None
        self._handle: asyncio.TimerHandle | None = self._loop.call_later(timeout, self._check)

    async def send(self, send: Send, body: bytes, *, more: bool) -> None:
        self._since = self._loop.time()
        await send({"type": "http.response.body", "body": body, "more_body": more})
        self._since = None

    def _check(self) -> None:
        now = self._loop.time()
        since = self._since
        if since is not None and now - since >= self.timeout:
            self._handle = None
            self.scope.cancel()
            return
        due = (since if since is not None else now) + self.timeout
        self._handle = self._loop.call_at(due, self._check)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


async def _aclose(items: AsyncIterator[StreamItem]) -> None:
    """Close the bridge iterator, shielded: its cleanup runs even when we are cancelled."""
    aclose = getattr(items, "aclose", None)
    if aclose is not None:
        with anyio.move_on_after(CLOSE_TIMEOUT, shield=True):
            await aclose()
