"""Redis bridge write-path figures, each against a baseline measured in the same run.

1. Publish cost with 100,000 retained events vs 10 retained (target ratio <= 1.15),
   both at steady state (full, trimming one entry per publish): the END check reads
   only the stream tail, so cost must not grow with history.
2. `publish_many` (fenced, trimmed, batches of 50) vs a raw pipelined XADD of the same
   payloads (target >= 0.5 of raw).
3. END publication with the legacy scan on vs off at 10,000 retained events.

Run: .venv/bin/python bench/bridge_publish.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time

import anyio
from _common import RedisServer
from redis.asyncio import Redis

from gateway import RedisStreamBridge, Settings

PAYLOAD = {"text": "x" * 180}


async def _publish_cost(url: str, retained: int, n: int, numbered: bool = False) -> float:
    """Median seconds per single-event publish on a run holding `retained` events.

    Retention is set to `retained` and the log is filled first, so every measured
    publish also trims one entry: the steady state of a long-running producer.
    `numbered`: each publish is a one-event `publish_many(..., seq=N)`.
    """
    settings = Settings(redis_url=url, max_events_per_run=retained, redis_key_prefix="bench:")
    bridge = RedisStreamBridge.connect(settings)
    run = f"cost-{retained}-{time.monotonic_ns()}"
    claim = await bridge.claim(run, takeover=True)
    batch = [("token", PAYLOAD)] * 500
    left = retained
    while left > 0:
        await bridge.publish_many(run, batch[: min(500, left)], producer_token=claim.token)
        left -= min(500, left)
    samples = []
    seq = 1
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            if numbered:
                one = [("token", PAYLOAD)]
                await bridge.publish_many(run, one, producer_token=claim.token, seq=seq)
                seq += 1
            else:
                await bridge.publish(run, "token", PAYLOAD, producer_token=claim.token)
        samples.append((time.perf_counter() - start) / n)
    await bridge.close()
    return statistics.median(samples)


async def _publish_many_vs_raw(url: str, batches: int) -> tuple[float, float]:
    settings = Settings(redis_url=url, max_events_per_run=1_000, redis_key_prefix="bench:")
    bridge = RedisStreamBridge.connect(settings)
    claim = await bridge.claim("many", takeover=True)
    batch = [("token", PAYLOAD)] * 50
    start = time.perf_counter()
    for _ in range(batches):
        await bridge.publish_many("many", batch, producer_token=claim.token)
    bridge_rate = batches * 50 / (time.perf_counter() - start)
    await bridge.close()

    raw = Redis.from_url(url)
    from gateway.values import encode_json

    data = encode_json(PAYLOAD)
    start = time.perf_counter()
    for _ in range(batches):
        pipe = raw.pipeline(transaction=False)
        for _ in range(50):
            pipe.xadd("bench:raw", {"e": "token", "d": data}, maxlen=1_000, approximate=False)
        await pipe.execute()
    raw_rate = batches * 50 / (time.perf_counter() - start)
    await raw.aclose()
    return bridge_rate, raw_rate


async def _end_cost(url: str, scan: bool, retained: int) -> float:
    settings = Settings(
        redis_url=url,
        max_events_per_run=200_000,
        redis_key_prefix="bench:",
        legacy_end_scan_enabled=scan,
    )
    bridge = RedisStreamBridge.connect(settings)
    samples = []
    for i in range(5):
        run = f"end-{scan}-{i}-{time.monotonic_ns()}"
        claim = await bridge.claim(run, takeover=True)
        batch = [("token", PAYLOAD)] * 500
        for _ in range(retained // 500):
            await bridge.publish_many(run, batch, producer_token=claim.token)
        start = time.perf_counter()
        await bridge.publish_end(run, "success", producer_token=claim.token)
        samples.append(time.perf_counter() - start)
    await bridge.close()
    return statistics.median(samples)


async def main(quick: bool) -> None:
    with RedisServer() as server:
        n = 500 if quick else 2_000
        await _publish_cost(server.url, 10, n)  # warm-up: connections, script cache
        small = await _publish_cost(server.url, 10, n)
        large = await _publish_cost(server.url, 100_000, n)
        print(f"publish cost, 10 retained:      {small * 1e6:8.1f} us/event")
        print(f"publish cost, 100,000 retained: {large * 1e6:8.1f} us/event")
        print(f"ratio 100k/10:                  {large / small:8.3f}  (target <= 1.15)")
        small_n = await _publish_cost(server.url, 10, n, numbered=True)
        large_n = await _publish_cost(server.url, 100_000, n, numbered=True)
        print(f"numbered publish, 10 retained:      {small_n * 1e6:8.1f} us/event")
        print(f"numbered publish, 100,000 retained: {large_n * 1e6:8.1f} us/event")
        print(f"ratio 100k/10 (numbered):           {large_n / small_n:8.3f}  (target <= 1.15)")

        bridge_rate, raw_rate = await _publish_many_vs_raw(server.url, 200 if quick else 1_000)
        print(f"publish_many x50 (fenced, trimmed): {bridge_rate:10.0f} events/s")
        print(f"raw pipelined XADD x50 (trimmed):   {raw_rate:10.0f} events/s")
        ratio = bridge_rate / raw_rate
        print(f"ratio bridge/raw:                   {ratio:10.2f}  (target >= 0.5)")

        on = await _end_cost(server.url, True, 10_000)
        off = await _end_cost(server.url, False, 10_000)
        print(f"publish_end at 10,000 retained, legacy scan on:  {on * 1e3:7.2f} ms")
        print(f"publish_end at 10,000 retained, legacy scan off: {off * 1e3:7.2f} ms")
        print(f"ratio on/off:                                    {on / off:7.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    anyio.run(main, parser.parse_args().quick)
