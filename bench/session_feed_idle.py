"""Idle session feeds vs idle run streams: RSS per connection in one gateway process.

The same method as `sse_idle.py` (RSS with N open idle connections minus RSS after a
10-connection warm-up, divided by N; memory bridge; server on CPU 0, 4 client processes
on CPU 1), for three kinds of idle connection, each in a fresh gateway process:

- run stream      `GET /v1/runs/{id}/stream` of a run that publishes nothing;
- feed, between   `GET /v1/sessions/{id}/stream` of a session with no live turn (the
                  feed waits on the session's change signal);
- feed, in turn   the same feed while the session's turn is live but silent (the feed
                  holds that run's subscription too).

Run: .venv/bin/python bench/session_feed_idle.py [--connections N]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from sse_idle import hold_path
from sse_load import (
    HttpClient,
    Proc,
    free_port,
    gateway_proc,
    raise_nofile,
)

SERVER_CPU = {0}  # the clients' CPU is sse_idle.hold_path's


async def _prepare(port: int, kind: str, tag: str, lease: float | None = None) -> str:
    """Create what the connections follow; the path they open. `lease`: seconds the
    silent run's lease lasts (the default's 30 s would end it within a long hold)."""
    client = HttpClient("127.0.0.1", port)
    longer = {} if lease is None else {"lease_seconds": lease}
    try:
        if kind == "run stream":
            status, body = await client.post_json("/v1/runs", {"run_id": f"idle-{tag}", **longer})
            assert status == 201, body
            return f"/v1/runs/idle-{tag}/stream"
        session = f"feed-{tag}"
        # a finished turn, so the session exists, then (in turn) a live silent one
        status, body = await client.post_json("/v1/runs", {"session_id": session})
        assert status == 201, body
        token = str(body["producer_token"])
        status, body = await client.post_json(
            f"/v1/runs/{body['run_id']}/end", {"status": "success"}, {"X-Producer-Token": token}
        )
        assert status == 200, body
        if kind == "feed, in turn":
            status, body = await client.post_json("/v1/runs", {"session_id": session, **longer})
            assert status == 201, body
        return f"/v1/sessions/{session}/stream"
    finally:
        client.close()


def hold(server: Proc, n: int, kind: str) -> tuple[int, float, int]:
    """(connected, seconds to connect, RSS bytes per connection)."""
    path = asyncio.run(_prepare(server.port, kind, str(time.monotonic_ns())))
    return hold_path(server, n, path)


def main(connections: int) -> None:
    limit = raise_nofile(65_536)
    print(f"RLIMIT_NOFILE soft limit: {limit}")
    logs = Path(tempfile.mkdtemp(prefix="bench-feed-idle-"))
    for kind in ("run stream", "feed, between", "feed, in turn"):
        with gateway_proc(free_port(), SERVER_CPU, logs / f"{kind[:4]}.log") as server:
            connected, seconds, per = hold(server, connections, kind)
            print(
                f"  {kind:<14} {connected:>6}/{connections} idle connections held"
                f" (connected in {seconds:5.1f} s)  RSS {per / 1024:6.1f} KB per connection"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=10_000)
    main(parser.parse_args().connections)
