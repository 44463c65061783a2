"""Reconnect storm through one gateway process: 1,000 SSE clients reconnect at once with
`Last-Event-ID`, each 200 events behind the tail of an ended run (target: all exact,
all done in <= 3 s). Memory bridge and Redis bridge; the naive Redis design
(XREAD from the cursor, one connection per client) as the reference, same run.

"Exact": every client receives exactly the 200 ids after its cursor, in order, then
`end`. Time: from the first client connecting to the last client's END. Server on CPU
0; the 4 load processes and redis-server on CPU 1.

Run: .venv/bin/python bench/sse_reconnect.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from _common import RedisServer
from sse_load import (
    ClientSpec,
    HttpClient,
    Proc,
    SSELoad,
    baseline_proc,
    free_port,
    gateway_proc,
    http_claim,
    pin,
    raise_nofile,
)

SERVER_CPU = {0}
LOAD_CPU = {1}
CLIENTS = 1_000
MISSED = 200
LOG = 1_000  # events in the run before the storm


def ended_run(port: int) -> tuple[str, list[str]]:
    """A run of LOG events, ended, published over HTTP; returns (run_id, ids)."""
    run_id = f"storm-{time.monotonic_ns()}"

    async def go() -> list[str]:
        client = HttpClient("127.0.0.1", port)
        token = await http_claim(client, run_id)
        headers = {"X-Producer-Token": token}
        ids: list[str] = []
        event = {"event": "token", "data": {"t": 0.0, "p": "x" * 160}}
        for _ in range(LOG // 50):
            status, body = await client.post_json(
                f"/v1/runs/{run_id}/events", {"events": [event] * 50}, headers
            )
            assert status == 200, body
            ids += body["ids"]
        status, body = await client.post_json(
            f"/v1/runs/{run_id}/end", {"status": "success"}, headers
        )
        assert status == 200, body
        client.close()
        return ids

    return run_id, asyncio.run(go())


def storm(server: Proc, run_id: str, ids: list[str]) -> tuple[float, int, int]:
    """(seconds, exact clients, clients)."""
    cursor = ids[-MISSED - 1]
    expected = ids[-MISSED:]
    specs = [ClientSpec(f"/v1/runs/{run_id}/stream", cursor)] * CLIENTS
    load = SSELoad(
        server.port,
        specs,
        procs=4,
        cpus=LOAD_CPU,
        record_ids=True,
        latency=False,
        connect_concurrency=CLIENTS,
    )
    load.start()
    result = load.wait(120)
    exact = sum(1 for got in result.ids if got == expected)
    exact = min(exact, result.finished - result.gaps)
    return result.last_done - result.began, exact, CLIENTS


def main() -> None:
    raise_nofile()
    logs = Path(tempfile.mkdtemp(prefix="bench-sse-reconnect-"))
    with RedisServer("--maxclients", "20000") as srv:
        assert srv.proc is not None
        pin(srv.proc.pid, LOAD_CPU)
        gw_redis = gateway_proc(free_port(), SERVER_CPU, logs / "gw-redis.log", srv.url)
        rows = []
        try:
            for name, server in (
                ("gateway, memory", gateway_proc(free_port(), SERVER_CPU, logs / "gw-mem.log")),
                ("gateway, Redis", gw_redis),
            ):
                with server:
                    run_id, ids = ended_run(server.port)
                    storm(server, run_id, ids[:])  # warm-up (connections, caches)
                    rows.append((name, *storm(server, run_id, ids)))
                    if server is gw_redis:
                        redis_run = (run_id, ids)
            with baseline_proc(
                "redis", free_port(), SERVER_CPU, logs / "naive.log", srv.url
            ) as naive:
                rows.append(("naive Redis", *storm(naive, *redis_run)))
        finally:
            gw_redis.stop()
    print(f"reconnect storm: {CLIENTS:,} clients x {MISSED} missed events (Last-Event-ID)")
    for name, seconds, exact, clients in rows:
        print(
            f"  {name:<16} all done in {seconds:6.2f} s   exact {exact:>5}/{clients}"
            + ("   (target <= 3 s, all exact)" if name.startswith("gateway") else "")
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="same figure (for make bench)")
    parser.parse_args()
    main()
