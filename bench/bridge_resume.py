"""Resumes on the Redis bridge: a reader reconnects with a cursor 200 events behind the END
of a 10,000-event log, reads to the END and closes its subscription; against the naive
read of the same events (one plain `XRANGE` from the cursor, its entries decoded) in the
same run.

1. One resume at a time: median milliseconds per resume (each closed before the next
   starts, so no resume shares another's read), the Redis commands one costs and the
   time Redis spends on them (`INFO commandstats`).
2. 100 resumes at once (a reconnect storm after a deploy): wall milliseconds until every
   one has its END; they share one read of the log.

Every event's payload is decoded (`StreamEvent.value()`), as a client would.

Run: .venv/bin/python bench/bridge_resume.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import orjson
from _common import RedisServer
from redis.asyncio import Redis

from gateway import RedisStreamBridge, Settings
from gateway.redis.keys import run_keys
from gateway.values import End

RETAINED, MISSED, STORM = 10_000, 200, 100
PREFIX = "bench:"


def payload(i: int) -> dict[str, Any]:
    return {"type": "AIMessageChunk", "seq": i, "content": "x" * 89, "id": "run-0123456789"}


async def _resume(bridge: RedisStreamBridge, run_id: str, cursor: str) -> float:
    started = time.perf_counter()
    subscription = bridge.subscribe(run_id, cursor)
    got = 0
    try:
        async for item in subscription:
            if isinstance(item, End):
                break
            item.value()  # type: ignore[union-attr]
            got += 1
    finally:
        await subscription.aclose()
    assert got == MISSED, got
    return time.perf_counter() - started


async def _naive(client: Redis, log: str, cursor: str) -> float:
    started = time.perf_counter()
    entries = await client.xrange(log, f"({cursor}", "+", count=MISSED + 1)
    got = sum(1 for _id, fields in entries if b"d" in fields and orjson.loads(fields[b"d"]))
    assert got == MISSED, got
    return time.perf_counter() - started


TOP_LEVEL = ("multi", "exec", "evalsha")  # what Redis times whole, inner commands included


async def measure(url: str, singles: int) -> None:
    settings = Settings(redis_url=url, redis_key_prefix=PREFIX, max_events_per_run=RETAINED)
    async with RedisStreamBridge.connect(settings) as bridge:
        client = Redis.from_url(url)
        run_id = f"resume-{time.monotonic_ns()}"
        claim = await bridge.claim(run_id)
        batch = [("messages", payload(i)) for i in range(RETAINED)]
        ids: list[str] = []
        for start in range(0, RETAINED, 500):
            chunk = batch[start : start + 500]
            ids += (await bridge.publish_many(run_id, chunk, producer_token=claim.token)).ids
        await bridge.publish_end(run_id, "success", producer_token=claim.token)
        cursor, log = ids[-(MISSED + 1)], run_keys(PREFIX, run_id).log

        for _ in range(20):  # warm-up: connections, scripts
            await _resume(bridge, run_id, cursor)
            await _naive(client, log, cursor)
        await client.config_resetstat()
        gateway = [await _resume(bridge, run_id, cursor) for _ in range(singles)]
        stats = await client.info("commandstats")
        await client.config_resetstat()
        naive = [await _naive(client, log, cursor) for _ in range(singles)]
        naive_usec = (await client.info("commandstats"))["cmdstat_xrange"]["usec"] / singles
        # A transaction's time is its MULTI's and EXEC's (EXEC's includes the queued
        # commands', also counted apart), as a script's is its EVALSHA's (on a cluster).
        gateway_usec = (
            sum(stats.get(f"cmdstat_{name}", {}).get("usec", 0) for name in TOP_LEVEL) / singles
        )
        commands = {
            name.removeprefix("cmdstat_"): row["calls"] / singles
            for name, row in stats.items()
            if name != "cmdstat_config|resetstat"
        }

        started = time.perf_counter()
        await asyncio.gather(*(_resume(bridge, run_id, cursor) for _ in range(STORM)))
        storm = time.perf_counter() - started
        started = time.perf_counter()
        await asyncio.gather(*(_naive(client, log, cursor) for _ in range(STORM)))
        naive_storm = time.perf_counter() - started
        await client.aclose()

    print(f"1. one resume of {MISSED} events + END from {RETAINED:,}, closed before the next")
    print(f"   gateway: {statistics.median(gateway) * 1e3:6.3f} ms (median of {singles})")
    print(f"   naive:   {statistics.median(naive) * 1e3:6.3f} ms (one XRANGE, decoded)")
    print(
        "   Redis commands per gateway resume: "
        + ", ".join(f"{name} {calls:g}" for name, calls in sorted(commands.items()))
    )
    print(f"   Redis time per resume: gateway {gateway_usec:.0f} us, naive {naive_usec:.0f} us")
    print(f"2. {STORM} resumes at once")
    print(f"   gateway: {storm * 1e3:6.1f} ms wall")
    print(f"   naive:   {naive_storm * 1e3:6.1f} ms wall ({STORM} XRANGEs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50 single resumes, not 400")
    args = parser.parse_args()
    with RedisServer() as server:
        asyncio.run(measure(server.url, 50 if args.quick else 400))


if __name__ == "__main__":
    main()
