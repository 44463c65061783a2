"""Redis connections held by one gateway process (Redis bridge) as its load changes: a
burst of concurrent run lookups, then the steady load of one follower (SSE) and one
producer at 100 tokens/s: one POST per token, or with `--producer client` the Python
producer client (`gateway.client.Producer`, whose default is streamed appends). Counted
with CLIENT LIST on the private redis-server this script starts (the entries whose
client port is a socket of the gateway process, matched through /proc), once after the
burst and once a second during the steady load. The pool closes connections unused for
`redis_idle_connection_seconds` (default 10), so the steady figure is reached about that
long after the burst.

Run: .venv/bin/python bench/redis_connections.py [--quick] [--burst 200] [--seconds 15]
     [--producer post|client]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import httpx
import redis
from _common import RedisServer
from sse_load import free_port, gateway_proc, redis_connections_of

from gateway.client.producer import Producer


async def load(port: int, count: object, burst: int, seconds: float, producer: str) -> None:
    limits = httpx.Limits(max_connections=burst + 10)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits) as http:
        claimed = await http.post("/v1/runs", json={"run_id": "conn-1", "lease_seconds": 600})
        token = claimed.json()["producer_token"]
        print(f"  idle (started):      {count()}")  # type: ignore[operator]
        await asyncio.gather(*(http.get("/v1/runs/conn-1") for _ in range(burst)))
        print(f"  after {burst} lookups at once: {count()}")  # type: ignore[operator]

        async def follow(run_id: str = "conn-1") -> int:
            events = 0
            async with http.stream("GET", f"/v1/runs/{run_id}/stream") as response:
                async for line in response.aiter_lines():
                    if line.startswith("event: end"):
                        return events
                    events += line.startswith("event: token")
            return events

        follower = asyncio.ensure_future(follow())
        headers = {"X-Producer-Token": token}
        started, sent, samples = time.monotonic(), 0, []
        if producer == "client":  # the run is the client's own: it claims, streams, ENDs
            await http.post("/v1/runs/conn-1/end", json={"status": "success"}, headers=headers)
            await follower
            async with Producer(str(http.base_url), run_id="conn-2") as run:
                follower = asyncio.ensure_future(follow("conn-2"))  # (after the claim)
                started = time.monotonic()
                while time.monotonic() - started < seconds:
                    await run.send("token", sent)
                    sent += 1
                    if sent % 100 == 0:
                        samples.append(count())  # type: ignore[operator]
                    await asyncio.sleep(max(0.0, started + sent / 100 - time.monotonic()))
        else:
            while time.monotonic() - started < seconds:
                await http.post(
                    "/v1/runs/conn-1/events", json={"event": "token", "data": sent}, headers=headers
                )
                sent += 1
                if sent % 100 == 0:
                    samples.append(count())  # type: ignore[operator]
                await asyncio.sleep(max(0.0, started + sent / 100 - time.monotonic()))
            await http.post("/v1/runs/conn-1/end", json={"status": "success"}, headers=headers)
        received = await follower
        print(f"  1 follower + 1 producer, each second: {samples}")
        print(f"  events sent {sent}, received {received}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="12 s of steady load")
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--producer", choices=("post", "client"), default="post")
    args = parser.parse_args()
    seconds = 12.0 if args.quick else args.seconds
    logs = Path(tempfile.mkdtemp(prefix="bench-redis-connections-"))
    with RedisServer() as server:
        ctl = redis.Redis.from_url(server.url, client_name="bench-control")
        proc = gateway_proc(free_port(), None, logs / "gateway.log", server.url)
        try:
            print("Redis connections held by one gateway process (CLIENT LIST)")
            asyncio.run(
                load(
                    proc.port,
                    lambda: redis_connections_of(proc.popen.pid, ctl),
                    args.burst,
                    seconds,
                    args.producer,
                )
            )
        finally:
            proc.stop()
            ctl.close()


if __name__ == "__main__":
    main()
