"""Idle SSE connections held by one server process and the RSS each costs, gateway
(memory bridge) vs a plain sse-starlette endpoint, same run (target: 10,000
at <= 20 KB RSS per connection).

RSS per connection = (RSS with N open idle streams - RSS after a 10-connection warm-up)
/ N, read from /proc/<pid>/status. The clients (4 load processes) connect with at most
200 connections in flight per process, all to one run that publishes nothing; RLIMIT_NOFILE
is raised for the servers and the clients. Server pinned to CPU 0, clients to CPU 1.

Run: .venv/bin/python bench/sse_idle.py [--quick] [--connections N]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from sse_load import (
    ClientSpec,
    HttpClient,
    Proc,
    SSELoad,
    baseline_proc,
    free_port,
    gateway_proc,
    http_claim,
    raise_nofile,
)

SERVER_CPU = {0}
LOAD_CPU = {1}


def hold(server: Proc, n: int) -> tuple[int, float, int]:
    """(connected, seconds to connect, RSS bytes per connection)."""
    run_id = f"idle-{time.monotonic_ns()}"

    async def claim() -> None:
        client = HttpClient("127.0.0.1", server.port)
        await http_claim(client, run_id)
        client.close()

    asyncio.run(claim())
    return hold_path(server, n, f"/v1/runs/{run_id}/stream")


def hold_path(server: Proc, n: int, path: str) -> tuple[int, float, int]:
    """N idle streams of `path` after a 10-connection warm-up: (connected, seconds to
    connect, RSS bytes per connection)."""
    warm = SSELoad(server.port, [ClientSpec(path)] * 10, procs=1)
    warm.start()
    warm.stop()
    time.sleep(0.5)
    before = server.rss()
    load = SSELoad(server.port, [ClientSpec(path)] * n, procs=4, cpus=LOAD_CPU, latency=False)
    started = time.perf_counter()
    connected = load.start()
    seconds = time.perf_counter() - started
    time.sleep(1.0)
    after = server.rss()
    load.stop()
    return connected, seconds, (after - before) // max(1, connected)


def main(connections: int) -> None:
    limit = raise_nofile(65_536)
    print(f"RLIMIT_NOFILE soft limit: {limit}")
    logs = Path(tempfile.mkdtemp(prefix="bench-sse-idle-"))
    for name, start in (
        ("gateway", lambda: gateway_proc(free_port(), SERVER_CPU, logs / "gateway.log")),
        (
            "sse-starlette",
            lambda: baseline_proc("memory", free_port(), SERVER_CPU, logs / "baseline.log"),
        ),
    ):
        with start() as server:
            connected, seconds, per = hold(server, connections)
            print(
                f"  {name:<13} {connected:>6}/{connections} idle streams held"
                f" (connected in {seconds:5.1f} s)  RSS {per / 1024:6.1f} KB per connection"
                + ("  (target <= 20 KB)" if name == "gateway" else "")
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="same figure (kept for make bench)")
    parser.add_argument("--connections", type=int, default=10_000)
    main(parser.parse_args().connections)
