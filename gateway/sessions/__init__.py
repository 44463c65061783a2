"""Sessions and turns (docs/protocol.md §6): durable turn records beside runs, a bounded session
index, durable retirement. Contract: `base.py`; record evolution: `turns.py`; operator
message shaping: `shaping.py`; the session feed: `feed.py`, `cursor.py`, `watch.py`; the AI
SDK's history: `ui_messages.py`; the memory store: `memory.py`. The Redis store is
`gateway/redis/sessions.py` (keys: `gateway/redis/session_keys.py`)."""

from .base import MAX_LIMIT, SessionRow, SessionStore, parse_flag, parse_limit
from .memory import MemorySessionStore
from .shaping import shape_input_message

__all__ = [
    "MAX_LIMIT",
    "MemorySessionStore",
    "SessionRow",
    "SessionStore",
    "parse_flag",
    "parse_limit",
    "shape_input_message",
]
