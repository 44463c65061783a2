"""Session index reads stay bounded: 10,000 sessions, then `list_sessions(limit=50)` and
`list_sessions(limit=50, parked=True)` on a real redis-server this script starts.

Prints, per read: wall time (median of REPEAT reads), Redis commands executed per read
(from INFO commandstats; an EVALSHA counts once, its inner calls are listed too) and
the number of keys in the database, so the cost can be compared with the data size.

    .venv/bin/python bench/sessions_index.py [sessions]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from redis.asyncio import Redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.redis.bridge import RedisStreamBridge  # noqa: E402
from gateway.redis.sessions import RedisSessionStore  # noqa: E402
from gateway.sessions.provider import session_store_for  # noqa: E402
from gateway.settings import Settings  # noqa: E402
from tests.support.redis_servers import RedisServer  # noqa: E402

SESSIONS = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
PARKED_EVERY = 10  # every 10th session has a parked newest turn
REPEAT = 50
WORKERS = 64


async def fill(bridge: RedisStreamBridge) -> None:
    """Turns written as producers write them: the bridge's claim, append and END (which
    write the turn records themselves)."""
    next_index = iter(range(SESSIONS))

    async def worker() -> None:
        for i in next_index:
            session_id, run_id = f"bench-s{i}", f"bench-r{i}"
            message = {
                "messageId": f"m{i}",
                "role": "user",
                "parts": [{"kind": "text", "text": f"question {i}"}],
            }
            claim = await bridge.claim(run_id, session_id=session_id, input_message=message)
            await bridge.publish(run_id, "token", "answer ", producer_token=claim.token)
            if i % PARKED_EVERY == 0:
                await bridge.publish(run_id, "state", "input-required", producer_token=claim.token)
            else:
                await bridge.publish_end(run_id, "success", producer_token=claim.token)

    async with anyio.create_task_group() as tg:
        for _ in range(WORKERS):
            tg.start_soon(worker)


async def commandstats(client: Redis) -> dict[str, int]:
    info: dict[str, Any] = await client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items()}


async def measure(client: Redis, store: RedisSessionStore, parked: bool) -> None:
    rows = await store.list_sessions(limit=50, parked=parked)  # warm (scripts loaded)
    times = []
    for _ in range(REPEAT):
        start = time.perf_counter()
        rows = await store.list_sessions(limit=50, parked=parked)
        times.append(time.perf_counter() - start)
    before = await commandstats(client)
    await store.list_sessions(limit=50, parked=parked)
    after = await commandstats(client)
    calls = {
        name: after[name] - before.get(name, 0)
        for name in after
        if after[name] != before.get(name, 0) and name not in ("info",)
    }
    calls["info"] = after.get("info", 0) - before.get("info", 0) - 1  # our own INFO
    calls = {k: v for k, v in calls.items() if v}
    top_level = sum(v for k, v in calls.items() if k in ("evalsha", "zrevrange", "eval"))
    label = "list_sessions(limit=50, parked=true)" if parked else "list_sessions(limit=50)"
    print(
        f"{label:40s} rows={len(rows):3d}  median {statistics.median(times) * 1e3:6.2f} ms"
        f"  p95 {sorted(times)[int(REPEAT * 0.95) - 1] * 1e3:6.2f} ms"
        f"  client commands={top_level}  (server-side incl. script calls: {calls})"
    )


async def main() -> None:
    with RedisServer() as server:
        client = Redis.from_url(server.url)
        settings = Settings(redis_url=server.url)
        bridge = RedisStreamBridge.connect(settings)
        store = session_store_for(bridge, settings)
        assert isinstance(store, RedisSessionStore)
        start = time.perf_counter()
        await fill(bridge)
        filled = time.perf_counter() - start
        keys = await client.dbsize()
        print(
            f"filled {SESSIONS} sessions ({SESSIONS // PARKED_EVERY} parked) in {filled:.1f} s;"
            f" {keys} keys in Redis"
        )
        await measure(client, store, parked=False)
        await measure(client, store, parked=True)
        await bridge.close()
        await client.aclose()


if __name__ == "__main__":
    anyio.run(main)
