"""SSE delivery through one gateway process on the Redis bridge vs the naive Redis design
(one blocking XREAD connection per subscriber, one frame write per event), same run.

1. Redis connections held by the server process with 1, 100 and 2,000 subscribers
   (spread over up to 100 runs), counted with CLIENT LIST on the private redis-server
   this script starts: the entries whose client port is a socket of the server process
   (matched through /proc). Counted once subscribers are attached and again while
   events flow; the larger count is printed.
2. 1,000 subscribers over 100 runs (10 each): delivered events/s, server CPU and
   redis-server CPU per delivered event (target: >= 3x the naive design's events/s).

The producer writes straight into Redis with the gateway's own `RedisStreamBridge`
(fenced Lua appends, batches of 50), so both servers read the same log layout. The
server under test is pinned to CPU 0; redis-server, the 2 load processes and the
producer share CPU 1.

Run: .venv/bin/python bench/sse_redis.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from _common import RedisServer
from sse_load import (
    ClientSpec,
    Fanout,
    Proc,
    SSELoad,
    baseline_proc,
    free_port,
    gateway_proc,
    http_fanout,
    pin,
    raise_nofile,
    redis_connections_of,
    redis_cpu,
    started,
)

from gateway import RedisStreamBridge, Settings
from gateway.values import RawJSON

SERVER_CPU = {0}
LOAD_CPU = {1}
PAD = b"x" * 160


def _producer_bridge(url: str) -> RedisStreamBridge:
    settings = Settings(redis_url=f"{url}?client_name=bench-producer", redis_max_connections=128)
    return RedisStreamBridge.connect(settings)


def redis_producer(url: str, events: int, *, end: bool = True, batch: int = 50) -> Any:
    """(prepare, produce) hooks of `http_fanout`: claim, then publish_many + END per run."""

    def prepare(run_ids: list[str]) -> dict[str, str]:
        async def go() -> dict[str, str]:
            bridge = _producer_bridge(url)
            tokens = {r: (await bridge.claim(r, lease_seconds=600)).token for r in run_ids}
            await bridge.close()
            return tokens

        return asyncio.run(go())

    def produce(tokens: dict[str, str]) -> tuple[float, float]:
        async def go() -> tuple[float, float]:
            bridge = _producer_bridge(url)

            async def one(run_id: str, token: str) -> None:
                sent = 0
                while sent < events:
                    n = min(batch, events - sent)
                    data = RawJSON(b'{"t":%.6f,"p":"%s"}' % (time.time(), PAD))
                    await bridge.publish_many(run_id, [("token", data)] * n, producer_token=token)
                    sent += n
                if end:
                    await bridge.publish_end(run_id, "success", producer_token=token)

            start = time.time()
            await asyncio.gather(*(one(r, t) for r, t in tokens.items()))
            await bridge.close()
            return start, time.time()

        return asyncio.run(go())

    return prepare, produce


def count_connections(server: Proc, url: str, ctl: redis.Redis, subscribers: int) -> int:
    runs = min(subscribers, 100)
    run_ids = [f"conn-{time.monotonic_ns()}-{i}" for i in range(runs)]
    prepare, produce = redis_producer(url, 20, end=False)
    _, finish = redis_producer(url, 0, end=True)
    tokens = prepare(run_ids)
    specs = [ClientSpec(f"/v1/runs/{run_ids[i % runs]}/stream") for i in range(subscribers)]
    load = SSELoad(server.port, specs, procs=2, cpus=LOAD_CPU, latency=False)
    if load.start() != subscribers:
        raise RuntimeError("not every subscriber connected")
    idle = 0
    for _ in range(3):  # the naive design connects lazily, at its first XREAD
        time.sleep(0.5)
        idle = max(idle, redis_connections_of(server.popen.pid, ctl))
    produce(tokens)
    time.sleep(0.5)
    busy = redis_connections_of(server.popen.pid, ctl)
    finish(tokens)
    load.wait(120)
    return max(idle, busy)


def _line(name: str, f: Fanout) -> str:
    lost = "" if f.delivered == f.expected else f"  (got {f.delivered}/{f.expected}!)"
    redis_us = f.extra_cpu / max(1, f.delivered) * 1e6
    return (
        f"  {name:<13} {f.rate:>10,.0f} ev/s  p50 {f.p50_ms:8.2f} ms  p99 {f.p99_ms:8.2f} ms"
        f"  server {f.cpu_us_per_event:5.1f} us + redis {redis_us:5.1f} us CPU/ev"
        f"  clients {f.client_cpu:5.1f} s CPU{lost}"
    )


def main(quick: bool) -> None:
    raise_nofile()
    logs = Path(tempfile.mkdtemp(prefix="bench-sse-redis-"))
    with RedisServer("--maxclients", "20000") as srv:
        assert srv.proc is not None
        pin(srv.proc.pid, LOAD_CPU)
        ctl = redis.Redis.from_url(srv.url, client_name="bench-control")
        with started(
            {
                "gateway": lambda: gateway_proc(
                    free_port(), SERVER_CPU, logs / "gateway.log", srv.url
                ),
                "naive": lambda: baseline_proc(
                    "redis", free_port(), SERVER_CPU, logs / "naive.log", srv.url
                ),
            }
        ) as servers:
            prepare, produce = redis_producer(srv.url, 100)
            for server in servers.values():  # warm-up
                http_fanout(server, 2, 5, 100, prepare=prepare, produce=produce, cpus=LOAD_CPU)

            print("1. Redis connections held by one server process (CLIENT LIST)")
            for n in (1, 100, 2_000):
                counts = {
                    name: count_connections(s, srv.url, ctl, n) for name, s in servers.items()
                }
                gw, naive = counts["gateway"], counts["naive"]
                print(f"  {n:>5} subscribers: gateway {gw:>5}   naive {naive:>5}")

            events = 100 if quick else 300
            print(f"2. 1,000 subscribers over 100 runs, {events} events per run")
            prepare, produce = redis_producer(srv.url, events)
            results = {}
            for name, server in servers.items():
                results[name] = http_fanout(
                    server,
                    100,
                    10,
                    events,
                    prepare=prepare,
                    produce=produce,
                    cpus=LOAD_CPU,
                    extra_cpu=lambda: redis_cpu(ctl),
                )
                print(_line(name, results[name]))
            ratio = results["gateway"].rate / results["naive"].rate
            print(f"  ratio gateway/naive: {ratio:.2f}  (target >= 3)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    main(parser.parse_args().quick)
