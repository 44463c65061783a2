"""An async producer for one run over HTTP: claim, batched numbered appends, lease, END.

    async with Producer("http://127.0.0.1:8000", session_id="chat-1", api_key=key) as run:
        async for chunk in graph.astream(inputs, stream_mode="messages"):
            await run.send("token", {"text": chunk[0].content})

Entering the block claims the run (`takeover=True` to fence a live holder); leaving it
ENDs the run: `success`, `error` when the block raises, `cancelled` when the block is
cancelled (or `cancelled_status`, e.g. `interrupted` for a worker that is shutting
down) or a subscriber asked to cancel (`POST /v1/runs/{id}/cancel`; the block is
then cancelled and leaves quietly unless `cancel_on_request=False`, in which case the
code polls `run.cancel_requested` or awaits `run.wait_cancel_requested()`).

`send` queues an event and returns. A background task sends the queue as a **streamed
append** (PROTOCOL 3.3, `streaming=True`, the default): one POST whose ndjson body
carries the events as they are queued, one a line, for up to `stream_seconds` (or
`batch_events` lines, or until a flush), numbered with `X-Producer-Seq`. httpx sends a
whole request body before it reads the reply, so the gateway's acknowledgements are
read when that body ends; a stream cut short is sent again from its first
unacknowledged line (the gateway answers the overlap with the first ids and appends only
what is new). It falls back to batched POSTs for the rest of the run when the stream
shows a proxy in between that does not pass request bodies through: an answer 411, 415,
501 or 505 to the streamed POST, or lines written over `BUFFERED_SPREAD_SECONDS` or more
that the gateway acknowledged in a single append (it received them all at once:
buffered). With `streaming=False` (or after a fallback) queued events go in one request
per `batch_window` seconds (or sooner when `batch_bytes`/`batch_events` are reached, or
at once after a request that was in flight). Either way a request is re-sent after a
connection error, a timeout or a 502/503/504 (a malformed `Retry-After` is ignored),
with exponential backoff, for up to `retry_timeout` seconds: the gateway applies a
numbered event once, so a blind retry never duplicates or loses an event. While nothing
goes out, a second task renews the lease every `renew_interval`.

A block that raises ENDs the run as `error` with `{"type": <exception class>}`: the
exception's message reaches every reader of the run only with
`publish_error_messages=True` (it may hold a prompt, a secret or an internal address).

Errors are the gateway's own types (`gateway.errors`): `ProducerFenced` when another
producer took the run over, `StreamEnded` when it has ended, `RunOwned` on a claim of a
run with a live lease, `TurnExists` (its `run_id`: follow that run) on a claim whose
`idempotency_key` already started a turn of the session, `BackendUnavailable` when
retries ran out, `InvalidInput` /
`PayloadTooLarge` for what the gateway refused. A failure of a background request
cancels the block and is raised where the block ends.

This module is the block and the lease; the two senders are `streamed.py` and
`batched.py` (one `Sender` protocol, `sender.py`, over the queue in `outbox.py`), and
every request goes through `calls.py` (retries, error answers to `gateway.errors`).
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Iterable
from types import TracebackType
from typing import Any, Self

import anyio
import anyio.lowlevel
import httpx
import orjson
from anyio.abc import TaskGroup

from ..errors import (
    BackendUnavailable,
    GatewayError,
    InvalidInput,
    ProducerFenced,
    RunOwned,
    StreamEnded,
)
from ..names import check_run_id, check_session_id
from ..values import EndStatus
from .batched import BatchedSender
from .calls import (
    MAX_RETRY_AFTER,
    RETRY_STATUSES,
    Calls,
    RequestRefused,
    error_from,
    retry_after_seconds,
)
from .calls import Retryable as _Retryable  # the name tests and callers knew it by
from .outbox import MAX_CACHED_NAMES, Outbox
from .sender import Sender
from .streamed import (
    BUFFERED_SPREAD_SECONDS,
    NDJSON,
    STREAM_BYTES,
    STREAM_REFUSED_STATUSES,
    StreamedSender,
)

log = logging.getLogger("gateway.producer")

# The names this module had before its senders moved out: callers import them from here.
__all__ = [
    "BUFFERED_SPREAD_SECONDS",
    "MAX_CACHED_NAMES",
    "MAX_RETRY_AFTER",
    "NDJSON",
    "RETRY_STATUSES",
    "STREAM_BYTES",
    "STREAM_REFUSED_STATUSES",
    "Producer",
    "RequestRefused",
    "_Retryable",
    "error_from",
    "retry_after_seconds",
]


class Producer:
    """One run's producer; see the module docstring. Use it as an async context manager."""

    def __init__(
        self,
        base_url: str,
        *,
        run_id: str | None = None,
        session_id: str | None = None,
        api_key: str | None = None,
        takeover: bool = False,
        lease_seconds: float | None = None,
        input_message: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        cancel_on_request: bool = True,
        cancelled_status: EndStatus = "cancelled",
        batch_window: float = 0.02,
        batch_bytes: int = 64 * 1024,
        batch_events: int = 500,
        max_buffer_bytes: int = 4 * 1024 * 1024,
        renew_interval: float | None = None,
        retry_timeout: float = 60.0,
        request_timeout: float = 10.0,
        end_timeout: float = 10.0,
        client: httpx.AsyncClient | None = None,
        streaming: bool = True,
        stream_seconds: float = 0.5,
        publish_error_messages: bool = False,
    ) -> None:
        self._own_run_id = run_id is None
        self.run_id = check_run_id(run_id) if run_id is not None else uuid.uuid4().hex
        self.session_id = check_session_id(session_id) if session_id is not None else None
        self._claim_body: dict[str, Any] = {"run_id": self.run_id, "takeover": takeover}
        for key, value in (
            ("session_id", session_id),
            ("lease_seconds", lease_seconds),
            ("input_message", input_message),
            ("metadata", metadata),
            # a second claim with it gets TurnExists (a retry of ours is a takeover: goes on)
            ("idempotency_key", idempotency_key),
        ):
            if value is not None:
                self._claim_body[key] = value
        self._calls = Calls(
            base_url,
            self.run_id,
            api_key=api_key,
            client=client,
            request_timeout=request_timeout,
            retry_timeout=retry_timeout,
        )
        self.cancel_on_request = cancel_on_request
        self.cancelled_status: EndStatus = cancelled_status
        self.max_buffer_bytes = max_buffer_bytes
        self._renew_interval = renew_interval
        self.end_timeout = end_timeout
        self.publish_error_messages = publish_error_messages
        # Claim state.
        self.epoch = 0
        self.lease_expires_at = 0.0
        # Send state: the queue, and the two ways of sending it. Streamed appends unless
        # `streaming=False` or the streamed sender gave up (a proxy in between showed it
        # buffers request bodies): then batches, which take over its unacknowledged lines.
        self._outbox = Outbox(
            batch_events=batch_events, batch_bytes=batch_bytes, on_reply=self._acknowledged
        )
        self._streamed = StreamedSender(
            self._calls,
            self._outbox,
            stream_seconds=stream_seconds,
            renew_interval=lambda: self.renew_interval,
        )
        self._batched = BatchedSender(self._calls, self._outbox, batch_window=batch_window)
        self._senders: tuple[Sender, ...] = (self._streamed, self._batched)
        self._streams = streaming
        self.end_status: EndStatus | None = None
        self.cancel_requested = False
        self._failure: GatewayError | None = None
        self._task_group: TaskGroup | None = None
        self._body_scope: anyio.CancelScope | None = None
        self._progress = anyio.Event()  # a batch was acknowledged (replaced each time)
        self._cancel_seen = anyio.Event()

    # ------------------------------------------------------------------ what it reports

    @property
    def token(self) -> str:
        """The producer token the claim gave ("" before it)."""
        return self._calls.token

    @property
    def streaming(self) -> bool:
        """Streamed appends are in use (false with `streaming=False` or after a fallback)."""
        return self._streams and self._streamed.fell_back is None

    @property
    def fell_back(self) -> str | None:
        """Why streaming was given up, if it was."""
        return self._streamed.fell_back

    @property
    def streams_sent(self) -> int:
        """Streamed requests answered."""
        return self._streamed.streams_sent

    @property
    def events_sent(self) -> int:
        """Acknowledged events."""
        return self._outbox.events_sent

    @property
    def batches_sent(self) -> int:
        """Acknowledged appends (batches, and the appends of streamed lines)."""
        return self._outbox.batches_sent

    @property
    def last_event_id(self) -> str | None:
        return self._outbox.last_event_id

    @property
    def retries(self) -> int:
        """Re-sent requests (all kinds)."""
        return self._calls.retries

    @property
    def retry_timeout(self) -> float:
        return self._calls.retry_timeout

    @property
    def batch_window(self) -> float:
        return self._batched.batch_window

    @property
    def batch_bytes(self) -> int:
        return self._outbox.batch_bytes

    @property
    def batch_events(self) -> int:
        return self._outbox.batch_events

    @property
    def stream_seconds(self) -> float:
        return self._streamed.stream_seconds

    @property
    def _sender(self) -> Sender:
        return self._streamed if self.streaming else self._batched

    # ------------------------------------------------------------------ the block

    async def __aenter__(self) -> Self:
        if self.token:
            raise RuntimeError("a Producer is good for one run: make a new one")
        self._calls.open()
        try:
            await self._claim()
            self._task_group = anyio.create_task_group()
            await self._task_group.__aenter__()
        except BaseException:
            await self._calls.close()
            raise
        self._task_group.start_soon(self._send_loop)
        self._task_group.start_soon(self._renew_loop)
        # The block runs in a scope of its own: a cancel request or a background failure
        # cancels it, and leaving the block takes back exactly that cancellation.
        self._body_scope = anyio.CancelScope()
        self._body_scope.__enter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        assert self._body_scope is not None and self._task_group is not None
        body_scope, self._body_scope = self._body_scope, None
        stopped_by_us = bool(body_scope.__exit__(exc_type, exc, tb))
        cancelled_exc = anyio.get_cancelled_exc_class()
        cancelled = isinstance(exc, cancelled_exc) and not stopped_by_us
        interrupted: BaseException | None = None
        try:
            if exc is None and self._failure is None and self.streaming and self._unsent():
                # Let the open stream end and its acks be read: stopping it would cut it,
                # and its lines would go again (harmlessly, but as one more request).
                try:
                    await self.flush()
                except GatewayError:
                    pass  # it is `self._failure`, answered below
                except cancelled_exc as outer:
                    # Cancelled from outside meanwhile: END as cancelled below, then go on
                    # with that cancellation.
                    cancelled, interrupted = True, outer
            # Stop the background tasks; the batch they had on the wire is re-sent below.
            self._task_group.cancel_scope.cancel()
            try:
                await self._task_group.__aexit__(None, None, None)
            except cancelled_exc:
                # The surrounding scope is cancelled: END first (shielded), then the
                # cancellation goes on, as the block's own one or re-raised below.
                if not cancelled:
                    await self._end_anyway(self.cancelled_status, None, flush=True)
                    raise
                cancelled = True
            failure = self._failure
            if failure is not None:
                if not isinstance(failure, ProducerFenced | StreamEnded | BackendUnavailable):
                    await self._end_anyway("error", self._error_of(failure), flush=False)
                raise failure
            if cancelled:
                await self._end_anyway(self.cancelled_status, None, flush=True)
            elif stopped_by_us and self.cancel_requested:
                await self._end_anyway("cancelled", None, flush=True)
            elif exc is not None and not stopped_by_us:
                await self._end_anyway("error", self._error_of(exc), flush=True)
            else:
                try:
                    await self.flush_all()
                    await self._end("success", None)
                except cancelled_exc:
                    await self._end_anyway(self.cancelled_status, None, flush=True)
                    raise
                except (InvalidInput, RequestRefused) as refused:  # a batch was refused
                    await self._end_anyway("error", self._error_of(refused), flush=False)
                    raise
        finally:
            await self._calls.close()
        if interrupted is not None:
            raise interrupted
        return stopped_by_us  # only ever our own cancellation is taken back

    async def _end_anyway(self, status: EndStatus, error: Any, *, flush: bool) -> None:
        """Send what is queued, then END, after the block failed or was cancelled: shielded
        from the cancellation, bounded by `end_timeout`, and never raising over the error
        that ended the block (a failure is logged; the gateway's lease expiry then ENDs
        the run as `producer_lost`)."""
        with anyio.CancelScope(shield=True) as scope:
            scope.deadline = anyio.current_time() + self.end_timeout
            try:
                if flush:
                    await self.flush_all()
            except GatewayError as exc:
                log.warning("run %s: queued events not sent: %s", self.run_id, exc)
                if isinstance(exc, ProducerFenced | StreamEnded):
                    return  # not ours to END any more
            try:
                await self._end(status, error)
            except GatewayError as exc:
                log.warning("could not END run %s as %s: %s", self.run_id, status, exc)
        if scope.cancelled_caught:
            log.warning("could not END run %s in %s s", self.run_id, self.end_timeout)

    def _error_of(self, exc: BaseException) -> dict[str, Any]:
        return _error_of(exc, self.publish_error_messages)

    # ------------------------------------------------------------------ sending

    async def send(self, event: str, data: Any = None) -> None:
        """Queue one event (validated and encoded now); waits only when the queue is full."""
        self._check_usable()
        self._outbox.put(event, data)
        await self._queued()

    async def send_many(self, events: Iterable[tuple[str, Any]]) -> None:
        """Queue events in order; they go out in as few batches as the limits allow."""
        for event, data in events:
            self._check_usable()
            self._outbox.put(event, data)
        await self._queued()

    async def _queued(self) -> None:
        outbox = self._outbox
        outbox.notify()
        if not self._batched.holding and outbox.full():
            # A whole batch is ready and nothing is on the wire: let the sender take it
            # now, so the request overlaps with whatever this task produces next.
            await anyio.lowlevel.checkpoint()
        while outbox.pending_bytes > self.max_buffer_bytes:  # back-pressure
            outbox.flush_now = True
            outbox.notify()
            await self._wait_progress()
            self._check_usable()

    def _unsent(self) -> bool:
        return bool(self._outbox.pending) or any(sender.holding for sender in self._senders)

    async def flush(self) -> None:
        """Wait until every queued event has been acknowledged by the gateway."""
        while self._unsent():
            self._check_usable()
            self._outbox.flush_now = True
            self._outbox.notify()
            await self._wait_progress()
        self._check_usable()

    async def flush_all(self) -> None:
        """Send everything queued from this task (the background sender is stopped), in
        batches: a stream cut short re-sends its unacknowledged lines as one."""
        self._batched.adopt(self._streamed.hand_over())
        await self._batched.send_all()

    async def wait_cancel_requested(self) -> None:
        """Return once a subscriber has asked to cancel the run."""
        await self._cancel_seen.wait()

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self.end_status is not None:
            raise StreamEnded(f"run {self.run_id} has ended ({self.end_status})")
        if self._task_group is None:
            raise RuntimeError("use the producer as `async with Producer(...) as run:`")

    async def _wait_progress(self) -> None:
        await self._progress.wait()

    async def _send_loop(self) -> None:
        try:
            while True:
                await self._outbox.wait()
                sender = self._sender
                await sender.drain()
                if sender.gave_up is not None:
                    # The batches take over at once, from the lines it did not get acked.
                    self._batched.adopt(self._streamed.hand_over())
                    await self._batched.drain()
        except GatewayError as exc:
            self._fail(exc)

    def _acknowledged(self, reply: dict[str, Any]) -> None:
        self._outbox.last_ack = time.monotonic()
        if reply.get("cancel_requested") and not self.cancel_requested:
            self.cancel_requested = True
            self._cancel_seen.set()
            if self.cancel_on_request and self._body_scope is not None:
                self._body_scope.cancel()
        progress, self._progress = self._progress, anyio.Event()
        progress.set()

    def _fail(self, exc: GatewayError) -> None:
        self._failure = exc
        progress, self._progress = self._progress, anyio.Event()
        progress.set()
        if self._body_scope is not None:
            self._body_scope.cancel()

    # ------------------------------------------------------------------ lease and END

    @property
    def renew_interval(self) -> float:
        if self._renew_interval is not None:
            return self._renew_interval
        lease = self.lease_expires_at - time.time()
        return max(0.05, min(2.0, lease / 3 if math.isfinite(lease) else 2.0))

    async def _renew_loop(self) -> None:
        try:
            while True:
                due = self._outbox.last_ack + self.renew_interval
                now = time.monotonic()
                if any(s.renewing for s in self._senders):  # an open stream's lines renew it
                    await anyio.sleep(self.renew_interval)
                    continue
                if now < due:
                    await anyio.sleep(due - now)
                    continue
                headers = self._calls.producer_headers()
                reply = await self._calls.request(f"{self._calls.run_path}/lease", b"", headers)
                self.lease_expires_at = float(reply["lease_expires_at"])
                self._acknowledged(reply)
        except GatewayError as exc:
            self._fail(exc)

    async def _end(self, status: EndStatus, error: Any) -> None:
        body: dict[str, Any] = {"status": status}
        if error is not None:
            body["error"] = error
        headers = self._calls.producer_headers()
        await self._calls.request(f"{self._calls.run_path}/end", orjson.dumps(body), headers)
        self.end_status = status

    async def _claim(self) -> None:
        claim = dict(self._claim_body)
        attempts = 0

        def body() -> bytes:
            nonlocal attempts
            attempts += 1
            if attempts > 1 and self._own_run_id:
                # An earlier claim's reply may be lost: the lease it took is ours (the run
                # id was made here and never shown), so take it over.
                claim["takeover"] = True
            return orjson.dumps(claim)

        try:
            reply = await self._calls.request("/v1/runs", body, {})
        except RunOwned as exc:
            if attempts > 1:
                raise RunOwned(
                    f"{exc} (a claim whose reply was lost may hold it: "
                    "takeover=True makes a claim safe to retry)"
                ) from None
            raise
        self._calls.token = str(reply["producer_token"])
        self.epoch = int(reply["epoch"])
        self.session_id = reply.get("session_id")
        self.lease_expires_at = float(reply["lease_expires_at"])
        self._outbox.last_ack = time.monotonic()


def _error_of(exc: BaseException, publish_message: bool) -> dict[str, Any]:
    """The END `error` object for an exception that ended the block: its type only, unless
    the producer opted in to publishing its message (which every reader of the run sees,
    and which may hold a prompt, a secret or an internal address)."""
    error: dict[str, Any] = {"type": type(exc).__name__}
    if publish_message:
        error["message"] = str(exc)[:1000]
    return error
