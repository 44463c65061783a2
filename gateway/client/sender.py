"""The protocol a way of sending the producer's queued events implements: `streamed.py`
(one ndjson request carrying the events as they are queued, PROTOCOL 3.3) and
`batched.py` (one numbered batch per request). The producer's background task calls
`drain` each time the outbox wakes it; a sender that gives up (a proxy in between that
does not pass request bodies through) says why, and the batches take over."""

from __future__ import annotations

from typing import Protocol


class Sender(Protocol):
    @property
    def holding(self) -> bool:
        """Events taken from the outbox and not yet acknowledged (re-sent next time)."""
        ...

    @property
    def renewing(self) -> bool:
        """A request is open whose writes renew the lease (no `POST …/lease` needed)."""
        ...

    @property
    def gave_up(self) -> str | None:
        """Why this sender is not to be used for the rest of the run, if it is not."""
        ...

    async def drain(self) -> None:
        """Send what the outbox holds (coalescing as this sender does), until it is empty
        or the sender gave up."""
        ...
