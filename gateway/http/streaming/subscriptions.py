"""Bookkeeping of open subscriptions (SSE responses and `/wait` calls) in this process.

The registry counts what is open (tests assert the SSE count returns to zero after a
client disconnects), knows which runs have someone waiting on them (the liveness
monitor checks exactly those runs), and carries the drain signal that ends every open
SSE response on graceful shutdown.

It also keeps each reader to its share: every subscription is counted under the
`share_key` of whoever opened it (`auth.Principal`: an API key, a token's subject), and
`admit` refuses (`TooManyStreams`, 429) one more for a reader already holding
`subject_limit` of them, so one token cannot take every connection of the process
(`Settings.subject_stream_share` of the connection cap). A caller admits and then
tracks with no `await` in between, so a burst of requests cannot all pass the check
before any is counted. Open mode names no reader: only the connection cap applies.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from typing import Final, Literal

import anyio

from ...errors import TooManyStreams

SubscriptionKind = Literal["sse", "wait"]
# The request scope key under which the reader's share key (`Principal.share_key`) goes
# from authentication (`access.subscriber`) to the stream the request opens.
READER_KEY: Final = "gateway.reader"


class SubscriptionRegistry:
    """Counts open subscriptions per kind and per run; single event loop, no locks."""

    def __init__(self, subject_limit: int | None = None) -> None:
        self._by_kind: Counter[str] = Counter()
        self._by_run: Counter[str] = Counter()
        self._by_subject: Counter[str] = Counter()
        self._subject_limit = subject_limit  # None: no per-reader share
        self._draining = anyio.Event()
        self._changed = anyio.Event()
        self._drain_callbacks: set[Callable[[], None]] = set()

    def track(
        self, run_id: str | None, kind: SubscriptionKind, subject: str | None = None
    ) -> _Tracked:
        """Count one subscription for the duration of the `with` block (`run_id` None:
        one that follows no single run, a session feed; it names its runs with
        `watch_run` as it reaches them), under the reader `subject` (a share key)."""
        return _Tracked(self, run_id, kind, subject)

    def admit(self, subject: str | None) -> None:
        """Raise `TooManyStreams` when `subject` already holds its whole share."""
        limit = self._subject_limit
        if subject is not None and limit is not None and self._by_subject[subject] >= limit:
            raise TooManyStreams(
                f"this reader already holds {limit} open streams on this gateway process "
                "(its share); close one or retry later"
            )

    def open_of(self, subject: str) -> int:
        """Open subscriptions counted under the reader `subject`."""
        return self._by_subject[subject]

    def watch_run(self, run_id: str) -> None:
        """Count a run as watched (liveness) without counting a subscription."""
        self._by_run[run_id] += 1

    def unwatch_run(self, run_id: str) -> None:
        self._by_run[run_id] -= 1
        if self._by_run[run_id] <= 0:
            del self._by_run[run_id]

    def _open(self, run_id: str | None, kind: SubscriptionKind, subject: str | None) -> None:
        self._by_kind[kind] += 1
        if run_id is not None:
            self.watch_run(run_id)
        if subject is not None:
            self._by_subject[subject] += 1
        self._notify()

    def _close(self, run_id: str | None, kind: SubscriptionKind, subject: str | None) -> None:
        self._by_kind[kind] -= 1
        if run_id is not None:
            self.unwatch_run(run_id)
        if subject is not None:
            self._by_subject[subject] -= 1
            if self._by_subject[subject] <= 0:
                del self._by_subject[subject]
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_open_sse(self, count: int) -> None:
        """Return once exactly `count` SSE responses are open (for tests and drains)."""
        while self.open_sse != count:
            await self._changed.wait()

    @property
    def open_sse(self) -> int:
        """Open SSE responses."""
        return self._by_kind["sse"]

    @property
    def open_waits(self) -> int:
        """Open `/wait` calls."""
        return self._by_kind["wait"]

    @property
    def total(self) -> int:
        return self._by_kind["sse"] + self._by_kind["wait"]

    def watched_runs(self) -> list[str]:
        """Runs that have at least one open subscription here."""
        return list(self._by_run)

    # -- graceful shutdown ---------------------------------------------------------------

    def drain(self) -> None:
        """Ask every open SSE response and `/wait` to finish now (server shutdown)."""
        self._draining.set()
        for callback in list(self._drain_callbacks):
            callback()

    def on_drain(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` on drain (at once if draining already); returns its remover.

        What an open SSE response uses instead of a task waiting for the drain.
        """
        if self.draining:
            callback()
            return lambda: None
        self._drain_callbacks.add(callback)
        return functools.partial(self._drain_callbacks.discard, callback)

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    async def wait_draining(self) -> None:
        await self._draining.wait()


class _Tracked:
    """`SubscriptionRegistry.track`: a slotted context manager, not a generator-based one
    (an open SSE response holds it for its lifetime)."""

    __slots__ = ("_kind", "_registry", "_run_id", "_subject")

    def __init__(
        self,
        registry: SubscriptionRegistry,
        run_id: str | None,
        kind: SubscriptionKind,
        subject: str | None,
    ):
        self._registry = registry
        self._run_id = run_id
        self._kind = kind
        self._subject = subject

    def __enter__(self) -> None:
        self._registry._open(self._run_id, self._kind, self._subject)

    def __exit__(self, *_exc: object) -> None:
        self._registry._close(self._run_id, self._kind, self._subject)
