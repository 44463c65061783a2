"""A reader resuming after a removal is not handed the removed log from a read shared
before it (`Reads.open_shared`, `RunFeed.read_shared` keep an ended log's read for up to
`SHARED_READ_SECONDS`).

The removal is made by another process (a second bridge on the same server: its caches
are not this one's), as a session retirement or an operator `DELETE` through another
gateway is. Once a read of this process has found the log missing, no later reader of
this process is answered from a read made before."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from gateway.bridge.provider import open_bridge
from gateway.settings import Settings
from gateway.values import End, StreamEvent, StreamGap, StreamItem
from tests.support.redis_servers import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


async def _opened(bridge: Any, run_id: str, cursor: str | None) -> list[StreamItem]:
    """What an HTTP reader gets (`open_stream`, its first read shared), to the end."""
    _, follow = await bridge.open_stream(run_id, cursor)
    out: list[StreamItem] = []
    stream: AsyncIterator[Any] = follow()
    async for batch in stream:
        out.extend(batch)
        if out and isinstance(out[-1], End | StreamGap):
            break
    return out


async def test_no_replay_of_a_removed_log_after_a_read_found_it_missing(
    key_prefix: str,
) -> None:
    server = RedisServer("--appendonly", "no", "--save", "")
    server.start()
    settings = Settings(redis_url=server.url, redis_key_prefix=key_prefix, lease_seconds=120)
    try:
        async with open_bridge(settings) as bridge, open_bridge(settings) as other:
            claim = await bridge.claim("rb")
            ids = (
                await bridge.publish_many(
                    "rb", [("t", i) for i in range(6)], producer_token=claim.token
                )
            ).ids
            await bridge.publish_end("rb", "success", producer_token=claim.token)
            with anyio.fail_after(10):
                before = await _opened(bridge, "rb", None)
                assert [i.id for i in before if isinstance(i, StreamEvent)] == list(ids)

                await other.cleanup("rb")  # removed through another process

                behind = await _opened(bridge, "rb", ids[4])
                assert [(type(i), getattr(i, "reason", None)) for i in behind] == [
                    (StreamGap, "stream_removed")
                ]
                # Rejoining from the start, as the gap's null bounds say: not the
                # removed log's events again.
                again = await _opened(bridge, "rb", None)
            assert not [i for i in again if isinstance(i, StreamEvent)], again
            assert isinstance(again[-1], End | StreamGap)
    finally:
        server.close()
