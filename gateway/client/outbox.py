"""What the producer and its senders share: the events queued by `send` and not yet taken
by a sender (each encoded once, as the `{"event": ..., "data": ...}` of a batch and the
line of a streamed append alike), the number of the first event not yet acknowledged,
the wake-up that tells the sender there is work, and the counts of what the gateway
acknowledged."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Final

import anyio
import orjson

from ..errors import InvalidInput
from ..names import check_event_name

# Event names whose encoded prefix is kept (a producer uses a handful; the cap keeps a
# producer that makes names up from growing without bound).
MAX_CACHED_NAMES: Final = 256


class Outbox:
    """The queue of one run's events and the numbering both senders continue."""

    def __init__(
        self,
        *,
        batch_events: int,
        batch_bytes: int,
        on_reply: Callable[[dict[str, Any]], None],
    ) -> None:
        self.batch_events = batch_events
        self.batch_bytes = batch_bytes
        self.pending: deque[bytes] = deque()
        self.pending_bytes = 0
        self.next_seq = 1  # the number of the first event not yet acknowledged
        self.flush_now = False  # a flush (or back-pressure) wants the acks now
        self.events_sent = 0  # acknowledged events
        self.batches_sent = 0  # acknowledged appends
        self.last_event_id: str | None = None
        # When the gateway last heard from this producer (a reply, or a line written into
        # an open stream): the lease was renewed then.
        self.last_ack = 0.0
        self._on_reply = on_reply
        self._wake = anyio.Event()  # queued events, a flush, or a full batch
        self._prefixes: dict[str, bytes] = {}  # event name -> `{"event":<name>,"data":`

    def put(self, event: str, data: Any) -> None:
        """Queue one event, validated and encoded now."""
        prefix = self._prefixes.get(event)
        if prefix is None:  # each name is validated and encoded once
            prefix = b'{"event":' + orjson.dumps(check_event_name(event)) + b',"data":'
            if len(self._prefixes) < MAX_CACHED_NAMES:
                self._prefixes[event] = prefix
        try:
            item = prefix + orjson.dumps(data) + b"}"
        except TypeError as exc:  # orjson.JSONEncodeError
            raise InvalidInput(f"data is not JSON-serialisable: {exc}") from None
        self.pending.append(item)
        self.pending_bytes += len(item)

    def pop(self) -> bytes:
        """The oldest queued event, taken by a sender."""
        item = self.pending.popleft()
        self.pending_bytes -= len(item)
        return item

    def full(self) -> bool:
        return len(self.pending) >= self.batch_events or self.pending_bytes >= self.batch_bytes

    def notify(self) -> None:
        self._wake.set()

    async def wait(self) -> None:
        """Until `notify` was called (since the last wait ended)."""
        await self._wake.wait()
        self.rearm()

    def rearm(self) -> None:
        self._wake = anyio.Event()

    def applied(self, count: int) -> None:
        """The next `count` events were applied by the gateway."""
        self.next_seq += count
        self.events_sent += count

    def acknowledged(self, count: int, last_id: Any, reply: dict[str, Any]) -> None:
        """One append of the next `count` events was acknowledged with `reply`."""
        self.applied(count)
        self.batches_sent += 1
        self.last_event_id = last_id
        self._on_reply(reply)
