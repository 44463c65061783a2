"""Idle session feeds vs idle run streams: the Redis commands they cost, Redis bridge.

One gateway process (CPU 0) on a private redis-server; N idle connections of one kind
(4 client processes on CPU 1, as `session_feed_idle.py`), held for a number of seconds;
Redis commands counted with `INFO commandstats` just after every connection is open and
again at the end of the hold. The counting connection is opened before the first count
and its own commands left out (the first `INFO`: Redis counts a command after it runs,
so the second count holds the first and not itself). Each kind runs in a fresh gateway
process and a fresh Redis:

- run stream      `GET /v1/runs/{id}/stream` of a run that publishes nothing;
- feed, between   `GET /v1/sessions/{id}/stream` of a session with no live turn (the
                  feed waits for the session's next turn);
- feed, in turn   the same feed while the session's turn is live but silent.

Whatever the gateway sends Redis per process (its pub/sub connection, a liveness sweep)
shows up too: the point is that it does not grow with N.

Run: .venv/bin/python bench/session_feed_redis.py [--connections N] [--seconds S]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

import redis
from _common import RedisServer
from session_feed_idle import _prepare
from sse_idle import LOAD_CPU
from sse_load import ClientSpec, SSELoad, free_port, gateway_proc, raise_nofile

SERVER_CPU = {0}
KINDS = ("run stream", "feed, between", "feed, in turn")


def calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


def count_idle(kind: str, n: int, seconds: float, heartbeat: float, logs: Path) -> dict[str, int]:
    """Commands Redis ran during `seconds` with `n` idle connections of `kind` open."""
    with RedisServer() as redis, redis.client() as counter:
        counter.ping()  # the counting connection's handshake, before the first count
        argv = ("--heartbeat-interval-seconds", str(heartbeat))
        log = logs / f"{kind[:4]}.log"
        with gateway_proc(free_port(), SERVER_CPU, log, redis.url, *argv) as server:
            tag = str(time.monotonic_ns())
            path = asyncio.run(_prepare(server.port, kind, tag, lease=seconds + 300))
            load = SSELoad(server.port, [ClientSpec(path)] * n, procs=4, cpus=LOAD_CPU)
            load.opts["latency"] = False
            connected = load.start()
            if connected != n:
                load.stop()
                raise RuntimeError(f"{kind}: {connected} of {n} connected")
            time.sleep(2.0)  # the last streams past their first reads
            before = calls(counter)
            time.sleep(seconds)
            after = calls(counter)
            load.stop()
    diff = {name: after[name] - before.get(name, 0) for name in after}
    diff["info"] -= 1  # the first count's own INFO
    return {name: count for name, count in sorted(diff.items()) if count}


def main(connections: int, seconds: float, heartbeat: float) -> None:
    limit = raise_nofile(65_536)
    load = os.getloadavg()
    print(
        f"RLIMIT_NOFILE soft limit: {limit}; {connections} idle connections per kind, "
        f"{seconds:g} s, heartbeat {heartbeat:g} s; load average "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    logs = Path(tempfile.mkdtemp(prefix="bench-feed-redis-"))
    for kind in KINDS:
        diff = count_idle(kind, connections, seconds, heartbeat, logs)
        total = sum(diff.values())
        detail = ", ".join(f"{name} {count}" for name, count in diff.items()) or "none"
        print(
            f"  {kind:<14} {total:>7} Redis commands in {seconds:g} s "
            f"({total / seconds:8.2f}/s, {total / connections:.4f} per connection): {detail}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--heartbeat", type=float, default=15.0, help="the gateway's default")
    args = parser.parse_args()
    main(args.connections, args.seconds, args.heartbeat)
