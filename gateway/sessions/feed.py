"""The session feed: every turn of a session, in order, as one subscription.

`follow_session` yields steps `(run_id, items)`: the run the items belong to (None for
`RETIRED` and heartbeats between turns) and a non-empty list of

- `TurnOpened`  a turn begins (its run id and stored input message);
- `StreamEvent` the run's own events, as the bridge delivers them;
- `End`         the turn's run ended (`turn_end`); the feed goes on with the next turn;
- `StreamGap`   the run's gap rules fired inside the turn; the feed ends after it;
- `RETIRED`     the session was retired; the feed ends after it;
- `HEARTBEAT`   idle for the heartbeat interval (inside a turn: the bridge's own).

Turns are taken in the session's order (`order`: the counter the backend handed out
when it accepted each claim, never a clock), one page at a time: "the next turn" is the
store's first turn above the one just followed (`turns_after`), however many turns the
session holds, so a resumed feed follows exactly or answers a gap, never jumps. With no
cursor the feed starts at the newest turn that has not ended, from its first event, or,
when none is live, waits for a turn after the newest one it saw. Between turns it waits
on the session's change signal (`watch.py`) and re-reads only when the signal moved: a
new turn's announcement is made by the same atomic step that takes its order (on Redis,
`session_claim.lua`), and a retirement's by the step that writes the tombstone, so no
crash can lose one, and an idle feed costs the backend nothing (a lost subscription is
re-established and wakes every feed once). The one wait that looks again by itself is
for a claim caught between its two steps (its order taken, its record not yet written):
`PENDING_RECHECK` seconds, until the record appears or the entry is pruned. A resume whose turn
record is gone (expired, removed, never a turn of this session) is a `stream_removed`
gap. Reading a turn's run subscribes to the bridge like any run reader, so the run's
cursor, gap and END rules apply unchanged (a turn whose log is gone is the bridge's gap,
never a bare `turn_end`); `on_turn(run_id)` / `on_turn(None)` tell the caller which run
it follows (the HTTP layer has the liveness monitor watch it).

Retirement removes the session's run logs: a reader inside a turn then gets the bridge's
`stream_removed` gap, which the feed turns into `RETIRED` when the session is retired.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..bridge.base import StreamBridge, close_subscription
from ..errors import BridgeClosed
from ..values import HEARTBEAT, End, Heartbeat, StreamEvent, StreamGap
from . import turns as T
from .base import MAX_LIMIT, SessionStore
from .cursor import TURN_START, SessionCursor
from .watch import TurnSignal


@dataclass(frozen=True, slots=True)
class TurnOpened:
    run_id: str
    input_message: Any  # the stored (shaped) operator message, or None
    created_at: float


class Retired:
    __slots__ = ()

    def __repr__(self) -> str:
        return "RETIRED"


RETIRED: Final = Retired()

FeedItem = TurnOpened | StreamEvent | End | StreamGap | Retired | Heartbeat
FeedStep = tuple[str | None, Sequence[FeedItem]]


def _order(turn: dict[str, Any]) -> int:
    return int(turn["order"])


def _opened(turn: dict[str, Any]) -> TurnOpened:
    history = turn.get("history") or []
    first = history[0] if history else None
    message = first if isinstance(first, dict) and first.get("role") == "user" else None
    return TurnOpened(str(turn["run_id"]), message, float(turn["created_at"]))


# A feed that found the next turn's claim between its two steps looks again this soon.
PENDING_RECHECK: Final = 0.05

# The session's next turn after an order, as read at a change count of its signal,
# shared by the feeds of that session in this process waiting at the same place: a new
# turn wakes them all at once, and each would read the same page. A read begun at change
# count c holds every turn announced up to c.
# (With the time each began: a `fresh` look at a pending claim shares one begun less than
# `PENDING_RECHECK` ago, so the feeds of a session re-read it once per period, together.)
_SHARED: weakref.WeakKeyDictionary[
    Any, dict[tuple[int, int], tuple[asyncio.Future[Any], float]]
] = weakref.WeakKeyDictionary()


async def _next_turn(
    store: SessionStore,
    session_id: str,
    signal: TurnSignal,
    changes: int,
    after: int,
    *,
    fresh: bool = False,
) -> tuple[dict[str, Any] | None, bool]:
    """The first turn above `after` and whether a claim is between its steps there
    (`SessionStore.next_turn`); from a read made at `changes` unless `fresh`."""
    reads = _SHARED.get(signal)
    if reads is None:
        reads = _SHARED[signal] = {}
    entry = reads.get((changes, after))
    now = time.monotonic()
    if entry is not None and (not fresh or now - entry[1] < PENDING_RECHECK):
        shared: tuple[dict[str, Any] | None, bool] | None = await asyncio.shield(entry[0])
        if shared is not None:
            return shared
    for key in [k for k in reads if k[0] != changes]:
        del reads[key]  # reads made before the latest change are of no use any more
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    reads[(changes, after)] = (future, now)
    found: tuple[dict[str, Any] | None, bool] | None = None
    try:
        found = await store.next_turn(session_id, after)
        return found
    finally:
        future.set_result(found)  # None: those who joined read for themselves


def _removed(position: str | None) -> StreamGap:
    return StreamGap(position, None, None, "stream_removed")


class _Turn:
    """The turn being followed: its run, where to resume it, its place in the order."""

    __slots__ = ("order", "position", "run_id")

    def __init__(self, run_id: str, position: str, order: int) -> None:
        self.run_id = run_id
        self.position = position
        self.order = order


async def follow_session(
    bridge: StreamBridge,
    store: SessionStore,
    session_id: str,
    cursor: SessionCursor | None,
    heartbeat_interval: float,
    on_turn: Callable[[str | None], None] = lambda _run_id: None,
) -> AsyncGenerator[FeedStep, None]:
    """Follow the session from `cursor` (see the module doc); `gap`/`retired` cursors
    are the caller's to answer (they never reach here)."""
    async with store.watch(session_id) as signal:
        seen = signal.changes
        if await store.is_retired(session_id):
            yield (None, [RETIRED])
            return
        current: _Turn | None = None
        after = 0  # the next turn is the first with a larger order
        # A feed lives as long as its client, mostly waiting: no turn record, event or
        # batch stays referenced here past its step (the `del`s below), or an idle feed
        # would hold a turn's events, or every turn record it listed, for good.
        if cursor is None:
            opened, current, after = _start(await store.list_turns(session_id, MAX_LIMIT))
            if opened is not None:
                yield (opened.run_id, [opened])
                del opened
        else:
            assert cursor.run_id is not None
            order = _order_of(await store.turn_of(session_id, cursor.run_id))
            if order is None:
                # gone (expired, removed), or never a turn of this session: its place in
                # the order is unknown, so nothing after it can be followed exactly
                yield (cursor.run_id, [_removed(cursor.event_id)])
                return
            if cursor.kind == "end":
                after = order
            else:
                assert cursor.event_id is not None
                current = _Turn(cursor.run_id, cursor.event_id, order)
        idle_since = time.monotonic()
        fresh = False
        while True:
            if current is None:
                if signal.closed:
                    raise BridgeClosed("the stream bridge closed")
                nxt, pending = await _next_turn(store, session_id, signal, seen, after, fresh=fresh)
                fresh = False
                if nxt is None:
                    if signal.changes == seen:
                        # Nothing moved: wait for the announcement (no read of its own),
                        # but look again soon at a claim caught between its steps.
                        waited = time.monotonic() - idle_since
                        if waited < heartbeat_interval:
                            left = heartbeat_interval - waited
                            await signal.wait(min(left, PENDING_RECHECK) if pending else left)
                        else:
                            yield (None, [HEARTBEAT])
                            idle_since = time.monotonic()
                        if signal.changes == seen:
                            fresh = pending
                            continue
                    seen = signal.changes
                    if await store.is_retired(session_id):
                        yield (None, [RETIRED])
                        return
                    continue
                opened = _opened(nxt)
                current = _Turn(opened.run_id, TURN_START, _order(nxt))
                del nxt
                yield (opened.run_id, [opened])
                del opened
            ended = False
            async for step in _follow_turn(bridge, store, session_id, current, on_turn):
                yield step
                if isinstance(step[1][-1], StreamGap | Retired):
                    return
                ended = isinstance(step[1][-1], End)
            if not ended:
                return  # (the bridge ended the subscription without a terminal item)
            del step  # the turn's last batch (a resume's whole replay, with its END)
            after, current = current.order, None
            idle_since = time.monotonic()
            seen = signal.changes
            if await store.is_retired(session_id):
                yield (None, [RETIRED])
                return


def _start(turns: list[dict[str, Any]]) -> tuple[TurnOpened | None, _Turn | None, int]:
    """Where a feed without a cursor starts, from the session's turns (oldest first): the
    running turn's `turn` frame and the turn to follow, or the order to follow after."""
    live = [t for t in turns if not T.is_ended(t.get("state"))]
    if live:
        opened = _opened(live[-1])
        return opened, _Turn(opened.run_id, TURN_START, _order(live[-1])), 0
    return None, None, (_order(turns[-1]) if turns else 0)


def _order_of(turn: dict[str, Any] | None) -> int | None:
    return None if turn is None else _order(turn)


async def _follow_turn(
    bridge: StreamBridge,
    store: SessionStore,
    session_id: str,
    turn: _Turn,
    on_turn: Callable[[str | None], None],
) -> AsyncGenerator[FeedStep, None]:
    """The run's own items, from the turn's position to its END (or a gap)."""
    run_id = turn.run_id
    info = await bridge.get_run(run_id)
    if info is None or info.session_id != session_id:
        yield (run_id, [_removed(turn.position)])  # (as the run stream: the cursor asked)
        return
    # A log that is gone is the bridge's to answer, with its cursor and gap rules.
    on_turn(run_id)
    batches = bridge.subscribe_batches(run_id, turn.position, None)
    try:
        async for batch in batches:
            last = batch[-1]
            removed = isinstance(last, StreamGap) and last.reason == "stream_removed"
            if removed and await store.is_retired(session_id):
                if len(batch) > 1:
                    yield (run_id, batch[:-1])
                yield (None, [RETIRED])
                return
            yield (run_id, batch)
            if isinstance(last, End | StreamGap):
                return
    finally:
        on_turn(None)
        await close_subscription(batches)
