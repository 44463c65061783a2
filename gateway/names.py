"""Validation of the names clients choose: run ids, session ids, event names, END statuses."""

from __future__ import annotations

import re
from typing import Final

from .errors import InvalidInput
from .values import END_STATUSES, EndStatus

# Run and session ids: 1-128 chars of [A-Za-z0-9._:-], the first a letter or digit.
ID_PATTERN: Final = r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}"
_ID_RE: Final = re.compile(ID_PATTERN)
_EVENT_RE: Final = re.compile(r"[!-9;-~]{1,64}")  # printable ASCII except ':' and space


def is_valid_id(value: str) -> bool:
    """True for a well-formed run or session id."""
    return _ID_RE.fullmatch(value) is not None


def check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not _ID_RE.fullmatch(run_id):
        raise InvalidInput(
            "run_id must be 1-128 chars of [A-Za-z0-9._:-] starting with a letter or digit"
        )
    return run_id


def check_session_id(session_id: str) -> str:
    if not isinstance(session_id, str) or not _ID_RE.fullmatch(session_id):
        raise InvalidInput(
            "session_id must be 1-128 chars of [A-Za-z0-9._:-] starting with a letter or digit"
        )
    return session_id


def check_event_name(name: str) -> str:
    if not isinstance(name, str) or not _EVENT_RE.fullmatch(name):
        raise InvalidInput("event name must be 1-64 printable ASCII chars without ':' or spaces")
    return name


def check_end_status(status: str) -> EndStatus:
    if status not in END_STATUSES:
        raise InvalidInput(f"status must be one of {sorted(END_STATUSES)}")
    return status  # type: ignore[return-value]
