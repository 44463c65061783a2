"""SSE delivery through one gateway process on the memory bridge vs a plain sse-starlette
endpoint (one asyncio.Queue per subscriber, one event per frame), in the same run.

1. 100 subscribers of one run: delivered events/s with a producer posting batches of 50
   over HTTP as fast as the server takes them.
2. p50/p99 publish->receive latency at half of that delivered rate.
3. 1,000 subscribers over 100 runs (10 each): delivered events/s (target: >= 3x the baseline).
4. p50/p99 latency at 10,000 events/s delivered (target: p50 <= 2 ms, p99 <= 15 ms), in
   two shapes: 100 subscribers x 100 events/s (every event fans out to 100 sockets at
   once, so the median subscriber waits for ~50 socket writes) and 10 x 1,000 events/s.

The server under test is pinned to CPU 0; load generators (2 processes) and the producer
share CPU 1. Each figure prints the server's CPU per delivered event and the client CPU.

Run: .venv/bin/python bench/sse_memory.py [--quick]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from sse_load import (
    Fanout,
    baseline_proc,
    free_port,
    gateway_proc,
    http_fanout,
    raise_nofile,
    started,
)

SERVER_CPU = {0}
LOAD_CPU = {1}


def _line(name: str, f: Fanout) -> str:
    lost = "" if f.delivered == f.expected else f"  (got {f.delivered}/{f.expected}!)"
    return (
        f"  {name:<13} {f.rate:>10,.0f} ev/s  p50 {f.p50_ms:7.2f} ms  p99 {f.p99_ms:7.2f} ms"
        f"  server {f.cpu_us_per_event:6.1f} us CPU/ev  clients {f.client_cpu:5.1f} s CPU"
        f"{lost}"
    )


def main(quick: bool) -> None:
    raise_nofile()
    scale = 1 if quick else 3
    logs = Path(tempfile.mkdtemp(prefix="bench-sse-memory-"))
    with started(
        {
            "gateway": lambda: gateway_proc(free_port(), SERVER_CPU, logs / "gateway.log"),
            "sse-starlette": lambda: baseline_proc(
                "memory", free_port(), SERVER_CPU, logs / "baseline.log"
            ),
        }
    ) as servers:
        for server in servers.values():  # warm-up: imports, first connections
            http_fanout(server, 1, 10, 200, cpus=LOAD_CPU)

        print(f"1. 100 subscribers, 1 run, {2000 * scale} events, batches of 50 over HTTP")
        peak: dict[str, Fanout] = {}
        for name, server in servers.items():
            peak[name] = http_fanout(server, 1, 100, 2000 * scale, cpus=LOAD_CPU)
            print(_line(name, peak[name]))
        print(f"  ratio gateway/baseline: {peak['gateway'].rate / peak['sse-starlette'].rate:.2f}")

        print("2. latency at half of each server's own peak delivered rate (100 subscribers)")
        for name, server in servers.items():
            rate = peak[name].rate / 2 / 100  # events/s published to the one run
            seconds = 3 * scale
            f = http_fanout(server, 1, 100, max(50, int(rate * seconds)), rate=rate, cpus=LOAD_CPU)
            print(_line(name, f) + f"  (published {rate:,.0f} ev/s)")

        print(f"3. 1,000 subscribers over 100 runs, {100 * scale} events per run")
        many: dict[str, Fanout] = {}
        for name, server in servers.items():
            many[name] = http_fanout(server, 100, 10, 100 * scale, cpus=LOAD_CPU)
            print(_line(name, many[name]))
        ratio = many["gateway"].rate / many["sse-starlette"].rate
        print(f"  ratio gateway/baseline: {ratio:.2f}  (target >= 3)")

        print("4. latency at 10,000 events/s delivered (target p50 <= 2 ms, p99 <= 15 ms)")
        for subscribers, rate in ((100, 100), (10, 1_000)):
            print(f"  {subscribers} subscribers x {rate:,} events/s")
            for name, server in servers.items():
                events = 3 * rate * scale
                f = http_fanout(server, 1, subscribers, events, rate=rate, cpus=LOAD_CPU)
                print(_line(name, f))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    main(parser.parse_args().quick)
