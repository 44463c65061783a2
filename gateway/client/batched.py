"""Numbered batches: the events queued within `batch_window` seconds of the first go in one
`POST /v1/runs/{id}/events` (sooner when `batch_bytes`/`batch_events` are reached, or at
once after a request that was in flight), numbered with `X-Producer-Seq`. The batch on
the wire is kept until acknowledged, so whoever sends next re-sends it with the same
number (the gateway applies a numbered event once)."""

from __future__ import annotations

from dataclasses import dataclass

import anyio

from ..sequence import HEADER as SEQ_HEADER
from .calls import Calls, RequestRefused
from .outbox import Outbox


@dataclass(frozen=True, slots=True)
class Batch:
    seq: int
    items: tuple[bytes, ...]  # each `{"event": ..., "data": ...}`, encoded

    def body(self) -> bytes:
        return b'{"events":[' + b",".join(self.items) + b"]}"


class BatchedSender:
    """The `Sender` of numbered batches (with `streaming=False`, or after a fallback)."""

    renewing = False  # a batch is one short request: the lease loop renews in between
    gave_up = None  # the fallback of last resort

    def __init__(self, calls: Calls, outbox: Outbox, *, batch_window: float) -> None:
        self.batch_window = batch_window
        self._calls = calls
        self._outbox = outbox
        self._inflight: Batch | None = None

    @property
    def holding(self) -> bool:
        return self._inflight is not None

    def adopt(self, lines: tuple[bytes, ...]) -> None:
        """Send `lines` (another sender's unacknowledged events, numbered from the
        outbox's next number) as the next batch."""
        if lines:
            assert self._inflight is None  # one mode at a time
            self._inflight = Batch(self._outbox.next_seq, lines)

    async def drain(self) -> None:
        outbox = self._outbox
        if not (outbox.flush_now or outbox.full()):
            # Coalesce: what arrives within the window goes in the same request.
            with anyio.move_on_after(self.batch_window):
                while not (outbox.flush_now or outbox.full()):
                    await outbox.wait()
        outbox.flush_now = False
        # Whatever arrived while a request was on the wire goes at once.
        await self.send_all()

    async def send_all(self) -> None:
        """Send the batch on the wire and everything queued, in as few batches as the
        limits allow."""
        while self._outbox.pending or self._inflight is not None:
            await self._send_batch()

    def _take_batch(self) -> Batch:
        outbox = self._outbox
        items: list[bytes] = []
        size = 0
        while outbox.pending and len(items) < outbox.batch_events:
            item = outbox.pending[0]
            if items and size + len(item) > outbox.batch_bytes:
                break
            items.append(outbox.pop())
            size += len(item)
        return Batch(outbox.next_seq, tuple(items))

    async def _send_batch(self) -> None:
        if self._inflight is None:
            self._inflight = self._take_batch()
        batch = self._inflight
        headers = {**self._calls.producer_headers(), SEQ_HEADER: str(batch.seq)}
        path = f"{self._calls.run_path}/events"
        reply = await self._calls.request(path, batch.body(), headers)
        ids = reply.get("ids", [])
        if len(ids) != len(batch.items):
            raise RequestRefused(200, "bad_reply", f"{len(ids)} ids for {len(batch.items)}")
        self._inflight = None
        self._outbox.acknowledged(len(batch.items), ids[-1], reply)
