"""The send timeout of SSE responses: one timer per event loop watches every write in
flight, instead of a timeout scope around each write (an idle stream is what a process
holds thousands of; a busy one writes thousands of times a second)."""

from __future__ import annotations

import asyncio
import weakref
from typing import ClassVar, Protocol


class Writer(Protocol):
    """What the watch needs of a response: its send timeout, and a way to stop it."""

    @property
    def timeout(self) -> float: ...

    def send_timed_out(self) -> None:
        """Called (on each tick, until its send ends) once a send has been pending for
        `timeout` seconds."""


class SendWatch:
    """The send timeout of every SSE response on one loop: one timer, not one per write.

    Writers register a send while it is in flight; while any is, a tick (a quarter of
    the shortest timeout, at most 1 s) stops the writers whose send has been pending for
    their timeout: a client that stopped reading is dropped within ~1.25x the timeout.
    """

    _by_loop: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, SendWatch]] = (
        weakref.WeakKeyDictionary()
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._inflight: dict[Writer, float] = {}
        self._handle: asyncio.TimerHandle | None = None

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> SendWatch:
        watch = cls._by_loop.get(loop)
        if watch is None:
            watch = cls._by_loop[loop] = cls(loop)
        return watch

    def begin(self, writer: Writer) -> None:
        self._inflight[writer] = self._loop.time()
        if self._handle is None:
            self._handle = self._loop.call_later(min(1.0, writer.timeout / 4), self._tick)

    def end(self, writer: Writer) -> None:
        self._inflight.pop(writer, None)

    def sending(self, writer: Writer) -> bool:
        return writer in self._inflight

    def _tick(self) -> None:
        self._handle = None
        now = self._loop.time()
        for writer, since in list(self._inflight.items()):
            if now - since >= writer.timeout:
                writer.send_timed_out()
        if self._inflight:
            tick = min(1.0, min(w.timeout for w in self._inflight) / 4)
            self._handle = self._loop.call_later(tick, self._tick)
