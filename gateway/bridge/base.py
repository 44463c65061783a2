"""The stream bridge contract: what every backend (memory, Redis) provides.

A run is an append-only log with one leased producer. Writers `claim` a run and present
the token on every write; readers `subscribe` with an optional cursor and receive
`StreamEvent`s, then exactly one terminal item (`End` or `StreamGap`), with `HEARTBEAT`
whenever they sat idle for the heartbeat interval.

A subscription is an async generator: whoever stops reading one early closes it
(`close_subscription`), which runs the backend's cleanup at once rather than whenever
the garbage collector gets to it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any, Final, Protocol, runtime_checkable

import anyio

from ..values import Claim, EndResult, EndStatus, LeaseState, PublishResult, RunInfo, StreamItem

# How long closing a subscription may take (seconds) before its reader gives up on it.
CLOSE_TIMEOUT: Final = 5.0


@runtime_checkable
class StreamBridge(Protocol):
    async def claim(
        self,
        run_id: str,
        *,
        session_id: str | None = None,
        lease_seconds: float | None = None,
        takeover: bool = False,
        input_message: Any = None,
        idempotency_key: str | None = None,
    ) -> Claim:
        """Take the producer lease of a run, creating its record when new.

        With a session, the same step opens the run's turn record (once; `input_message`
        is the operator's message it opens with, shaped by `sessions.shaping`) and gives
        it the session's next order. Appends and the END update the record in their own
        step too (docs/protocol.md §6).

        A run whose lease expired is taken over with `epoch + 1`; `takeover=True` also
        takes a live lease (fencing its holder). Raises RunOwned, StreamEnded.

        `idempotency_key` (needs `session_id`): a second claim with the same key in the
        session, while the first run lives or within its ended TTL, starts nothing and
        raises TurnExists with that run's id (`bridge.turn_keys`); a `takeover` claim of
        that same run is its producer taking the turn back and goes on.
        """
        ...

    async def renew_lease(
        self,
        run_id: str,
        *,
        producer_token: str,
        lease_seconds: float | None = None,
        stream: str | None = None,
    ) -> LeaseState:
        """Extend the lease without writing. Raises ProducerFenced, StreamEnded.

        `stream`: the mark of a streamed append renewing; it becomes the run's current
        stream, the only one whose drop may `cut_lease`. A renewal without one (`POST
        …/lease`) is noted: a drop seen before it cuts nothing.
        """
        ...

    async def cut_lease(
        self,
        run_id: str,
        *,
        producer_token: str,
        stream: str,
        grace: float,
        last_id: str | None = None,
        dropped_ago: float = 0.0,
    ) -> float | None:
        """A streamed append's connection dropped (`dropped_ago` seconds ago): cut its
        producer's lease to end `grace` seconds from now (never lengthened), so the
        liveness path ends the run `producer_lost` then unless the producer writes again
        (any write renews the whole lease). Only the run's current stream
        (`renew_lease(stream=...)`) of that token may cut, and only if nothing was
        appended after `last_id` (the last event that stream appended; None: not
        checked) and the lease was not renewed from elsewhere since the drop: a producer
        already back keeps its lease however quickly it came back. Returns when the lease
        now ends (unix seconds, in this process's clock), or None when it was not this
        stream's to cut."""
        ...

    async def publish(
        self, run_id: str, event: str, data: Any, *, producer_token: str
    ) -> PublishResult:
        """Append one event. Raises ProducerFenced, StreamEnded."""
        ...

    async def publish_many(
        self,
        run_id: str,
        events: Sequence[tuple[str, Any]],
        *,
        producer_token: str,
        seq: int | None = None,
    ) -> PublishResult:
        """Append a batch atomically in one round trip. Raises ProducerFenced, StreamEnded.

        `seq` numbers the batch (its first event is the producer's `seq`-th of this lease
        epoch, see `gateway.sequence`): events applied before are not appended again;
        `ids` lists every event's id (first-assigned ones for those, counted in
        `already_applied`). Raises SequenceGap when `seq` is past the next expected
        number, SequenceConflict when applied events' ids are no longer known.
        """
        ...

    async def publish_end(
        self,
        run_id: str,
        status: EndStatus,
        error: Any = None,
        *,
        producer_token: str | None,
    ) -> EndResult:
        """Append the END entry; idempotent when the log already ends.

        `producer_token=None` is the unowned recovery END: it succeeds only when the
        lease has expired, and on a missing stream it is a no-op that creates nothing.
        """
        ...

    def subscribe(
        self,
        run_id: str,
        last_event_id: str | None = None,
        heartbeat_interval: float | None = None,
    ) -> AsyncGenerator[StreamItem, None]:
        """Replay from the cursor, then follow live (cursor rules: docs/protocol.md §2.2)."""
        ...

    def subscribe_batches(
        self,
        run_id: str,
        last_event_id: str | None = None,
        heartbeat_interval: float | None = None,
    ) -> AsyncGenerator[Sequence[StreamItem], None]:
        """`subscribe`, but every step yields all the items ready at once, in order.

        The same items as `subscribe` in the same order, grouped: each list is non-empty
        and a terminal item is the last of its list. This is what the SSE response reads:
        one step of the reader, one socket write, however many events arrived.
        """
        ...

    async def request_cancel(self, run_id: str) -> bool:
        """Flag the run for cancellation; False when the run is unknown."""
        ...

    async def get_run(self, run_id: str) -> RunInfo | None:
        """The run record, or None when the run is unknown."""
        ...

    async def open_stream(
        self, run_id: str, last_event_id: str | None = None
    ) -> tuple[RunInfo | None, Callable[[], AsyncGenerator[Sequence[StreamItem], None]]]:
        """`get_run`, and what `subscribe_batches(run_id, last_event_id)` would give
        (call it at most once), for a reader that checks the run before it streams: on
        Redis both come from one round trip (the record and the subscription's first
        read). Not calling it costs nothing."""
        ...

    async def stream_exists(self, run_id: str) -> bool: ...

    async def cleanup(self, run_id: str, delay: float = 0) -> None:
        """Remove the retained log (after `delay` seconds); readers get a gap or END."""
        ...

    async def ping(self) -> None:
        """Raise BackendUnavailable when the backend cannot be reached."""
        ...

    async def close(self) -> None:
        """Wake every reader (unfinished ones get a `bridge_closed` gap) and release I/O."""
        ...


async def one_by_one(
    batches: AsyncGenerator[Sequence[StreamItem], None],
) -> AsyncGenerator[StreamItem, None]:
    """The items of `batches` one at a time (`subscribe` from `subscribe_batches`).

    Closing this closes `batches`, so the backend's cleanup runs.
    """
    try:
        async for batch in batches:
            for item in batch:
                yield item
    finally:
        await batches.aclose()


async def close_subscription(items: AsyncGenerator[Any, None]) -> None:
    """Close a subscription (or a generator over one), shielded and bounded: its cleanup
    runs even when the caller is being cancelled, and a stuck one costs at most
    `CLOSE_TIMEOUT`."""
    with anyio.move_on_after(CLOSE_TIMEOUT, shield=True):
        await items.aclose()
