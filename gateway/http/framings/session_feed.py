"""The session feed's framing (`GET /v1/sessions/{session_id}/stream`).

Every frame carries a session cursor as its `id:` (`gateway.sessions.cursor`):

    id: r1/0-0         event: turn       data: {"run_id", "input_message", "created_at"}
    id: r1/<event id>  event: <name>     data: the run's payload, byte for byte
    id: r1/end         event: turn_end   data: {"run_id", "status"[, "error"]}
    id: r1/gap         event: gap        data: the run gap payload + "session_id"; last
    id: retired        event: end        data: {"status": "retired", "session_id"}; last
    : heartbeat        between turns too

The feed (`sessions.feed.follow_session`) yields steps `(run_id, items)`; `feed_items`
turns them into one stream of items, with an `InRun` marker where the run changes, so
that the framing is a framing like any other (it remembers the run it is in).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Final, assert_never

from ...bridge.base import close_subscription
from ...sessions.cursor import RETIRED as RETIRED_CURSOR
from ...sessions.cursor import TURN_START
from ...sessions.feed import FeedItem, FeedStep, Retired, TurnOpened
from ...values import End, Heartbeat, StreamEvent, StreamGap
from ..streaming.frames import HEARTBEAT_FRAME, event_frame, json_frame, retry_frame
from ..streaming.framing import Closing
from .run import closing_frame, end_payload, gap_payload

TERMINAL: Final[tuple[type, ...]] = (StreamGap, Retired)


@dataclass(frozen=True, slots=True)
class InRun:
    """The items after this one belong to `run_id` (None: between turns)."""

    run_id: str | None


FeedFrameItem = FeedItem | InRun


async def feed_items(
    steps: AsyncGenerator[FeedStep, None],
) -> AsyncGenerator[Sequence[FeedFrameItem], None]:
    """The feed's steps as batches of items, an `InRun` first where the run changes."""
    current: str | None = None
    try:
        async for run_id, items in steps:
            if run_id != current:
                current = run_id
                yield [InRun(run_id), *items]
            else:
                yield items
    finally:
        await close_subscription(steps)


class SessionFeedFraming:
    """The frames of one session feed (made per response: it remembers the run it is in)."""

    __slots__ = ("_run", "_run_id", "session_id")

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self._run_id = ""
        self._run = b""

    @property
    def terminal(self) -> tuple[type, ...]:
        return TERMINAL

    def opening(self) -> bytes:
        return retry_frame()

    def frame(self, item: FeedFrameItem) -> bytes:
        match item:
            case StreamEvent():
                # the run stream's frame of the event (built once, shared), with a session cursor
                return b"id: %s/%s" % (self._run, event_frame(item)[4:])
            case Heartbeat():
                return HEARTBEAT_FRAME
            case InRun():
                self._run_id = item.run_id or ""
                self._run = self._run_id.encode()
                return b""
            case TurnOpened():
                payload = {
                    "run_id": item.run_id,
                    "input_message": item.input_message,
                    "created_at": item.created_at,
                }
                return json_frame(b"turn", payload, f"{item.run_id}/{TURN_START}")
            case End():
                payload = {"run_id": self._run_id, **end_payload(item)}
                return json_frame(b"turn_end", payload, f"{self._run_id}/end")
            case StreamGap():
                payload = {**gap_payload(self._run_id, item), "session_id": self.session_id}
                return json_frame(b"gap", payload, f"{self._run_id}/gap")
            case Retired():
                payload = {"status": "retired", "session_id": self.session_id}
                return json_frame(b"end", payload, RETIRED_CURSOR)
            case _:
                assert_never(item)

    def closing(self, why: Closing, detail: str) -> bytes | None:
        return closing_frame(why, {"session_id": self.session_id}, detail)

    @property
    def run_id(self) -> str:
        """The run the feed is in ("" between turns): what a gap log line names."""
        return self._run_id
