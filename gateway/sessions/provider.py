"""Picks the session store that lives beside a bridge (above both store backends)."""

from __future__ import annotations

from ..bridge.base import StreamBridge
from ..bridge.memory import MemoryStreamBridge
from ..redis.bridge import RedisStreamBridge
from ..redis.sessions import RedisSessionStore
from ..settings import Settings
from .base import SessionStore
from .memory import MemorySessionStore


def session_store_for(bridge: StreamBridge, settings: Settings) -> SessionStore:
    """Turns go where the runs are: the bridge's Redis, or process memory."""
    if isinstance(bridge, RedisStreamBridge):
        return RedisSessionStore(
            settings, bridge.client, notifier=bridge.notifier, calls=bridge.calls
        )
    if isinstance(bridge, MemoryStreamBridge):
        return bridge.sessions  # the bridge writes its turn records in its own steps
    return MemorySessionStore(settings)
