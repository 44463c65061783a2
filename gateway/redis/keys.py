"""Every Redis key name the gateway uses, in one place.

All keys of one run carry the `{run_id}` hash tag, so they share one Redis Cluster slot
and every script touches a single slot. The prefix must not contain braces, or it would
become the hash tag.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidInput


def check_prefix(prefix: str) -> str:
    if "{" in prefix or "}" in prefix:
        raise InvalidInput("the Redis key prefix must not contain '{' or '}'")
    return prefix


@dataclass(frozen=True, slots=True)
class RunKeys:
    meta: str  # hash: the run record (lease, epoch, status, trim boundary, ...)
    log: str  # stream: the events, then at most one END entry
    turn: str  # hash: the run's turn record when it is a turn of a session (turn_fold.lua)
    text: str  # string: that turn's answer text

    @property
    def both(self) -> tuple[str, str]:
        return (self.meta, self.log)

    @property
    def writes(self) -> tuple[str, str, str, str]:
        """The KEYS of the scripts that write the run (and so its turn record)."""
        return (self.meta, self.log, self.turn, self.text)


def run_keys(prefix: str, run_id: str) -> RunKeys:
    tag = f"{prefix}{{{run_id}}}"
    return RunKeys(meta=f"{tag}:meta", log=f"{tag}:log", turn=f"{tag}:turn", text=f"{tag}:text")


# Stream entry layout. An event is {e: name, d: json}; an END is {end: status[, err: json]}.
FIELD_EVENT = b"e"
FIELD_DATA = b"d"
FIELD_END = b"end"
FIELD_ERROR = b"err"
