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
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Self

import anyio
import anyio.lowlevel
import httpx
import orjson
from anyio.abc import TaskGroup
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_delay,
    wait_exponential_jitter,
)

from ..errors import (
    BackendUnavailable,
    Forbidden,
    GatewayError,
    InvalidInput,
    PayloadTooLarge,
    ProducerFenced,
    RunNotFound,
    RunOwned,
    SequenceConflict,
    SequenceGap,
    StreamEnded,
    TokenExpired,
    TurnExists,
    Unauthorized,
)
from ..names import check_event_name, check_run_id, check_session_id
from ..sequence import HEADER as SEQ_HEADER
from ..values import EndStatus

log = logging.getLogger("gateway.producer")

# Answers after which a request may be re-sent: the gateway or a proxy in front of it
# could not serve it now (a numbered append may have been applied; the retry says so).
RETRY_STATUSES: Final = frozenset({429, 502, 503, 504})
MAX_RETRY_AFTER: Final = 5.0
MAX_CACHED_NAMES: Final = 256  # seconds; a longer Retry-After is capped to this
NDJSON: Final = "application/x-ndjson"
# Answers to a streamed append that say something in between does not take one (a
# proxy that wants a Content-Length, or that does not know the body's type): batches.
STREAM_REFUSED_STATUSES: Final = frozenset({411, 415, 501, 505})
# A streamed body whose writes spread over this long but which the gateway acknowledged
# in one append reached it all at once: a proxy in between buffered it.
BUFFERED_SPREAD_SECONDS: Final = 0.25
# Bytes of lines one streamed request carries at most: unacknowledged lines are re-sent
# as one batch after a fallback, so they must fit the gateway's body limit (4 MiB).
STREAM_BYTES: Final = 1024 * 1024
# Error lines of a streamed append after which the stream is simply opened again.
_STREAM_RETRY_CODES: Final = frozenset(
    {"backend_unavailable", "bridge_closed", "body_idle", "overloaded"}
)

_ERRORS_BY_CODE: Final[dict[str, type[GatewayError]]] = {
    "fenced": ProducerFenced,
    "ended": StreamEnded,
    "run_ended": StreamEnded,
    "run_owned": RunOwned,
    "run_not_found": RunNotFound,
    "too_large": PayloadTooLarge,
    "unauthorized": Unauthorized,
    "token_expired": TokenExpired,
    "forbidden": Forbidden,
}


class RequestRefused(GatewayError):
    """The gateway answered with an error this client has no narrower type for."""

    code = "request_refused"

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(f"{status} {code}: {detail}")
        self.status = status
        self.code = code


class _Retryable(Exception):
    """A response that asks for the request again (a 503 and its kin)."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"{response.status_code} {response.text[:200]}")
        self.status = response.status_code
        self.retry_after = retry_after_seconds(response.headers.get("retry-after", ""))


def retry_after_seconds(value: str) -> float:
    """A `Retry-After` of delay-seconds; anything else (an HTTP date, garbage, a digit
    that is not ASCII such as U+0661 or "²", which `str.isdigit` accepts) is 0: the normal
    backoff applies."""
    value = value.strip()
    if value.isascii() and value.isdigit() and len(value) <= 9:
        return float(value)
    return 0.0


class _StreamInterrupted(Exception):
    """A streamed append ended early in a way that asks for it again (an error line such
    as `backend_unavailable`, or a reply cut before its last line)."""


def _retryable(exc: BaseException) -> bool:
    # Every transport failure: the request may not have arrived, or its reply was lost.
    return isinstance(
        exc, _Retryable | _StreamInterrupted | httpx.TransportError
    ) and not isinstance(exc, httpx.UnsupportedProtocol | httpx.LocalProtocolError)


def error_from(response: httpx.Response) -> GatewayError:
    """The gateway error an error response stands for."""
    try:
        body = response.json()
        code, detail = str(body["error"]), str(body.get("detail", ""))
    except (ValueError, KeyError, TypeError, AttributeError):  # not the gateway's error body
        body, code, detail = {}, "http_error", response.text[:200]
    return _error_of_body(response.status_code, code, detail, body)


def _error_of_body(status: int, code: str, detail: str, body: dict[str, Any]) -> GatewayError:
    if code == "sequence_gap":
        return SequenceGap(detail, int(body.get("expected_seq", 0)))
    if code == "sequence_conflict":
        return SequenceConflict(detail, int(body.get("expected_seq", 0)))
    if code == "turn_exists":
        return TurnExists(str(body.get("run_id", "")))
    kind = _ERRORS_BY_CODE.get(code)
    if kind is not None:
        return kind(detail or code)
    if status in (400, 422) or code in ("invalid_input", "invalid_json"):
        return InvalidInput(detail or code)
    return RequestRefused(status, code, detail)


@dataclass(frozen=True, slots=True)
class _Batch:
    seq: int
    items: tuple[bytes, ...]  # each `{"event": ..., "data": ...}`, encoded

    def body(self) -> bytes:
        return b'{"events":[' + b",".join(self.items) + b"]}"


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
        self._base_url = base_url.rstrip("/")
        # Every request is a POST with a JSON body (or none): the gateway asks for the type.
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._client = client
        self._own_client = client is None
        self._request_timeout = request_timeout
        self.cancel_on_request = cancel_on_request
        self.cancelled_status: EndStatus = cancelled_status
        self.batch_window = batch_window
        self.batch_bytes = batch_bytes
        self.batch_events = batch_events
        self.max_buffer_bytes = max_buffer_bytes
        self._renew_interval = renew_interval
        self.retry_timeout = retry_timeout
        self.end_timeout = end_timeout
        # Streamed appends (one request carries the events of up to `stream_seconds`);
        # False after a proxy in between showed it buffers request bodies.
        self.streaming = streaming
        self.stream_seconds = stream_seconds
        self.fell_back: str | None = None  # why streaming was given up, if it was
        self.publish_error_messages = publish_error_messages
        # Claim state.
        self.token = ""
        self.epoch = 0
        self.lease_expires_at = 0.0
        # Send state: queued events, the batch on the wire (kept until acknowledged, so
        # whoever sends next re-sends it with the same number), the next number.
        self._pending: deque[bytes] = deque()
        self._pending_bytes = 0
        self._inflight: _Batch | None = None
        # Lines written into streamed requests and not yet acknowledged, numbered from
        # `_next_seq` (re-sent first by the next stream: 3.1 makes the overlap harmless).
        self._unacked: list[bytes] = []
        self._next_seq = 1  # the number of the first event not yet acknowledged
        self.streams_sent = 0  # streamed requests answered
        self._stream_open = False  # a streamed body is being written (it renews the lease)
        self.events_sent = 0  # acknowledged events
        self.batches_sent = 0  # acknowledged batches
        self.retries = 0  # re-sent requests (all kinds)
        self.last_event_id: str | None = None
        self.end_status: EndStatus | None = None
        self.cancel_requested = False
        self._failure: GatewayError | None = None
        self._last_ack = 0.0
        self._task_group: TaskGroup | None = None
        self._body_scope: anyio.CancelScope | None = None
        self._wake = anyio.Event()  # queued events, a flush, or a full batch
        self._progress = anyio.Event()  # a batch was acknowledged (replaced each time)
        self._cancel_seen = anyio.Event()
        self._flush_now = False
        self._prefixes: dict[str, bytes] = {}  # event name -> `{"event":<name>,"data":`

    # ------------------------------------------------------------------ the block

    async def __aenter__(self) -> Self:
        if self.token:
            raise RuntimeError("a Producer is good for one run: make a new one")
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self._request_timeout)
        try:
            await self._claim()
            self._task_group = anyio.create_task_group()
            await self._task_group.__aenter__()
        except BaseException:
            await self._close_client()
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
            await self._close_client()
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

    async def _close_client(self) -> None:
        if self._own_client and self._client is not None:
            with anyio.CancelScope(shield=True):
                await self._client.aclose()
            self._client = None

    # ------------------------------------------------------------------ sending

    async def send(self, event: str, data: Any = None) -> None:
        """Queue one event (validated and encoded now); waits only when the queue is full."""
        self._queue(event, data)
        await self._queued()

    async def send_many(self, events: Iterable[tuple[str, Any]]) -> None:
        """Queue events in order; they go out in as few batches as the limits allow."""
        for event, data in events:
            self._queue(event, data)
        await self._queued()

    def _queue(self, event: str, data: Any) -> None:
        self._check_usable()
        prefix = self._prefixes.get(event)
        if prefix is None:  # each name is validated and encoded once
            prefix = b'{"event":' + orjson.dumps(check_event_name(event)) + b',"data":'
            if len(self._prefixes) < MAX_CACHED_NAMES:
                self._prefixes[event] = prefix
        try:
            item = prefix + orjson.dumps(data) + b"}"
        except TypeError as exc:  # orjson.JSONEncodeError
            raise InvalidInput(f"data is not JSON-serialisable: {exc}") from None
        self._pending.append(item)
        self._pending_bytes += len(item)

    async def _queued(self) -> None:
        self._wake.set()
        if self._inflight is None and self._full():
            # A whole batch is ready and nothing is on the wire: let the sender take it
            # now, so the request overlaps with whatever this task produces next.
            await anyio.lowlevel.checkpoint()
        while self._pending_bytes > self.max_buffer_bytes:  # back-pressure
            self._flush_now = True
            self._wake.set()
            await self._wait_progress()
            self._check_usable()

    def _unsent(self) -> bool:
        return bool(self._pending or self._unacked) or self._inflight is not None

    async def flush(self) -> None:
        """Wait until every queued event has been acknowledged by the gateway."""
        while self._unsent():
            self._check_usable()
            self._flush_now = True
            self._wake.set()
            await self._wait_progress()
        self._check_usable()

    async def flush_all(self) -> None:
        """Send everything queued from this task (the background sender is stopped), in
        batches: a stream cut short re-sends its unacknowledged lines as one."""
        self._unacked_to_batch()
        while self._inflight is not None or self._pending:
            await self._send_batch()

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

    def _full(self) -> bool:
        return len(self._pending) >= self.batch_events or self._pending_bytes >= self.batch_bytes

    async def _send_loop(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake = anyio.Event()
                while self.streaming and (self._pending or self._unacked):
                    await self._send_stream()
                if self.streaming:
                    self._flush_now = False
                    continue
                if not (self._flush_now or self._full()):
                    # Coalesce: what arrives within the window goes in the same request.
                    with anyio.move_on_after(self.batch_window):
                        while not (self._flush_now or self._full()):
                            await self._wake.wait()
                            self._wake = anyio.Event()
                self._flush_now = False
                # Whatever arrived while a request was on the wire goes at once.
                while self._pending or self._inflight is not None:
                    await self._send_batch()
        except GatewayError as exc:
            self._fail(exc)

    def _take_batch(self) -> _Batch:
        items: list[bytes] = []
        size = 0
        while self._pending and len(items) < self.batch_events:
            item = self._pending[0]
            if items and size + len(item) > self.batch_bytes:
                break
            items.append(self._pending.popleft())
            size += len(item)
        self._pending_bytes -= size
        return _Batch(self._next_seq, tuple(items))

    async def _send_batch(self) -> None:
        if self._inflight is None:
            self._inflight = self._take_batch()
        batch = self._inflight
        headers = {"X-Producer-Token": self.token, SEQ_HEADER: str(batch.seq)}
        reply = await self._request(f"/v1/runs/{self.run_id}/events", batch.body(), headers)
        ids = reply.get("ids", [])
        if len(ids) != len(batch.items):
            raise RequestRefused(200, "bad_reply", f"{len(ids)} ids for {len(batch.items)}")
        self._inflight = None
        self._next_seq = batch.seq + len(batch.items)
        self.events_sent += len(batch.items)
        self.batches_sent += 1
        self.last_event_id = ids[-1]
        self._acknowledged(reply)

    # ------------------------------------------------------------------ streamed appends

    async def _send_stream(self) -> None:
        """One streamed append (PROTOCOL 3.3), re-sent from the first unacknowledged line
        after a connection error, a timeout, a 502/503/504 or an error line that asks
        for it (`backend_unavailable`), for up to `retry_timeout` seconds."""
        try:
            async for attempt in self._retrying():
                with attempt:
                    await self._stream_once()
                    return
        except (_Retryable, _StreamInterrupted, httpx.TransportError) as exc:
            raise BackendUnavailable(
                f"gateway unavailable for {self.retry_timeout} s: {exc}"
            ) from exc

    async def _stream_once(self) -> None:
        assert self._client is not None
        headers = {
            **self._headers,
            "Content-Type": NDJSON,
            "X-Producer-Token": self.token,
            SEQ_HEADER: str(self._next_seq),
        }
        writes: list[float] = []  # when the body's writes that carried lines went out
        url = f"{self._base_url}/v1/runs/{self.run_id}/events"
        acks = 0
        done = False
        body = self._stream_body(writes)
        async with self._client.stream("POST", url, content=body, headers=headers) as response:
            status = response.status_code
            if status in STREAM_REFUSED_STATUSES:
                self._fall_back(f"a streamed append was answered {status}")
                return
            if status in RETRY_STATUSES:
                await response.aread()
                raise _Retryable(response)
            if status >= 400:
                await response.aread()
                raise error_from(response)
            if response.headers.get("content-type", "").partition(";")[0] != NDJSON:
                await response.aread()  # not the gateway answering (a proxy's page?)
                raise RequestRefused(status, "bad_reply", response.text[:200])
            self.streams_sent += 1
            async for raw in response.aiter_lines():
                if not raw.strip():
                    continue
                try:
                    reply = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    raise RequestRefused(status, "bad_reply", raw[:200]) from None
                if not isinstance(reply, dict):
                    raise RequestRefused(status, "bad_reply", raw[:200])
                if "ids" in reply:
                    acks += 1
                    self._stream_acked(reply)
                elif reply.get("done") is True:
                    done = True
                elif "error" in reply:
                    self._stream_error(reply)
                    return
        if not done:
            raise _StreamInterrupted("the streamed append's reply ended before its last line")
        if acks == 1 and len(writes) > 1 and writes[-1] - writes[0] >= BUFFERED_SPREAD_SECONDS:
            self._fall_back(
                f"lines written over {writes[-1] - writes[0]:.2f} s reached the gateway "
                "together (a proxy buffers request bodies)"
            )

    async def _stream_body(self, writes: list[float]) -> AsyncIterator[bytes]:
        """The lines of one streamed request: the unacknowledged ones first, then what is
        queued as it comes, until `stream_seconds` passed, `batch_events` lines or
        `STREAM_BYTES` went out, or a flush asks for the replies. A blank line (which
        renews the lease) goes out when nothing else did for `renew_interval`."""
        self._stream_open = True
        try:
            async for part in self._stream_lines(writes):
                yield part
        finally:
            self._stream_open = False

    async def _stream_lines(self, writes: list[float]) -> AsyncIterator[bytes]:
        deadline = time.monotonic() + self.stream_seconds
        size = sum(len(item) + 1 for item in self._unacked)
        last_write = time.monotonic()
        if self._unacked:
            yield b"\n".join(self._unacked) + b"\n"
            writes.append(last_write)
        while True:
            room = self.batch_events - len(self._unacked)
            if self._pending and room > 0 and size < STREAM_BYTES:
                lines: list[bytes] = []
                while self._pending and len(lines) < room and size < STREAM_BYTES:
                    item = self._pending.popleft()
                    self._pending_bytes -= len(item)
                    size += len(item) + 1
                    lines.append(item)
                self._unacked.extend(lines)
                yield b"\n".join(lines) + b"\n"
                last_write = self._last_ack = time.monotonic()  # the lines renew the lease
                writes.append(last_write)
                continue
            now = time.monotonic()
            if room <= 0 or size >= STREAM_BYTES or self._flush_now or now >= deadline:
                return
            keepalive = last_write + self.renew_interval
            with anyio.move_on_after(min(deadline, keepalive) - now):
                await self._wake.wait()
            self._wake = anyio.Event()
            if not self._pending and time.monotonic() >= keepalive:
                yield b"\n"
                last_write = self._last_ack = time.monotonic()

    def _stream_acked(self, reply: dict[str, Any]) -> None:
        ids = reply["ids"]
        if not isinstance(ids, list) or not ids or len(ids) > len(self._unacked):
            raise RequestRefused(200, "bad_reply", f"an ack for {ids!r:.100}")
        del self._unacked[: len(ids)]
        self._next_seq += len(ids)
        self.events_sent += len(ids)
        self.batches_sent += 1
        self.last_event_id = str(ids[-1])
        self._acknowledged(reply)

    def _stream_error(self, reply: dict[str, Any]) -> None:
        """The error line that ended a streamed append (every line before it acked)."""
        code, detail = str(reply["error"]), str(reply.get("detail", ""))
        if code in _STREAM_RETRY_CODES:
            raise _StreamInterrupted(f"{code}: {detail}")
        if code == "sequence_conflict":
            # Lines below the gateway's next number were applied, but their ids are no
            # longer known (3.1): they count as sent; the stream opens again from there.
            applied = int(reply.get("next_seq", reply.get("expected_seq", 0))) - self._next_seq
            if 0 < applied <= len(self._unacked):
                del self._unacked[:applied]
                self._next_seq += applied
                self.events_sent += applied
                return
        raise _error_of_body(409 if code != "invalid_json" else 400, code, detail, reply)

    def _fall_back(self, reason: str) -> None:
        """Batched POSTs from now on: what was not acknowledged goes as the next batch."""
        log.warning("run %s: streamed appends off, batches instead: %s", self.run_id, reason)
        self.streaming = False
        self.fell_back = reason
        self._unacked_to_batch()

    def _unacked_to_batch(self) -> None:
        if self._unacked:
            assert self._inflight is None  # one mode at a time
            self._inflight = _Batch(self._next_seq, tuple(self._unacked))
            self._unacked.clear()

    def _acknowledged(self, reply: dict[str, Any]) -> None:
        self._last_ack = time.monotonic()
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
                due = self._last_ack + self.renew_interval
                now = time.monotonic()
                if self._stream_open:  # its lines and blank lines renew the lease
                    await anyio.sleep(self.renew_interval)
                    continue
                if now < due:
                    await anyio.sleep(due - now)
                    continue
                headers = {"X-Producer-Token": self.token}
                reply = await self._request(f"/v1/runs/{self.run_id}/lease", b"", headers)
                self.lease_expires_at = float(reply["lease_expires_at"])
                self._acknowledged(reply)
        except GatewayError as exc:
            self._fail(exc)

    async def _end(self, status: EndStatus, error: Any) -> None:
        body: dict[str, Any] = {"status": status}
        if error is not None:
            body["error"] = error
        headers = {"X-Producer-Token": self.token}
        await self._request(f"/v1/runs/{self.run_id}/end", orjson.dumps(body), headers)
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
            reply = await self._request("/v1/runs", body, {})
        except RunOwned as exc:
            if attempts > 1:
                raise RunOwned(
                    f"{exc} (a claim whose reply was lost may hold it: "
                    "takeover=True makes a claim safe to retry)"
                ) from None
            raise
        self.token = str(reply["producer_token"])
        self.epoch = int(reply["epoch"])
        self.session_id = reply.get("session_id")
        self.lease_expires_at = float(reply["lease_expires_at"])
        self._last_ack = time.monotonic()

    # ------------------------------------------------------------------ HTTP

    def _retrying(self) -> AsyncRetrying:
        return AsyncRetrying(
            retry=retry_if_exception(_retryable),
            wait=self._wait,
            stop=stop_after_delay(self.retry_timeout),
            sleep=anyio.sleep,
            before_sleep=self._count_retry,
            reraise=True,
        )

    _backoff: Final = wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.05)

    def _wait(self, state: RetryCallState) -> float:
        backoff = float(self._backoff(state))
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, _Retryable):
            return max(backoff, min(exc.retry_after, MAX_RETRY_AFTER))
        return backoff

    def _count_retry(self, state: RetryCallState) -> None:
        self.retries += 1

    async def _request(
        self, path: str, body: bytes | Callable[[], bytes], headers: dict[str, str]
    ) -> dict[str, Any]:
        """POST with retries (safe: every request this client sends is idempotent)."""
        make = body if callable(body) else lambda: body
        try:
            async for attempt in self._retrying():
                with attempt:
                    return await self._post(path, make(), headers)
        except (_Retryable, httpx.TransportError) as exc:
            raise BackendUnavailable(
                f"gateway unavailable for {self.retry_timeout} s: {exc}"
            ) from exc
        raise AssertionError("unreachable")  # AsyncRetrying either returns or raises

    async def _post(self, path: str, body: bytes, headers: dict[str, str]) -> dict[str, Any]:
        assert self._client is not None
        response = await self._client.post(
            self._base_url + path, content=body, headers={**self._headers, **headers}
        )
        if response.status_code in RETRY_STATUSES:
            raise _Retryable(response)
        if response.status_code >= 400:
            raise error_from(response)
        try:
            reply = response.json()
        except ValueError:
            reply = None
        if not isinstance(reply, dict):  # not the gateway answering (a proxy's page?)
            raise RequestRefused(response.status_code, "bad_reply", response.text[:200])
        return reply


def _error_of(exc: BaseException, publish_message: bool) -> dict[str, Any]:
    """The END `error` object for an exception that ended the block: its type only, unless
    the producer opted in to publishing its message (which every reader of the run sees,
    and which may hold a prompt, a secret or an internal address)."""
    error: dict[str, Any] = {"type": type(exc).__name__}
    if publish_message:
        error["message"] = str(exc)[:1000]
    return error
