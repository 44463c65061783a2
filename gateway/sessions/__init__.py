"""Sessions and turns (docs/protocol.md §6): durable turn records beside runs, a bounded session
index, durable retirement. Contract: `base.py`; record evolution: `turns.py`; operator
message shaping: `shaping.py`; backends: `memory.py`, `redis.py` (keys: `keys.py`)."""

from .base import MAX_LIMIT, SessionRow, SessionStore, parse_flag, parse_limit
from .memory import MemorySessionStore
from .redis import RedisSessionStore
from .shaping import shape_input_message

__all__ = [
    "MAX_LIMIT",
    "MemorySessionStore",
    "RedisSessionStore",
    "SessionRow",
    "SessionStore",
    "parse_flag",
    "parse_limit",
    "shape_input_message",
]
