"""Starting a turn twice: a claim's idempotency key (docs/protocol.md, "Starting a turn
twice"), one rule for both backends.

A claim under a session may carry a key (an app passes its client message id). The
first claim with a key in a session records `key -> run`; a later claim with the same
key in that session starts nothing while that run lives or within its ended TTL: it is
told `TurnExists` with the first run's id, so a double submit, a retried request or a
second tab follows the turn already running instead of starting a second generation.

The backends keep the entry (memory: beside the run record, dropped with it; Redis: one
hash in the session's slot, `lua/claim_key.lua`, taken atomically so that of two
concurrent claims exactly one wins) and ask `decide` what a held entry means.
"""

from __future__ import annotations

import re
from typing import Final, Literal

from ..errors import InvalidInput
from ..values import RunInfo

KEY_PATTERN: Final = r"[A-Za-z0-9._:-]{1,200}"
_KEY: Final = re.compile(KEY_PATTERN)

# An entry whose run has no record yet may belong to a claim between its two steps
# (Redis: the key's entry is taken before the run's own claim script runs). Only an
# entry older than this with no record is taken for one whose claim never completed.
UNCLAIMED_SECONDS: Final = 30.0

Verdict = Literal["take", "exists"]


def check_key(key: object, session_id: str | None) -> str:
    """`key` if it is one (1-200 chars of `[A-Za-z0-9._:-]`) and the claim has a session."""
    if not isinstance(key, str) or _KEY.fullmatch(key) is None:
        raise InvalidInput("idempotency_key must be 1-200 characters of [A-Za-z0-9._:-]")
    if session_id is None:
        raise InvalidInput("idempotency_key needs session_id: a key is unique per session")
    return key


def decide(
    holder_run: RunInfo | None,
    held_for: float,
    *,
    holder: str,
    run_id: str,
    takeover: bool,
    now: float,
    ended_ttl: float,
) -> Verdict:
    """What a claim of `run_id` does with a key already held by `holder` (recorded
    `held_for` seconds ago; `holder_run` its record, None when it has none).

    - `takeover` of that same run: its producer takes its own turn back ("take").
    - the holder lives, or ended less than `ended_ttl` ago: "exists" (409 turn_exists).
    - the holder has no record but the entry is young: its claim may be between its
      steps, "exists".
    - otherwise (expired, or a claim that never completed) the key is free: "take".
    """
    if holder == run_id and takeover:
        return "take"
    if holder_run is not None:
        if not holder_run.ended or now - holder_run.updated_at < ended_ttl:
            return "exists"
        return "take"
    return "exists" if held_for < UNCLAIMED_SECONDS else "take"
