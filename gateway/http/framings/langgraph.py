"""The LangGraph routes' framing (`/threads/{session_id}/runs/{run_id}/stream`): the run
stream's frames, plus a terminal `error` event after a gap.

The LangGraph SDK stops only after `end` or `error`; after any other close it asks the
run's status and reconnects, a gap included (it would loop on the gap without bound).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ...values import StreamGap, StreamItem
from ..streaming.frames import json_frame
from ..streaming.framing import Closing
from .run import RunFraming

GAP_ERROR: Final = json_frame(
    b"error",
    {
        "error": "stream_replay_gap",
        "message": "events after the cursor are no longer retained; reload the thread",
    },
)


@dataclass(frozen=True, slots=True)
class LangGraphFraming:
    run: RunFraming

    @property
    def terminal(self) -> tuple[type, ...]:
        return self.run.terminal

    def opening(self) -> bytes:
        return self.run.opening()

    def frame(self, item: StreamItem) -> bytes:
        if isinstance(item, StreamGap):
            return self.run.gap(item) + GAP_ERROR
        return self.run.frame(item)

    def closing(self, why: Closing, detail: str) -> bytes | None:
        return self.run.closing(why, detail)


def langgraph_framing(run_id: str) -> LangGraphFraming:
    return LangGraphFraming(RunFraming(run_id))
