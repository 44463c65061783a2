"""The turn record's hash layout in Redis: its field names, declared once.

`lua/turn_fold.lua` writes the record (the loader gives it this table as `TURN_FIELD`,
`scripts.py`), `sessions._record` decodes it and `session_hints` reads its state, all by
these names; `tests/redis_backend/test_turn_fields.py` fails if a copy spells one itself.
The record's text is a separate string key (`keys.RunKeys.text`), not a field.
"""

from __future__ import annotations

from typing import Final

SESSION: Final = "session"  # the session id
ORDER: Final = "order"  # the turn's place in its session
STATE: Final = "state"  # running, parked, or the END status
CREATED: Final = "created"  # ms
UPDATED: Final = "updated"  # ms
CHARS: Final = "chars"  # the text's length in code points
TRUNC: Final = "trunc"  # "1" once a cap dropped something
STATUS: Final = "status"  # the last status object, raw JSON
ARTS: Final = "arts"  # how many artifacts
ART: Final = "art:"  # + i (1-based): artifact i, raw JSON
AID: Final = "aid:"  # + i: artifact i's string artifactId
HIST: Final = "hist"  # how many history entries
HIST_ITEM: Final = "hist:"  # + i (1-based): entry i, raw JSON

# What the Lua scripts get, by the names they use (`TURN_FIELD.state`, ...).
LUA_TABLE: Final = {
    "session": SESSION,
    "order": ORDER,
    "state": STATE,
    "created": CREATED,
    "updated": UPDATED,
    "chars": CHARS,
    "trunc": TRUNC,
    "status": STATUS,
    "arts": ARTS,
    "art": ART,
    "aid": AID,
    "hist": HIST,
    "hist_item": HIST_ITEM,
}
