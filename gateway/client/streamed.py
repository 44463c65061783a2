"""Streamed appends (PROTOCOL 3.3): one POST whose ndjson body carries the queued events as
they come, one a line, for up to `stream_seconds` (or `batch_events` lines, or
`STREAM_BYTES`, or until a flush), numbered with `X-Producer-Seq`. httpx sends a whole
request body before it reads the reply, so the gateway's acknowledgements are read when
that body ends; a stream cut short is sent again from its first unacknowledged line (the
gateway answers the overlap with the first ids and appends only what is new).

It gives up, for the rest of the run, when the stream shows a proxy in between that does
not pass request bodies through: an answer 411, 415, 501 or 505 to the streamed POST, or
lines written over `BUFFERED_SPREAD_SECONDS` or more that the gateway acknowledged in a
single append (it received them all at once: buffered). Its unacknowledged lines then go
as the first batch (`BatchedSender.adopt`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

import anyio
import orjson

from ..sequence import HEADER as SEQ_HEADER
from .calls import (
    RETRY_STATUSES,
    Calls,
    RequestRefused,
    Retryable,
    StreamInterrupted,
    error_from,
    error_of_body,
)
from .outbox import Outbox

log = logging.getLogger("gateway.producer")

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


class StreamedSender:
    """The `Sender` of streamed appends (the default)."""

    def __init__(
        self,
        calls: Calls,
        outbox: Outbox,
        *,
        stream_seconds: float,
        renew_interval: Callable[[], float],
    ) -> None:
        self.stream_seconds = stream_seconds
        self.streams_sent = 0  # streamed requests answered
        self.fell_back: str | None = None  # why streaming was given up, if it was
        self._calls = calls
        self._outbox = outbox
        self._renew_interval = renew_interval
        # Lines written into streamed requests and not yet acknowledged, numbered from
        # the outbox's next number (re-sent first by the next stream: 3.1 makes the
        # overlap harmless).
        self._unacked: list[bytes] = []
        self._open = False  # a streamed body is being written (it renews the lease)

    @property
    def holding(self) -> bool:
        return bool(self._unacked)

    @property
    def renewing(self) -> bool:
        return self._open

    @property
    def gave_up(self) -> str | None:
        return self.fell_back

    def hand_over(self) -> tuple[bytes, ...]:
        """The lines written and not acknowledged, for the batches to send (this sender
        forgets them)."""
        lines = tuple(self._unacked)
        self._unacked.clear()
        return lines

    async def drain(self) -> None:
        outbox = self._outbox
        while self.fell_back is None and (outbox.pending or self._unacked):
            await self._send_stream()
        if self.fell_back is None:
            outbox.flush_now = False

    async def _send_stream(self) -> None:
        """One streamed append, re-sent from the first unacknowledged line after a
        connection error, a timeout, a 502/503/504 or an error line that asks for it
        (`backend_unavailable`), for up to `retry_timeout` seconds."""
        await self._calls.retried(self._stream_once)

    async def _stream_once(self) -> None:
        headers = {
            "Content-Type": NDJSON,
            **self._calls.producer_headers(),
            SEQ_HEADER: str(self._outbox.next_seq),
        }
        writes: list[float] = []  # when the body's writes that carried lines went out
        acks = 0
        done = False
        body = self._stream_body(writes)
        path = f"{self._calls.run_path}/events"
        async with self._calls.stream(path, body, headers) as response:
            status = response.status_code
            if status in STREAM_REFUSED_STATUSES:
                self._fall_back(f"a streamed append was answered {status}")
                return
            if status in RETRY_STATUSES:
                await response.aread()
                raise Retryable(response)
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
            raise StreamInterrupted("the streamed append's reply ended before its last line")
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
        self._open = True
        try:
            async for part in self._stream_lines(writes):
                yield part
        finally:
            self._open = False

    async def _stream_lines(self, writes: list[float]) -> AsyncIterator[bytes]:
        outbox = self._outbox
        deadline = time.monotonic() + self.stream_seconds
        size = sum(len(item) + 1 for item in self._unacked)
        last_write = time.monotonic()
        if self._unacked:
            yield b"\n".join(self._unacked) + b"\n"
            writes.append(last_write)
        while True:
            room = outbox.batch_events - len(self._unacked)
            if outbox.pending and room > 0 and size < STREAM_BYTES:
                lines: list[bytes] = []
                while outbox.pending and len(lines) < room and size < STREAM_BYTES:
                    item = outbox.pop()
                    size += len(item) + 1
                    lines.append(item)
                self._unacked.extend(lines)
                yield b"\n".join(lines) + b"\n"
                last_write = outbox.last_ack = time.monotonic()  # the lines renew the lease
                writes.append(last_write)
                continue
            now = time.monotonic()
            if room <= 0 or size >= STREAM_BYTES or outbox.flush_now or now >= deadline:
                return
            keepalive = last_write + self._renew_interval()
            with anyio.move_on_after(min(deadline, keepalive) - now):
                await outbox.wait()
            outbox.rearm()
            if not outbox.pending and time.monotonic() >= keepalive:
                yield b"\n"
                last_write = outbox.last_ack = time.monotonic()

    def _stream_acked(self, reply: dict[str, Any]) -> None:
        ids = reply["ids"]
        if not isinstance(ids, list) or not ids or len(ids) > len(self._unacked):
            raise RequestRefused(200, "bad_reply", f"an ack for {ids!r:.100}")
        del self._unacked[: len(ids)]
        self._outbox.acknowledged(len(ids), str(ids[-1]), reply)

    def _stream_error(self, reply: dict[str, Any]) -> None:
        """The error line that ended a streamed append (every line before it acked)."""
        code, detail = str(reply["error"]), str(reply.get("detail", ""))
        if code in _STREAM_RETRY_CODES:
            raise StreamInterrupted(f"{code}: {detail}")
        if code == "sequence_conflict":
            # Lines below the gateway's next number were applied, but their ids are no
            # longer known (3.1): they count as sent; the stream opens again from there.
            applied = (
                int(reply.get("next_seq", reply.get("expected_seq", 0))) - self._outbox.next_seq
            )
            if 0 < applied <= len(self._unacked):
                del self._unacked[:applied]
                self._outbox.applied(applied)
                return
        raise error_of_body(409 if code != "invalid_json" else 400, code, detail, reply)

    def _fall_back(self, reason: str) -> None:
        """Batches from now on: the producer hands what was not acknowledged to them."""
        log.warning("run %s: streamed appends off, batches instead: %s", self._calls.run_id, reason)
        self.fell_back = reason
