"""Redis bridge write-path figures, each against a baseline measured in the same run.

1. Publish cost with 100,000 retained events vs 10 retained (target ratio <= 1.15),
   both at steady state (full, trimming one entry per publish): the END check reads
   only the stream tail, so cost must not grow with history.
2. `publish_many` (fenced, trimmed, batches of 50) vs a raw pipelined XADD of the same
   payloads (target >= 0.5 of raw).
3. END publication with the legacy scan on vs off at 10,000 retained events.
4. Numbered publishes (`seq=N`) against plain ones, at 10 and 100,000 retained, in
   alternating rounds: numbering adds O(1) work and the cost stays flat in history.

Run: .venv/bin/python bench/bridge_publish.py [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import anyio
from _common import RedisServer
from redis.asyncio import Redis

from gateway import RedisStreamBridge, Settings

PAYLOAD = {"text": "x" * 180}


async def _publish_cost(url: str, retained: int, n: int) -> float:
    """Median seconds per single-event publish on a run holding `retained` events.

    Retention is set to `retained` and the log is filled first, so every measured
    publish also trims one entry: the steady state of a long-running producer.
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
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            await bridge.publish(run, "token", PAYLOAD, producer_token=claim.token)
        samples.append((time.perf_counter() - start) / n)
    await bridge.close()
    return statistics.median(samples)


async def _numbered_costs(url: str, n: int) -> dict[tuple[int, bool], float]:
    """Median seconds of a single-event publish, numbered (`publish_many(..., seq=N)`) or
    not, on runs holding 10 and 100,000 events (trimming one entry per publish), the four
    kinds taking turns call by call."""
    runs: dict[int, tuple[RedisStreamBridge, str, str]] = {}
    for retained in (10, 100_000):
        settings = Settings(redis_url=url, max_events_per_run=retained, redis_key_prefix="bench:")
        bridge = RedisStreamBridge.connect(settings)
        run = f"numbered-{retained}-{time.monotonic_ns()}"
        claim = await bridge.claim(run, takeover=True)
        for left in range(retained, 0, -500):
            batch = [("token", PAYLOAD)] * min(500, left)
            await bridge.publish_many(run, batch, producer_token=claim.token)
        runs[retained] = (bridge, run, claim.token)
    seqs = {10: 1, 100_000: 1}
    keys = list(itertools.product(runs, (False, True)))
    samples: dict[tuple[int, bool], list[float]] = {key: [] for key in keys}
    for _ in range(n):  # one call of each kind in turn: drift falls on all four alike
        for retained, numbered in keys:
            bridge, run, token = runs[retained]
            start = time.perf_counter()
            if numbered:
                one = [("token", PAYLOAD)]
                await bridge.publish_many(run, one, producer_token=token, seq=seqs[retained])
                seqs[retained] += 1
            else:
                await bridge.publish(run, "token", PAYLOAD, producer_token=token)
            samples[(retained, numbered)].append(time.perf_counter() - start)
    for bridge, _, _ in runs.values():
        await bridge.close()
    return {key: statistics.median(values) for key, values in samples.items()}


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
        costs = await _numbered_costs(server.url, 1_000 if quick else 4_000)
        for numbered in (False, True):
            kind = "numbered" if numbered else "plain   "
            small_c, large_c = costs[(10, numbered)], costs[(100_000, numbered)]
            print(
                f"interleaved, {kind}: 10 retained {small_c * 1e6:7.1f} us, 100,000 retained "
                f"{large_c * 1e6:7.1f} us, ratio {large_c / small_c:5.3f}  (target <= 1.15)"
            )

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
