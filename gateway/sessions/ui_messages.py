"""A session's turns as the AI SDK's `UIMessage[]` (docs/protocol.md §8). Pure: no I/O.

What `GET /v1/sessions/{id}/ui-messages` returns, so a page that loads after a turn
ended restores the chat with `useChat({messages})` (or `new Chat({messages})`).

Each turn record (`turns.py`), oldest first, gives at most two messages:

- its input message (the first `history` entry, when that is a `user` message, i.e.
  the claim's `input_message` as `shaping.py` stored it) as
  `{"id": messageId, "role": "user", "parts": [...]}`: each text part as
  `{"type": "text", "text"}`, each attachment shell with a plain link as
  `{"type": "file", "mediaType", "url", "filename"?}` (inline payloads never reached
  the record, so they are left out). A message with no such part (a hidden resume) is
  no bubble and is left out; a message without a `messageId` gets `<run_id>:user`.
- its answer as `{"id": run_id, "role": "assistant", "parts": [{"type": "text",
  "text", "state": "done"}], "metadata": {"status": <state>, "error"?: <END error>}}`
  (no part when the turn has no text: an error before any text is still listed, with
  its error, never as an empty success).

A turn that has not ended contributes its user message only: its answer is the UI
stream's (`GET …/ui-stream` replays it from the start), and the AI SDK seeds a resumed
answer from the last assistant message, so a partial answer listed here would be shown
twice. A parked turn (`input-required` / `auth-required`) is the same while it is the
session's running turn (the one the UI stream replays); an older parked turn, which no
stream will replay, is listed with its text and its state as `status`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..values import END_STATUSES

USER_ROLE: Final = "user"


def needs_error(turn: Mapping[str, Any]) -> bool:
    """Whether the turn ended with a status other than success (its END error, from the
    run record, then belongs in its metadata)."""
    state = turn.get("state")
    return state in END_STATUSES and state != "success"


def ui_messages(
    turns: Sequence[Mapping[str, Any]],
    running_run_id: str | None,
    errors: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The `UIMessage[]` of `turns` (turn records, oldest first).

    `running_run_id` is the session's running turn (the one the UI stream replays), or
    None; `errors` maps a run id to its END error (`RunInfo.error`) for the turns that
    `needs_error` names.
    """
    errors = errors or {}
    messages: list[dict[str, Any]] = []
    for turn in turns:
        run_id = str(turn.get("run_id", ""))
        user = _user_message(turn, run_id)
        if user is not None:
            messages.append(user)
        state = turn.get("state")
        if state not in END_STATUSES and (state == "running" or run_id == running_run_id):
            continue  # its answer comes from the UI stream
        messages.append(_assistant_message(turn, run_id, errors.get(run_id)))
    return messages


def _user_message(turn: Mapping[str, Any], run_id: str) -> dict[str, Any] | None:
    history = turn.get("history")
    if not isinstance(history, list) or not history:
        return None
    first = history[0]
    if not isinstance(first, dict) or first.get("role") != USER_ROLE:
        return None  # no operator message: the history opens with a producer's
    parts: list[dict[str, Any]] = []
    for part in first.get("parts") or ():
        if not isinstance(part, dict):
            continue
        if part.get("kind") == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif part.get("kind") == "file":
            file_part = _file_part(part.get("file"))
            if file_part is not None:
                parts.append(file_part)
    if not parts:
        return None  # a hidden message: never a bubble
    message_id = first.get("messageId")
    if not isinstance(message_id, str) or not message_id:
        message_id = f"{run_id}:user"
    return {"id": message_id, "role": USER_ROLE, "parts": parts}


def _file_part(file: Any) -> dict[str, Any] | None:
    if not isinstance(file, dict):
        return None
    url, media_type = file.get("uri"), file.get("mimeType")
    if not isinstance(url, str) or not isinstance(media_type, str):
        return None
    part: dict[str, Any] = {"type": "file", "mediaType": media_type, "url": url}
    if isinstance(file.get("name"), str):
        part["filename"] = file["name"]
    return part


def _assistant_message(turn: Mapping[str, Any], run_id: str, error: Any) -> dict[str, Any]:
    text = turn.get("text")
    parts = (
        [{"type": "text", "text": text, "state": "done"}] if isinstance(text, str) and text else []
    )
    metadata: dict[str, Any] = {"status": turn.get("state")}
    if error is not None and needs_error(turn):
        metadata["error"] = error
    return {"id": run_id, "role": "assistant", "parts": parts, "metadata": metadata}
