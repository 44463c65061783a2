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
A reader task pulls the bridge into a small bounded buffer; when the client is slow the
reader stops pulling, so the subscription falls behind inside the bridge's retention
(and gets a gap only if it falls out of it) without ever stalling the producer.

A subscriber-side backend failure ends the response with an `unavailable` frame (no
`id:`), never touching the producer. A disconnect never cancels the producer either.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import ExitStack, suppress
from typing import Final

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
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
BUFFER_FRAMES: Final = 256
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
                await self._send(send, retry_frame() + self._final_frame, more=False)
                return
            await self._stream(receive, send, self._subscribe)

    async def _stream(self, receive: Receive, send: Send, subscribe: Subscribe) -> None:
        tx, rx = anyio.create_memory_object_stream[tuple[bytes, int]](BUFFER_FRAMES)
        async with anyio.create_task_group() as tg:
            reader_scope = anyio.CancelScope()
            tg.start_soon(self._watch_disconnect, receive, tg.cancel_scope)
            tg.start_soon(self._read, subscribe, tx, reader_scope)
            tg.start_soon(self._watch_drain, reader_scope)
            completed = await self._write(rx, send)
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

    async def _read(
        self,
        subscribe: Subscribe,
        tx: MemoryObjectSendStream[tuple[bytes, int]],
        scope: anyio.CancelScope,
    ) -> None:
        """Pull the bridge into the buffer; the last frame sent ends the response."""
        async with tx:
            with scope:
                items = subscribe()
                try:
                    async for item in items:
                        if isinstance(item, StreamEvent):
                            await tx.send((event_frame(item), 1))
                        elif isinstance(item, Heartbeat):
                            await tx.send((HEARTBEAT_FRAME, 0))
                        elif isinstance(item, End):
                            await tx.send((end_frame(item), 0))
                            return
                        elif isinstance(item, StreamGap):
                            await tx.send((gap_frame(self.run_id, item), 0))
                            return
                except (BackendUnavailable, BridgeClosed, OSError) as exc:
                    log.warning("sse: run %s subscription failed: %r", self.run_id, exc)
                    frame = unavailable_frame(self.run_id, str(exc) or "backend failure")
                    with anyio.move_on_after(CLOSE_TIMEOUT, shield=True):
                        await tx.send((frame, 0))
                    return
                finally:
                    await _aclose(items)
            if scope.cancel_called:  # drained by a server shutdown
                with suppress(anyio.WouldBlock, anyio.BrokenResourceError):
                    tx.send_nowait((SHUTDOWN_FRAME, 0))

    async def _write(self, rx: MemoryObjectReceiveStream[tuple[bytes, int]], send: Send) -> bool:
        """Write frames as they come, coalescing what is ready; False on send timeout."""
        pending = retry_frame()
        delivered = 0
        async with rx:
            while True:
                if not pending:
                    try:
                        frame, n = await rx.receive()
                    except anyio.EndOfStream:
                        return await self._send(send, b"", more=False)
                    pending, delivered = frame, n
                chunks = [pending]
                size = len(pending)
                done = False
                while size < COALESCE_BYTES:
                    try:
                        frame, n = rx.receive_nowait()
                    except anyio.WouldBlock:
                        break
                    except anyio.EndOfStream:
                        done = True
                        break
                    chunks.append(frame)
                    size += len(frame)
                    delivered += n
                if not await self._send(send, b"".join(chunks), more=not done):
                    return False
                if delivered and self._on_delivered is not None:
                    self._on_delivered(delivered)
                pending, delivered = b"", 0
                if done:
                    return True

    async def _send(self, send: Send, body: bytes, *, more: bool) -> bool:
        with anyio.move_on_after(self._send_timeout):
            await send({"type": "http.response.body", "body": body, "more_body": more})
            return True
        return False


async def _aclose(items: AsyncIterator[StreamItem]) -> None:
    """Close the bridge iterator, shielded: its cleanup runs even when we are cancelled."""
    aclose = getattr(items, "aclose", None)
    if aclose is not None:
        with anyio.move_on_after(CLOSE_TIMEOUT, shield=True):
            await aclose()
