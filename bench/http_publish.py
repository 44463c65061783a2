"""Producer publish throughput over HTTP into one gateway process (Redis bridge):
`POST /v1/runs/{id}/events` with batches of 50 (`{"events": [...]}`) vs raw pipelined
XADD of the same payloads straight into Redis (reported: events/s of each and their ratio).

Producers: one load process on CPU 1 with 8 keep-alive connections, one run each,
posting back to back (a batch in flight per connection). The gateway is pinned to CPU 0,
redis-server to CPU 1. The raw XADD baseline runs from this process (8 concurrent
pipelines of 50, `MAXLEN =` trimming like the bridge).

Run: .venv/bin/python bench/http_publish.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import tempfile
import time
from pathlib import Path

from _common import RedisServer
from redis.asyncio import Redis
from sse_load import HttpClient, free_port, gateway_proc, http_claim, pin

SERVER_CPU = {0}
LOAD_CPU = {1}
PRODUCERS = 8
BATCH = 50
DATA = b'{"t":0.0,"p":"' + b"x" * 160 + b'"}'


def _producer(port: int, batches: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    pin(0, LOAD_CPU)

    async def one(i: int) -> None:
        client = HttpClient("127.0.0.1", port)
        run_id = f"pub-{time.monotonic_ns()}-{i}"
        token = await http_claim(client, run_id)
        body = b'{"events":[' + b",".join([b'{"event":"token","data":' + DATA + b"}"] * BATCH)
        body += b"]}"
        headers = {"X-Producer-Token": token}
        for _ in range(batches):
            status, reply = await client.request("POST", f"/v1/runs/{run_id}/events", body, headers)
            assert status == 200, reply[:200]
        client.close()

    async def go() -> float:
        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(PRODUCERS)))
        return time.perf_counter() - start

    import uvloop

    out.put(uvloop.run(go()))


def http_rate(port: int, batches: int) -> float:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_producer, args=(port, batches, out))
    proc.start()
    seconds = out.get(timeout=600)
    proc.join()
    return PRODUCERS * batches * BATCH / seconds


async def raw_rate(url: str, batches: int) -> float:
    client = Redis.from_url(url)

    async def one(i: int) -> None:
        key = f"raw:{{{i}}}:log"
        for _ in range(batches):
            pipe = client.pipeline(transaction=False)
            for _ in range(BATCH):
                pipe.xadd(key, {"e": "token", "d": DATA}, maxlen=10_000, approximate=False)
            await pipe.execute()

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(PRODUCERS)))
    seconds = time.perf_counter() - start
    await client.aclose()
    return PRODUCERS * batches * BATCH / seconds


def main(quick: bool) -> None:
    batches = 100 if quick else 400
    logs = Path(tempfile.mkdtemp(prefix="bench-http-publish-"))
    with RedisServer() as srv:
        assert srv.proc is not None
        pin(srv.proc.pid, LOAD_CPU)
        with gateway_proc(free_port(), SERVER_CPU, logs / "gateway.log", srv.url) as gw:
            http_rate(gw.port, 10)  # warm-up
            cpu0 = gw.cpu()
            rate = http_rate(gw.port, batches)
            cpu = gw.cpu() - cpu0
        pin(0, LOAD_CPU)
        asyncio.run(raw_rate(srv.url, 10))
        raw = asyncio.run(raw_rate(srv.url, batches))
    events = PRODUCERS * batches * BATCH
    print(f"publish_many x{BATCH} over HTTP, {PRODUCERS} producers, {events:,} events")
    per = cpu / events * 1e6
    print(f"  gateway (Redis bridge):      {rate:>10,.0f} events/s  (CPU {per:.1f} us/event)")
    print(f"  raw pipelined XADD x{BATCH}:     {raw:>10,.0f} events/s")
    print(f"  ratio HTTP/raw:              {rate / raw:10.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer batches")
    main(parser.parse_args().quick)
