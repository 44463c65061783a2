"""How a turn record evolves as its run streams (docs/protocol.md §6). Pure: no I/O, no clock.

A turn record is a JSON object, the same on both backends:

    {"run_id", "session_id", "order", "state", "created_at", "last_updated",
     "text", "status", "artifacts", "history", "truncated"}

- `order`: the turn's place in its session, assigned by the backend when it accepted the
  claim (a per-session counter, never a clock): every reader sorts turns by it.

- `state`: "running", "input-required", "auth-required" (both *parked* on the operator),
  or the END status (`values.EndStatus`).
- `text`: the joined answer text. `status`: the last status object as the producer sent
  it (untransformed; null until one is sent). `artifacts`: the artifact objects as sent.
  `history`: opens with the shaped operator message (see `shaping.py`) when there is one,
  then the messages the producer appended.
- `truncated`: true once any cap below dropped something (on Redis also once a log
  removed outside the gateway took text not yet folded in: docs/bridge.md).
- Times are unix seconds (float) as passed by the caller.

Event names producers use (every other name is ignored here; it still goes to the run
log and the live stream):

- `token`, `text-delta` -- data `{"text": str}` or a bare string: appended to `text`.
- `text-set` -- same data: replaces `text` (a multi-pass turn keeps only its final pass).
- `state` -- data `{"state": s}` or a bare string s, s one of `running`,
  `input-required`, `auth-required`: sets `state`.
- `artifact` -- an artifact object: appended to `artifacts`; one whose string
  `artifactId` equals a stored one's replaces it in place.
- `status` -- a status object (A2A `TaskStatus`): stored as `status`, untransformed; its
  `state` also sets `state` when it is `input-required` / `auth-required`, or
  `running` / `working` (-> `running`).
- `history`, `message` -- a message object: appended to `history` as sent (e.g. a
  steer-consumed marker carrying the operator's interjection).
- `ui` -- an AI SDK UI message chunk (`{"type": ...}`, what `streamText(...)
  .toUIMessageStream()` yields; the ui-stream route replays these): a `text-delta`
  chunk's `delta` is appended to `text`; every other chunk type is kept in the run log
  only.

END (`end_turn`) sets `state` to the END status. Once a turn has ended, later events do
not change it (only a retire/clear removes it). Malformed data for a known name (e.g. a
`state` that is not one of the three) is ignored, never an error: the turn record is a
best-effort view and must never fail a producer's write.

This module is the one definition of how a record evolves. The backends apply it inside
their write step (the memory bridge in the same synchronous step as the append, END or
claim; Redis in the same Lua script, `lua/turn_fold.lua`, text events from the log
before any read of the record, which a contract test holds to
`fold_encoded` on the same event sequences). So the rules are stated over the encoded
payload bytes the log stores: an item's size is its payload's length, an object is a
payload starting with `{`, text lengths are Unicode code points.

Caps (`TurnLimits`, defaults): `text` 200,000 chars; 32 artifacts; 32 history entries
(the operator message included); each artifact, status or history entry at most
64 KiB of compact JSON (a bigger one is dropped). So a record stays under ~5 MiB of JSON
whatever the producer sends.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

import orjson

from ..values import END_STATUSES, EndStatus, encode_json, encode_nested

RUNNING: Final = "running"
PARKED_STATES: Final = frozenset({"input-required", "auth-required"})
LIVE_STATES: Final = frozenset({RUNNING, *PARKED_STATES})

TEXT_APPEND_EVENTS: Final = frozenset({"token", "text-delta"})
TEXT_SET_EVENTS: Final = frozenset({"text-set"})
STATE_EVENTS: Final = frozenset({"state"})
ARTIFACT_EVENTS: Final = frozenset({"artifact"})
STATUS_EVENTS: Final = frozenset({"status"})
HISTORY_EVENTS: Final = frozenset({"history", "message"})
UI_CHUNK_EVENT: Final = "ui"
# The events that change only the text (text, chars, trunc, updated), which no other
# event reads: folding them later gives the record they would have given at once, so
# the Redis record folds them from the log, not per token (lua/turn_fold.lua).
TEXT_EVENTS: Final = frozenset({UI_CHUNK_EVENT}) | TEXT_APPEND_EVENTS | TEXT_SET_EVENTS
TURN_EVENTS: Final = (
    TEXT_EVENTS
    | STATE_EVENTS
    | ARTIFACT_EVENTS
    | STATUS_EVENTS
    | HISTORY_EVENTS
)

_STATUS_STATE_MAP: Final = {
    "input-required": "input-required",
    "auth-required": "auth-required",
    "running": RUNNING,
    "working": RUNNING,
}


@dataclass(frozen=True, slots=True)
class TurnLimits:
    max_text_chars: int = 200_000
    max_artifacts: int = 32
    max_history: int = 32
    max_item_bytes: int = 65_536


DEFAULT_LIMITS: Final = TurnLimits()


def is_parked(state: str | None) -> bool:
    return state in PARKED_STATES


def is_ended(state: str | None) -> bool:
    return state in END_STATUSES


def new_turn(
    session_id: str,
    run_id: str,
    operator_message: dict[str, Any] | None,
    now: float,
    order: int = 0,
) -> dict[str, Any]:
    """A fresh running turn; `operator_message` is the already shaped message (or None)."""
    return {
        "run_id": run_id,
        "session_id": session_id,
        "order": order,
        "state": RUNNING,
        "created_at": now,
        "last_updated": now,
        "text": "",
        "status": None,
        "artifacts": [],
        "history": [operator_message] if operator_message is not None else [],
        "truncated": False,
    }


def copy_turn(turn: dict[str, Any]) -> dict[str, Any]:
    """A deep, detached copy (what readers get, so they never alias stored state)."""
    copied: dict[str, Any] = orjson.loads(encode_json(turn))
    return copied


def touches_turn(events: Iterable[tuple[str, Any]]) -> bool:
    """Whether any of `events` is one a turn record folds in (the others leave it as is,
    so a store need not even read the record for them)."""
    return any(name in TURN_EVENTS for name, _ in events)


def moves_state(events: Iterable[tuple[str, Any]]) -> bool:
    """Whether any of `events` may move a turn's state (in or out of parked)."""
    return any(name in STATE_EVENTS or name in STATUS_EVENTS for name, _ in events)


def apply_events(
    turn: dict[str, Any],
    events: list[tuple[str, Any]],
    now: float,
    limits: TurnLimits = DEFAULT_LIMITS,
) -> bool:
    """Fold `events` into `turn` in place; True when the record changed.

    `last_updated` moves to `now` when anything changed (never backwards).
    """
    if is_ended(turn.get("state")):
        return False
    changed = False
    for name, data in events:
        if name in TURN_EVENTS:
            changed = _apply_one(turn, name, data, limits) or changed
    if changed:
        turn["last_updated"] = max(float(turn.get("last_updated", now)), now)
    return changed


def fold_encoded(
    turn: dict[str, Any],
    events: Iterable[tuple[str, bytes]],
    now: float,
    limits: TurnLimits = DEFAULT_LIMITS,
) -> bool:
    """`apply_events` over encoded payloads (what the log stores; what the backends'
    write steps see): a payload is decoded only when its event name is one a turn folds."""
    if is_ended(turn.get("state")):
        return False
    changed = False
    for name, payload in events:
        if name in TURN_EVENTS:
            try:
                data = orjson.loads(payload)
            except orjson.JSONDecodeError:
                continue
            changed = _apply_one(turn, name, data, limits, len(payload)) or changed
    if changed:
        turn["last_updated"] = max(float(turn.get("last_updated", now)), now)
    return changed


def end_turn(turn: dict[str, Any], status: EndStatus, now: float) -> bool:
    """Set the END status; True when the record changed (a second END is a no-op)."""
    if status not in END_STATUSES or is_ended(turn.get("state")):
        return False
    turn["state"] = status
    turn["last_updated"] = max(float(turn.get("last_updated", now)), now)
    return True


def _text_of(data: Any) -> str | None:
    if isinstance(data, str):
        return data
    if isinstance(data, dict):
        text = data.get("text")
        if isinstance(text, str):
            return text
    return None


# Containers above a record where readers get it (`{"turns": [record]}`), and above an
# item of the record: the record itself, then the list the item sits in.
RECORD_DEPTH: Final = 2
_IN_RECORD: Final = RECORD_DEPTH + 1
_IN_LIST: Final = RECORD_DEPTH + 2


def _detached_within(
    item: Any, limits: TurnLimits, depth: int, size: int | None = None
) -> Any | None:
    """A detached copy of `item` when its JSON fits the item cap (`size`: the payload's
    length as published, else its compact JSON's) and the record holding it `depth`
    containers deep still encodes (so every reader can read it back), else None."""
    try:
        encoded = encode_nested(item, depth)
    except TypeError:  # orjson.JSONEncodeError: nested too deeply to store
        return None
    if (len(encoded) if size is None else size) > limits.max_item_bytes:
        return None
    return orjson.loads(encoded)


def _set_text(turn: dict[str, Any], piece: str, append: bool, limits: TurnLimits) -> bool:
    joined = str(turn.get("text", "")) + piece if append else piece
    if len(joined) > limits.max_text_chars:
        joined = joined[: limits.max_text_chars]
        turn["truncated"] = True
    if joined == turn.get("text"):
        return False
    turn["text"] = joined
    return True


def _apply_one(
    turn: dict[str, Any], name: str, data: Any, limits: TurnLimits, size: int | None = None
) -> bool:
    if name in TEXT_APPEND_EVENTS or name in TEXT_SET_EVENTS:
        piece = _text_of(data)
        if piece is None:
            return False
        return _set_text(turn, piece, name in TEXT_APPEND_EVENTS, limits)
    if name == UI_CHUNK_EVENT:
        if not isinstance(data, dict) or data.get("type") != "text-delta":
            return False
        delta = data.get("delta")
        return isinstance(delta, str) and _set_text(turn, delta, True, limits)
    if name in STATE_EVENTS:
        state = data.get("state") if isinstance(data, dict) else data
        if not isinstance(state, str) or state not in LIVE_STATES or state == turn.get("state"):
            return False
        turn["state"] = state
        return True
    if name in ARTIFACT_EVENTS:
        if not isinstance(data, dict):
            return False
        data = _detached_within(data, limits, _IN_LIST, size)
        if data is None:
            turn["truncated"] = True
            return True
        artifacts: list[Any] = turn.setdefault("artifacts", [])
        artifact_id = data.get("artifactId")
        if isinstance(artifact_id, str):
            for index, existing in enumerate(artifacts):
                if isinstance(existing, dict) and existing.get("artifactId") == artifact_id:
                    artifacts[index] = data
                    return True
        if len(artifacts) >= limits.max_artifacts:
            turn["truncated"] = True
            return True
        artifacts.append(data)
        return True
    if name in STATUS_EVENTS:
        if not isinstance(data, dict):
            return False
        data = _detached_within(data, limits, _IN_RECORD, size)
        if data is None:
            turn["truncated"] = True
            return True
        turn["status"] = data
        status_state = data.get("state")
        if isinstance(status_state, str) and status_state in _STATUS_STATE_MAP:
            turn["state"] = _STATUS_STATE_MAP[status_state]
        return True
    if name in HISTORY_EVENTS:
        if not isinstance(data, dict):
            return False
        history: list[Any] = turn.setdefault("history", [])
        data = _detached_within(data, limits, _IN_LIST, size)
        if data is None or len(history) >= limits.max_history:
            turn["truncated"] = True
            return True
        history.append(data)
        return True
    return False
