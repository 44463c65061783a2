"""Change signals of a session's turn list: what a session feed waits on between turns.

A signal counts the changes it was told of (a turn was created, the session was retired
or cleared; on Redis also a resubscription of its channel, which may have lost some). A
feed notes `changes`, reads the turns, and waits only if `changes` has not moved
meanwhile, so a change that lands during the read is never slept through. One signal
per session per process, shared by every local feed of that session.

- Memory: `ChangeSignal`, told by `MemorySessionStore` itself (in-process).
- Redis: the notifier's watch feed of the session's shard channel
  (`redis/notifier.py`), SPUBLISHed by the bridge when a claim opens a turn and
  by the retire / clear path: no Redis connection and no poll per feed.
"""

from __future__ import annotations

import asyncio
from contextlib import suppress
from typing import Protocol


class TurnSignal(Protocol):
    @property
    def changes(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    async def wait(self, seconds: float) -> None:
        """Return at the next change, or after `seconds`."""
        ...


class ChangeSignal:
    """The in-process `TurnSignal` of one session."""

    __slots__ = ("__weakref__", "_changed", "changes", "closed", "users")

    def __init__(self) -> None:
        self.changes = 0
        self.closed = False
        self.users = 0
        self._changed = asyncio.Event()

    def mark_stale(self) -> None:
        self.changes += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait(self, seconds: float) -> None:
        # asyncio-native, like the run feeds' wait: the feed runs in a bare asyncio task
        # that is stopped with `Task.cancel()` (http/streaming/sse.py).
        with suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._changed.wait()
