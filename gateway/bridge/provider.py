"""Builds the stream bridge the settings ask for, and tears it down whatever happens.

Sits above the backends: `redis_url` unset → the embedded memory bridge; `redis://…`
→ one Redis; `redis+cluster://…` → Redis Cluster.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from ..redis.bridge import RedisStreamBridge
from ..settings import Settings
from .base import StreamBridge
from .memory import MemoryStreamBridge


@asynccontextmanager
async def open_bridge(settings: Settings) -> AsyncIterator[StreamBridge]:
    if settings.redis_url is not None:
        # Its own context owns the change-notification listener; teardown is shielded.
        async with RedisStreamBridge.connect(settings) as redis_bridge:
            yield redis_bridge
        return
    bridge = MemoryStreamBridge(settings)
    try:
        yield bridge
    finally:
        # Teardown completes even when the surrounding task is being cancelled.
        with anyio.CancelScope(shield=True):
            await bridge.close()
