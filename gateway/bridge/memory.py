"""The embedded, in-process stream bridge: one asyncio event loop, no external services.

It is the default backend for a single gateway process and the reference the Redis backend
is tested against, so it follows the same lease, fencing, END and cursor rules
(docs/protocol.md §2).

Layout. A run record (`_Run`: lease, epoch, status, id clock) owns at most one live
`_Generation`: the retained log. `cleanup` retires a generation; a later write creates a new
one, which readers of the old generation never see. A generation keeps events in a list
with a moving head (evicted slots are dropped and the list compacted once half of it is
dead), parallel parsed keys for `bisect` on reconnect, and absolute positions
(`base + index`) so that a reader's step is O(1) and survives compaction.

Fan-out. Readers wait on the generation's `Changes` (`deadlines.py`); a publish only
schedules one wake-up (replace-and-set), so a publish costs the same for 1 or 10,000
subscribers and a burst of publishes coalesces into one wake-up, after which each reader
takes everything new as one slice of the log (`subscribe_batches`). Wake-ups are paced
(`pacing.py`) so that readers who cannot keep up never take the loop away from their
producer.
"""

from __future__ import annotations

import asyncio
import functools
import math
import secrets
import time
from bisect import bisect_right
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..cursor import EventKey, format_key, try_parse_cursor
from ..errors import (
    BridgeClosed,
    InvalidInput,
    ProducerFenced,
    RunOwned,
    SessionMismatch,
    StreamEnded,
    TurnExists,
)
from ..names import check_end_status, check_run_id, check_session_id
from ..sequence import IdRecord, Numbering, admit, advance, applied_ids, check_seq
from ..sessions.memory import MemorySessionStore
from ..settings import Settings
from ..timing.deadlines import Changes, Deadlines, Signal
from ..timing.pacing import WakePacer
from ..values import (
    Claim,
    End,
    EndResult,
    EndStatus,
    LeaseState,
    PublishResult,
    RunInfo,
    RunStatus,
    StreamEvent,
    StreamItem,
)
from . import rules, turn_keys
from .base import one_by_one
from .reader import Placement, follow_log

_COMPACT_MIN = 64  # never compact tiny lists: the copy would cost more than the dead slots


@dataclass(eq=False)
class _Generation:
    """One incarnation of a run's log. Positions are absolute: `base + list index`."""

    events: list[StreamEvent | None] = field(default_factory=list)  # None = evicted slot
    keys: list[EventKey] = field(default_factory=list)
    head: int = 0  # list index of the earliest retained event
    base: int = 0  # absolute position of events[0]
    # Every event of the run with a larger id is retained (rules.Bounds): the newest
    # evicted id, or for a log written after a removal the last id of the one before.
    floor: EventKey | None = None
    trimmed: bool = False  # this generation evicted events itself
    end: End | None = None
    retired: bool = False
    last: EventKey | None = None  # the newest event id, kept when a retirement clears keys
    changes: Changes = field(default_factory=Changes)  # one signal for all its readers
    pacer: WakePacer = field(init=False)

    def __post_init__(self) -> None:
        self.pacer = WakePacer(self.changes.fire)

    def wake(self) -> None:
        """Wake every reader waiting on this generation."""
        self.changes.fire()

    @property
    def total(self) -> int:
        """Absolute position after the newest event (kept after the payloads are cleared)."""
        return self.base + len(self.events)

    def newest(self) -> EventKey | None:
        """The newest event id of the run up to this log: its newest event, or for a log
        with none (an END written after a removal) the last id of the one before."""
        if self.retired:
            return self.last
        return self.keys[-1] if self.keys else self.floor

    def retained(self) -> list[StreamEvent | None]:
        return self.events[self.head :]


@dataclass(eq=False)
class _Run:
    run_id: str
    session_id: str | None
    created_at: float
    updated_at: float
    token: str
    epoch: int
    lease_seconds: float
    lease_expires_at: float
    cancel_requested: bool = False
    status: RunStatus = "running"
    error: Any = None
    end_id: str | None = None
    end_by: str | None = None  # the token that wrote the END ("-": a recovery END)
    last_key: EventKey = (0, -1)  # id clock: survives generations so ids never repeat
    last_event: EventKey | None = None  # the newest event id handed out (not the END)
    gen: _Generation | None = None
    numbering: Numbering | None = None  # numbered appends (see gateway.sequence)
    recorded: IdRecord = field(default_factory=IdRecord)  # the numbering's newest ids
    deadline: float = 0.0  # loop time at which the whole run expires
    turn_key: tuple[str, str] | None = None  # (session, idempotency key) it holds
    stream: str | None = None  # the mark of its current streamed append (cut_lease)
    renewed_at: float = 0.0  # the latest renewal without a mark (`POST …/lease`), clock time
    expiry: asyncio.TimerHandle | None = None


@dataclass(eq=False)
class _Pending:
    """Readers of a run that has no log yet, waiting for its first generation."""

    created: Signal = field(default_factory=lambda: Signal())
    readers: int = 0


def _positive(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{what} must be a number")
    if not math.isfinite(value) or value <= 0:
        raise InvalidInput(f"{what} must be finite and > 0")
    return float(value)


class MemoryStreamBridge:
    """In-process `StreamBridge`; all methods must run on one event loop."""

    def __init__(self, settings: Settings, *, clock: Callable[[], float] = time.time) -> None:
        self._settings = settings
        self._clock = clock  # wall clock (unix seconds): ids, leases, reported times
        self._runs: dict[str, _Run] = {}
        self._pending: dict[str, _Pending] = {}
        self._timers: set[asyncio.TimerHandle] = set()
        self._deadlines: Deadlines | None = None  # made on the loop of the first reader
        self._closed = False
        # (session, idempotency key) -> (run, when taken); an entry lives as long as its
        # run's record (`_expire` drops it), so the map is bounded by the runs.
        self._turn_keys: dict[tuple[str, str], tuple[str, float]] = {}
        # Turn records are written by this bridge's own steps (claim, append, END), in
        # the same synchronous step as the write they reflect; the store reads them.
        self.sessions = MemorySessionStore(settings, clock=clock)

    # ------------------------------------------------------------------ producers

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
        self._check_open()
        check_run_id(run_id)
        if session_id is not None:
            check_session_id(session_id)
        lease = self._lease(lease_seconds)
        now = self._clock()
        key: tuple[str, str] | None = None
        if idempotency_key is not None:
            key = (session_id or "", turn_keys.check_key(idempotency_key, session_id))
            self._check_turn_key(key, run_id, takeover, now)
        run = self._runs.get(run_id)
        if run is None:
            run = _Run(run_id, session_id, now, now, "", 0, lease, 0.0)
            self._runs[run_id] = run
        elif run.status != "running":
            raise StreamEnded(f"run {run_id} has ended")
        elif session_id is not None and session_id != run.session_id:
            raise SessionMismatch.of(run_id, run.session_id)
        elif now < run.lease_expires_at and not takeover:
            raise RunOwned(f"run {run_id} is owned by a live producer")
        run.epoch += 1
        run.token = secrets.token_urlsafe(18)  # a new token fences every older one
        run.lease_seconds = lease
        run.lease_expires_at = now + lease
        run.updated_at = now
        self._touch(run, self._settings.stream_ttl_seconds)
        if run.session_id is not None:  # the turn opens in the claim's own step
            self.sessions.claimed(run.session_id, run_id, input_message, now)
        if key is not None and self._turn_keys.get(key, ("",))[0] != run_id:
            self._turn_keys[key] = (run_id, now)  # dropped with the run's record
            run.turn_key = key
        return Claim(run_id, run.session_id, run.token, run.epoch, run.lease_expires_at)

    def _check_turn_key(
        self, key: tuple[str, str], run_id: str, takeover: bool, now: float
    ) -> None:
        """TurnExists when the key already started a turn that still counts."""
        held = self._turn_keys.get(key)
        if held is None:
            return
        holder, since = held
        verdict = turn_keys.decide(
            self._info(holder),
            now - since,
            holder=holder,
            run_id=run_id,
            takeover=takeover,
            now=now,
            ended_ttl=self._settings.ended_ttl_seconds,
        )
        if verdict == "exists":
            raise TurnExists(holder)

    async def renew_lease(
        self,
        run_id: str,
        *,
        producer_token: str,
        lease_seconds: float | None = None,
        stream: str | None = None,
    ) -> LeaseState:
        self._check_open()
        run = self._owned(run_id, producer_token)
        if lease_seconds is not None:
            run.lease_seconds = self._lease(lease_seconds)
        now = self._clock()
        if stream:
            run.stream = stream
        else:  # a renewal from elsewhere: a drop seen before it cuts nothing (cut_lease)
            run.renewed_at = now
        run.lease_expires_at = now + run.lease_seconds
        run.updated_at = now
        self._touch(run, self._settings.stream_ttl_seconds)
        return LeaseState(run.lease_expires_at, run.cancel_requested)

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
        self._check_open()
        run = self._runs.get(check_run_id(run_id))
        if run is None or run.token != producer_token or run.stream != stream:
            return None
        if run.status != "running":
            return None
        if last_id is not None and (
            run.last_event is None or format_key(run.last_event) != last_id
        ):
            return None  # appended since: the producer is back
        now = self._clock()
        if run.renewed_at > now - dropped_ago:
            return None  # renewed since the drop: the producer is back
        run.lease_expires_at = min(run.lease_expires_at, now + grace)
        return run.lease_expires_at

    async def publish(
        self, run_id: str, event: str, data: Any, *, producer_token: str
    ) -> PublishResult:
        return self._append(run_id, ((event, data),), producer_token)

    async def publish_many(
        self,
        run_id: str,
        events: Sequence[tuple[str, Any]],
        *,
        producer_token: str,
        seq: int | None = None,
    ) -> PublishResult:
        return self._append(run_id, events, producer_token, seq)

    def _append(
        self, run_id: str, events: Sequence[tuple[str, Any]], token: str, seq: int | None = None
    ) -> PublishResult:
        self._check_open()
        check_run_id(run_id)
        if seq is not None:
            seq = check_seq(seq, len(events))
        # Validate and encode the whole batch before touching state: a batch is atomic, and
        # the encoded bytes are the detached copy readers get (payload isolation).
        encoded = rules.encode_batch(events)
        run = self._owned(run_id, token)  # (the END check is on the tail only: O(1))
        # -- numbered appends: the last check before writing, as in lua/publish.lua
        applied: tuple[str, ...] = ()
        previous_last = None if run.last_event is None else format_key(run.last_event)
        if seq is not None:
            admission = admit(run.numbering, token, seq, len(encoded))
            if admission.skip:
                numbering = run.numbering
                assert numbering is not None  # admit lets an overlap through only then
                gen = run.gen
                applied = applied_ids(
                    admission,
                    run.recorded.ids(numbering, seq, admission.skip),
                    None if gen is None or gen.floor is None else format_key(gen.floor),
                    gen is not None and not gen.retired,
                    numbering,
                    seq,
                )
                encoded = encoded[admission.skip :]
            if not encoded:  # all applied before: their ids, nothing appended; lease renewed
                run.lease_expires_at = self._clock() + run.lease_seconds
                return PublishResult(applied, run.cancel_requested, run.session_id, len(applied))
        # --
        ids: list[str] = []
        gen = run.gen if run.gen is not None else self._new_generation(run)
        for name, payload in encoded:
            key = self._next_key(run)
            ids.append(format_key(key))
            gen.events.append(StreamEvent(ids[-1], name, payload))
            gen.keys.append(key)
        run.last_event = run.last_key
        self._evict(gen)
        gen.pacer.appended_now()
        if seq is not None:
            if run.numbering is None or run.numbering.token != token:
                run.recorded = IdRecord()  # a new numbering
            run.recorded.extend(ids)
            run.numbering = advance(run.numbering, token, seq + len(applied), ids, previous_last)
        now = self._clock()
        run.lease_expires_at = now + run.lease_seconds
        run.updated_at = now
        self._touch(run, self._settings.stream_ttl_seconds)
        if run.session_id is not None:  # the turn record follows in the same step
            self.sessions.appended(run_id, encoded, now)
        return PublishResult((*applied, *ids), run.cancel_requested, run.session_id, len(applied))

    async def publish_end(
        self,
        run_id: str,
        status: EndStatus,
        error: Any = None,
        *,
        producer_token: str | None,
    ) -> EndResult:
        self._check_open()
        check_run_id(run_id)
        check_end_status(status)
        error = orjson.loads(rules.encode_payload(error))  # a detached copy, like payloads
        # The ownership check comes first, as in the Redis script: the token, or for the
        # unowned recovery END the absence of a live lease.
        run = self._runs.get(run_id)
        now = self._clock()
        if producer_token is not None:
            if run is None or not _same_token(run.token, producer_token):
                raise ProducerFenced(f"producer token is not the current owner of run {run_id}")
        elif run is not None and now < run.lease_expires_at:
            raise ProducerFenced(f"run {run_id} has a live producer")
        if run is None:
            return EndResult(None, False, applied=False)  # nothing known: nothing created
        if run.status != "running":  # one END per run, ever
            if producer_token is not None and run.end_by not in (None, producer_token):
                # Somebody else ended it (the recovery END after this producer's lease
                # lapsed): this producer was fenced, its END is not the run's.
                raise ProducerFenced(f"run {run_id} was ended by another writer")
            return EndResult(run.end_id, True, run.session_id)
        if producer_token is None and run.gen is None:
            # Claimed, never published, lease gone: only the record is marked (no log is
            # created), and the readers waiting for a first event learn how it ended.
            self._settle(run, status, error, None, "-")
            pending = self._pending.get(run_id)
            if pending is not None:
                pending.created.fire()
            return EndResult(None, False, run.session_id)
        if producer_token is not None and now >= run.lease_expires_at:
            raise ProducerFenced(f"producer lease of run {run_id} has expired")
        gen = run.gen if run.gen is not None else self._new_generation(run)
        end_id = format_key(self._next_key(run))
        gen.end = End(status, error, end_id)
        self._settle(run, status, error, end_id, producer_token or "-")
        gen.pacer.appended_now()
        return EndResult(end_id, False, run.session_id)

    def _settle(
        self, run: _Run, status: EndStatus, error: Any, end_id: str | None, by: str
    ) -> None:
        run.status, run.error, run.end_id, run.end_by = status, error, end_id, by
        run.lease_expires_at = 0.0  # as on Redis: the lease ends with the run
        run.updated_at = self._clock()
        if run.session_id is not None:  # the turn record ends in the same step
            self.sessions.ended(run.run_id, status, run.updated_at)
        # The finished log stays readable for ended_ttl; the record at least as long.
        ended_ttl = self._settings.ended_ttl_seconds
        if run.gen is not None:
            self._later(ended_ttl, self._cleanup_now, run.run_id)
        self._touch(run, max(ended_ttl, self._settings.stream_ttl_seconds))

    # ------------------------------------------------------------------ subscribers

    def subscribe(
        self,
        run_id: str,
        last_event_id: str | None = None,
        heartbeat_interval: float | None = None,
    ) -> AsyncGenerator[StreamItem, None]:
        batches = self._batches(run_id, last_event_id, heartbeat_interval, rules.READ_BATCH)
        return one_by_one(batches)

    def subscribe_batches(
        self,
        run_id: str,
        last_event_id: str | None = None,
        heartbeat_interval: float | None = None,
    ) -> AsyncGenerator[Sequence[StreamItem], None]:
        return self._batches(run_id, last_event_id, heartbeat_interval, None)

    def _batches(
        self,
        run_id: str,
        last_event_id: str | None,
        heartbeat_interval: float | None,
        limit: int | None,
    ) -> AsyncGenerator[Sequence[StreamItem], None]:
        check_run_id(run_id)
        interval = rules.heartbeat_interval(
            self._settings.heartbeat_interval_seconds, heartbeat_interval
        )
        # The generation is captured now, not at the first read: a reader whose generation
        # is retired before it reads must get a gap, never a recreated stream.
        run = self._runs.get(run_id)
        view = _MemoryView(self, run_id, run.gen if run else None, limit)
        return follow_log(view, rules.parse_start(last_event_id), interval)

    def _deadlines_here(self) -> Deadlines:
        deadlines = self._deadlines
        if deadlines is None:
            # (Looked up only once: asyncio's get_running_loop() is a getpid() system
            # call, which once per wait was a syscall per delivered event.)
            deadlines = self._deadlines = Deadlines(asyncio.get_running_loop())
        return deadlines

    def _release(self, run_id: str, pending: _Pending | None) -> None:
        if pending is not None:
            pending.readers -= 1
            if pending.readers == 0 and self._pending.get(run_id) is pending:
                del self._pending[run_id]

    @staticmethod
    def _bounds(gen: _Generation) -> rules.Bounds:
        events = gen.events
        if gen.head >= len(events):
            return rules.Bounds(gen.floor, gen.trimmed, None, None)
        return rules.Bounds(gen.floor, gen.trimmed, _id(events[gen.head]), _id(events[-1]))

    # ------------------------------------------------------------------ run state

    async def request_cancel(self, run_id: str) -> bool:
        self._check_open()
        run = self._runs.get(check_run_id(run_id))
        if run is None:
            return False
        run.cancel_requested = True
        return True

    async def open_stream(
        self, run_id: str, last_event_id: str | None = None
    ) -> tuple[RunInfo | None, Callable[[], AsyncGenerator[Sequence[StreamItem], None]]]:
        # In process, the record and the log are read when asked for: nothing to share.
        info = await self.get_run(run_id)
        return info, functools.partial(self.subscribe_batches, run_id, last_event_id)

    async def get_run(self, run_id: str) -> RunInfo | None:
        self._check_open()
        return self._info(check_run_id(run_id))

    def _info(self, run_id: str) -> RunInfo | None:
        run = self._runs.get(run_id)
        if run is None:
            return None
        retained = run.gen.retained() if run.gen is not None else []
        return RunInfo(
            run_id=run.run_id,
            session_id=run.session_id,
            status=run.status,
            created_at=run.created_at,
            updated_at=run.updated_at,
            first_event_id=_id(retained[0]) if retained else None,
            last_event_id=_id(retained[-1]) if retained else None,
            retained_events=len(retained),
            cancel_requested=run.cancel_requested,
            epoch=run.epoch,
            lease_expires_at=run.lease_expires_at,
            log_exists=run.gen is not None,
            error=run.error,
        )

    async def stream_exists(self, run_id: str) -> bool:
        self._check_open()
        run = self._runs.get(check_run_id(run_id))
        return run is not None and run.gen is not None

    async def cleanup(self, run_id: str, delay: float = 0) -> None:
        self._check_open()
        check_run_id(run_id)
        if delay > 0:
            self._later(delay, self._cleanup_now, run_id)
        else:
            self._cleanup_now(run_id)

    async def ping(self) -> None:
        self._check_open()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True  # readers check this first: they report bridge_closed
        for handle in self._timers:
            handle.cancel()
        self._timers.clear()
        for run in self._runs.values():
            if run.expiry is not None:
                run.expiry.cancel()
            self._retire(run)
        self._runs.clear()
        for pending in self._pending.values():
            pending.created.fire()
        if self._deadlines is not None:
            self._deadlines.cancel()  # every waiter was woken above

    # ------------------------------------------------------------------ internals

    def _check_open(self) -> None:
        if self._closed:
            raise BridgeClosed("the stream bridge is closed")

    def _lease(self, seconds: float | None) -> float:
        if seconds is None:
            seconds = self._settings.lease_seconds
        return min(_positive(seconds, "lease_seconds"), self._settings.max_lease_seconds)

    def _owned(self, run_id: str, token: str) -> _Run:
        """The run, if `token` holds its lease; the fencing check before any write.

        As in the Redis scripts: the token first, then an END (reported as such even to
        an owner whose lease lapsed since), then the lease.
        """
        run = self._runs.get(check_run_id(run_id))
        if run is None or not _same_token(run.token, token):
            raise ProducerFenced(f"producer token is not the current owner of run {run_id}")
        if run.status != "running" or (run.gen is not None and run.gen.end is not None):
            raise StreamEnded(f"run {run_id} has ended")
        if self._clock() >= run.lease_expires_at:
            raise ProducerFenced(f"producer lease of run {run_id} has expired")
        return run

    def _next_key(self, run: _Run) -> EventKey:
        # Never go backwards: a repeated or earlier wall clock keeps the last ms.
        ms = int(self._clock() * 1000)
        last_ms, last_seq = run.last_key
        run.last_key = (ms, 0) if ms > last_ms else (last_ms, last_seq + 1)
        return run.last_key

    def _new_generation(self, run: _Run) -> _Generation:
        run.gen = gen = _Generation()
        if run.last_key != (0, -1):
            # A log written after a removal: every reader before the removal point (the
            # last id handed out) has missed events, and gets a gap.
            gen.floor = run.last_key
        pending = self._pending.pop(run.run_id, None)
        if pending is not None:
            pending.created.fire()  # its readers now attach to this generation
        return gen

    def _evict(self, gen: _Generation) -> None:
        excess = len(gen.events) - gen.head - self._settings.max_events_per_run
        if excess <= 0:
            return
        for index in range(gen.head, gen.head + excess):
            gen.events[index] = None  # drop the payload now, the slot at compaction
        gen.head += excess
        gen.floor = gen.keys[gen.head - 1]
        gen.trimmed = True
        if gen.head >= _COMPACT_MIN and gen.head * 2 >= len(gen.events):
            del gen.events[: gen.head], gen.keys[: gen.head]
            gen.base += gen.head
            gen.head = 0

    def _retire(self, run: _Run) -> None:
        gen = run.gen
        if gen is None:
            return
        run.gen = None
        gen.last = gen.newest()  # (before it reads as retired)
        gen.retired = True
        # Clear payloads but keep `total` and `end`: readers decide END vs gap from them.
        gen.base, gen.head = gen.total, 0
        gen.events, gen.keys = [], []
        gen.wake()

    def _cleanup_now(self, run_id: str) -> None:
        run = self._runs.get(run_id)
        if run is not None:
            self._retire(run)

    def _later(self, delay: float, callback: Callable[[str], None], run_id: str) -> None:
        handle: asyncio.TimerHandle | None = None

        def fire() -> None:
            assert handle is not None
            self._timers.discard(handle)
            callback(run_id)

        handle = asyncio.get_running_loop().call_later(delay, fire)
        self._timers.add(handle)

    def _touch(self, run: _Run, ttl: float) -> None:
        """Move the run's expiry to now + ttl; re-arm the timer only if it must fire sooner."""
        loop = asyncio.get_running_loop()
        run.deadline = loop.time() + ttl
        if run.expiry is None or run.expiry.when() > run.deadline:
            if run.expiry is not None:
                run.expiry.cancel()
            run.expiry = loop.call_at(run.deadline, self._expire, run)

    def _expire(self, run: _Run) -> None:
        if self._runs.get(run.run_id) is not run:
            return
        loop = asyncio.get_running_loop()
        if loop.time() < run.deadline:  # extended since armed: sleep again, cheaply
            run.expiry = loop.call_at(run.deadline, self._expire, run)
            return
        run.expiry = None
        self._retire(run)
        del self._runs[run.run_id]
        if run.turn_key is not None and self._turn_keys.get(run.turn_key, ("",))[0] == run.run_id:
            del self._turn_keys[run.turn_key]
        # Readers waiting for a first log learn it is gone; they register afresh if they
        # wait on (a fired entry left in place would wake them at once, forever).
        pending = self._pending.pop(run.run_id, None)
        if pending is not None:
            pending.created.fire()


class _MemoryView:
    """One subscription's view of a run's log (`reader.LogView`).

    It keeps the generation it was made with (or, made before the run had a log, the
    first one written after): a retired generation reads as gone, so its readers never
    attach to a later one. Reads are by id like Redis's; the view remembers where its
    last slice ended (`_at`, `_pos`), so a reader's next step costs O(1), not a search.
    """

    __slots__ = ("_at", "_bridge", "_gen", "_limit", "_pending", "_pos", "_run_id")

    def __init__(
        self,
        bridge: MemoryStreamBridge,
        run_id: str,
        gen: _Generation | None,
        limit: int | None,
    ) -> None:
        self._bridge = bridge
        self._run_id = run_id
        self._gen = gen
        self._limit = limit  # events per direct read (`subscribe`: rules.READ_BATCH, as on Redis)
        self._pending: _Pending | None = None  # registered while waiting for a first log
        self._at: EventKey | None = None  # the newest event handed out ...
        self._pos = 0  # ... and the absolute position after it

    @property
    def closed(self) -> bool:
        return self._bridge._closed

    @property
    def stale(self) -> bool:
        return False  # the window is the log itself

    @asynccontextmanager
    async def attached(self, start: rules.Start) -> AsyncIterator[Placement]:
        # A captured log counts as seen: if it is gone by the first read, it was removed.
        # (A malformed cursor replays what is retained, as no cursor does.)
        try:
            yield (rules.Phase.NEW if self._gen is None else rules.Phase.SEEN), start.key
        finally:
            self._bridge._release(self._run_id, self._pending)

    async def read(self, after: EventKey | None, *, seen: bool) -> rules.LogRead:
        gen = self._gen
        run = self._bridge._runs.get(self._run_id)
        if gen is None and run is not None and run.gen is not None:
            self._gen = gen = run.gen  # the first log of a run that had none when we came
        if gen is None or gen.retired:
            return self._record(gen, run)
        found: bool | None = None
        if after is None:
            index = gen.head
        else:
            index = bisect_right(gen.keys, after, lo=gen.head)
            found = (index > gen.head and gen.keys[index - 1] == after) or _is_end(gen, after)
        tail: rules.Entry | None = gen.end
        if tail is None and gen.head < len(gen.events):
            tail = gen.events[-1]
        bounds = self._bridge._bounds(gen)
        entries = self._slice(gen, index)
        return rules.LogRead(True, bounds, entries, tail, "", None, None, None, found)

    @staticmethod
    def _record(gen: _Generation | None, run: _Run | None) -> rules.LogRead:
        """What is known of a run without a (live) log: its record, or for a generation
        outliving its record, how that generation ended."""
        if run is not None:
            return rules.LogRead(
                False, None, [], None, run.status, run.error, run.end_id, run.last_event
            )
        end = gen.end if gen is not None else None
        last = gen.newest() if gen is not None else None
        if end is None:
            return rules.LogRead(False, None, [], None, "", None, None, last)
        return rules.LogRead(False, None, [], None, end.status, end.error, end.id, last)

    def _slice(self, gen: _Generation, index: int) -> list[rules.Entry]:
        """The retained events from list index `index` (up to the limit), then the END
        when they reach it."""
        events = gen.events
        stop = len(events)
        limit = self._limit
        if limit is not None and index + limit < stop:
            stop = index + limit
        # Slots from the head on are retained (never None).
        batch: list[rules.Entry] = events[index:stop]  # type: ignore[assignment]
        if stop > index:
            self._at = gen.keys[stop - 1]
            self._pos = gen.base + stop
        if gen.end is not None and stop == len(events):
            batch.append(gen.end)  # the END comes with the last events
        return batch

    def window(self, after: EventKey) -> Sequence[StreamItem] | None:
        gen = self._gen
        if gen is None or gen.retired:
            return None
        if after == self._at:
            index = self._pos - gen.base
            if index < gen.head:
                return None  # overtaken by eviction while we were away: read, for the gap
        elif gen.floor is not None and after < gen.floor:
            return None
        else:
            index = bisect_right(gen.keys, after, lo=gen.head)
        return self._slice(gen, index)

    async def refresh(self) -> None:
        return None

    async def follow(self) -> None:
        return None  # a reader registers when it waits (`wait`)

    async def wait(self, deadline: float) -> bool:
        gen = self._gen
        if gen is None:
            pending = self._pending
            if pending is None or pending.created.fired:
                # (Re-)register: a set entry was for a generation already retired.
                self._bridge._release(self._run_id, pending)
                pending = self._bridge._pending.setdefault(self._run_id, _Pending())
                pending.readers += 1
                self._pending = pending
            waiter = pending.created
        else:
            waiter = gen.changes.current
            gen.pacer.parked()
        return await waiter.wait_until(self._bridge._deadlines_here(), deadline)

    def key_of(self, event: StreamEvent) -> EventKey:
        assert self._at is not None  # `event` came from `_slice`, which set it
        return self._at

    def idle(self, interval: float) -> None:
        return None

    async def gap_bounds(self, bounds: rules.Bounds) -> rules.Bounds:
        return bounds  # read with its first and last ids already

    def final(self, position: EventKey | None) -> End | None:
        gen = self._gen
        if gen is None or gen.end is None or rules.behind(position, gen.newest()):
            return None
        return gen.end  # it had every event: it still learns how the run ended


def _same_token(expected: str, given: str) -> bool:
    return secrets.compare_digest(expected.encode(), given.encode())


def _id(item: StreamEvent | None) -> str:
    assert item is not None  # callers only pass retained slots
    return item.id


def _is_end(gen: _Generation, key: EventKey) -> bool:
    """Whether `key` is the id of the log's END entry (a position in the log too)."""
    end_id = gen.end.id if gen.end is not None else None
    return end_id is not None and try_parse_cursor(end_id) == key
