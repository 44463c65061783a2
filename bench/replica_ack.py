"""What `min_replicas_acked` costs a write: publish latency with 0 (the primary's reply)
and 1 (the reply once one replica holds the write: the script, a PUBLISH mark and WAIT
in one round trip) against the same local primary and its replica, in the same run.

The two bridges take turns call by call, so drift (other load on the machine) falls on
both alike. Reported per publish: p50, p99 and the mean, for a single-event publish and
for a batch of 50 (`publish_many`).

Run: .venv/bin/python bench/replica_ack.py [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import subprocess
import time

import anyio
from _common import ROOT, RedisServer

from gateway import RedisStreamBridge, Settings
from tests.support.replication import start_replica

PAYLOAD = {"text": "x" * 180}
MODES = (0, 1)  # min_replicas_acked


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _measure(url: str, n: int, batch: int) -> dict[int, list[float]]:
    bridges: dict[int, tuple[RedisStreamBridge, str, str]] = {}
    for acked in MODES:
        settings = Settings(
            redis_url=url,
            redis_key_prefix="bench:",
            min_replicas_acked=acked,
            replica_ack_timeout_seconds=2.0,
        )
        bridge = RedisStreamBridge.connect(settings)
        run = f"acked-{acked}-{batch}-{time.monotonic_ns()}"
        claim = await bridge.claim(run, takeover=True)
        bridges[acked] = (bridge, run, claim.token)
    events = [("token", PAYLOAD)] * batch
    samples: dict[int, list[float]] = {acked: [] for acked in MODES}
    for i in range(n + n // 10):  # the first tenth warms up (connections, script cache)
        for acked, (bridge, run, token) in bridges.items():
            start = time.perf_counter()
            if batch == 1:
                await bridge.publish(run, "token", PAYLOAD, producer_token=token)
            else:
                await bridge.publish_many(run, events, producer_token=token)
            if i >= n // 10:
                samples[acked].append(time.perf_counter() - start)
    for bridge, _, _ in bridges.values():
        await bridge.close()
    return samples


def _commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    return done.stdout.strip() or "?"


async def main(quick: bool) -> None:
    n = 1_000 if quick else 5_000
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"commit {_commit()}, {now}; Redis, one replica on loopback; {n} calls per row")
    with RedisServer() as primary:
        replica = start_replica(primary)
        try:
            for batch in (1, 50):
                samples = await _measure(primary.url, n if batch == 1 else n // 5, batch)
                for acked, values in samples.items():
                    print(
                        f"publish x{batch:<2} min_replicas_acked={acked}: "
                        f"p50 {_quantile(values, 0.5) * 1e6:7.1f} us  "
                        f"p99 {_quantile(values, 0.99) * 1e6:7.1f} us  "
                        f"mean {statistics.fmean(values) * 1e6:7.1f} us"
                    )
        finally:
            replica.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls")
    anyio.run(main, parser.parse_args().quick)
