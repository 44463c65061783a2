"""Bookkeeping of open subscriptions (SSE responses and `/wait` calls) in this process.

The registry counts what is open (tests assert the SSE count returns to zero after a
client disconnects), knows which runs have someone waiting on them (the liveness
monitor checks exactly those runs), and carries the drain signal that ends every open
SSE response on graceful shutdown.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from typing import Literal

import anyio

SubscriptionKind = Literal["sse", "wait"]


class SubscriptionRegistry:
    """Counts open subscriptions per kind and per run; single event loop, no locks."""

    def __init__(self) -> None:
        self._by_kind: Counter[str] = Counter()
        self._by_run: Counter[str] = Counter()
        self._draining = anyio.Event()
        self._changed = anyio.Event()
        self._drain_callbacks: set[Callable[[], None]] = set()

    def track(self, run_id: str | None, kind: SubscriptionKind) -> _Tracked:
        """Count one subscription for the duration of the `with` block (`run_id` None:
        one that follows no single run, a session feed; it names its runs with
        `watch_run` as it reaches them)."""
        return _Tracked(self, run_id, kind)

    def watch_run(self, run_id: str) -> None:
        """Count a run as watched (liveness) without counting a subscription."""
        self._by_run[run_id] += 1

    def unwatch_run(self, run_id: str) -> None:
        self._by_run[run_id] -= 1
        if self._by_run[run_id] <= 0:
            del self._by_run[run_id]

    def _open(self, run_id: str | None, kind: SubscriptionKind) -> None:
        self._by_kind[kind] += 1
        if run_id is not None:
            self.watch_run(run_id)
        self._notify()

    def _close(self, run_id: str | None, kind: SubscriptionKind) -> None:
        self._by_kind[kind] -= 1
        if run_id is not None:
            self.unwatch_run(run_id)
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

    __slots__ = ("_kind", "_registry", "_run_id")

    def __init__(self, registry: SubscriptionRegistry, run_id: str | None, kind: SubscriptionKind):
        self._registry = registry
        self._run_id = run_id
        self._kind = kind

    def __enter__(self) -> None:
        self._registry._open(self._run_id, self._kind)

    def __exit__(self, *_exc: object) -> None:
        self._registry._close(self._run_id, self._kind)
