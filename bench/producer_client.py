"""Producer throughput through the Python client (`gateway.client.producer.Producer`), token-sized
events, against raw `publish_many` over HTTP and against one request per event.

One gateway process (pinned to CPU 0; memory bridge, then Redis bridge with
redis-server on CPU 1), one producer in this process (CPU 1), one run at a time:

- client: `await run.send("token", {"text": "word "})` in a loop (batched by the client:
  20 ms window, at most 500 events / 64 KiB a batch, each batch numbered;
  `streaming=False`), then `flush`;
- client, streamed: the same loop with the client's default, streamed appends (one
  ndjson request per 0.5 s or 500 lines, numbered);
- raw `publish_many`: httpx posting pre-built batches of 500 of the same events back to
  back (`{"events": [...]}`, unnumbered): what the client's batching can reach at best;
- one request per event: httpx posting each event alone (what a producer that does not
  batch gets).

Client and raw runs take turns, 9 rounds of 20,000 events each (3 with --quick).

Run: .venv/bin/python bench/producer_client.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import orjson
from _common import RedisServer
from sse_load import free_port, gateway_proc, pin

from gateway.client.producer import Producer

SERVER_CPU = {0}
LOAD_CPU = {1}
BATCH = 500
TOKEN = {"text": "word "}


async def _claim(client: httpx.AsyncClient, run_id: str) -> dict[str, str]:
    reply = await client.post("/v1/runs", json={"run_id": run_id})
    assert reply.status_code == 201, reply.text
    return {"X-Producer-Token": reply.json()["producer_token"]}


async def client_rate(url: str, n: int, streaming: bool = False) -> tuple[float, int]:
    run_id = f"client-{time.monotonic_ns()}"
    async with Producer(url, run_id=run_id, streaming=streaming) as run:
        start = time.perf_counter()
        for _ in range(n):
            await run.send("token", TOKEN)
        await run.flush()
        seconds = time.perf_counter() - start
        batches = run.batches_sent
    return n / seconds, batches


async def raw_batched_rate(url: str, n: int) -> float:
    item = b'{"event":"token","data":' + orjson.dumps(TOKEN) + b"}"
    body = b'{"events":[' + b",".join([item] * BATCH) + b"]}"
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        run_id = f"raw-{time.monotonic_ns()}"
        headers = await _claim(client, run_id)
        headers["Content-Type"] = "application/json"
        start = time.perf_counter()
        for _ in range(n // BATCH):
            reply = await client.post(f"/v1/runs/{run_id}/events", content=body, headers=headers)
            assert reply.status_code == 200, reply.text
        return (n // BATCH) * BATCH / (time.perf_counter() - start)


async def one_per_request_rate(url: str, n: int) -> float:
    body = orjson.dumps({"event": "token", "data": TOKEN})
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        run_id = f"single-{time.monotonic_ns()}"
        headers = await _claim(client, run_id)
        headers["Content-Type"] = "application/json"
        start = time.perf_counter()
        for _ in range(n):
            reply = await client.post(f"/v1/runs/{run_id}/events", content=body, headers=headers)
            assert reply.status_code == 200, reply.text
        return n / (time.perf_counter() - start)


def measure(label: str, url: str, n: int, singles: int, rounds: int) -> None:
    """Client and raw runs take turns (`rounds` each): a shared host's drift falls on
    both alike; medians are reported, and the median of the per-round ratios."""
    asyncio.run(client_rate(url, 2_000))  # warm-up (connections, scripts)
    clients: list[float] = []
    raws: list[float] = []
    streams: list[float] = []
    batches = appends = 0
    for _ in range(rounds):
        rate, batches = asyncio.run(client_rate(url, n))
        clients.append(rate)
        rate, appends = asyncio.run(client_rate(url, n, streaming=True))
        streams.append(rate)
        raws.append(asyncio.run(raw_batched_rate(url, n)))
    single = asyncio.run(one_per_request_rate(url, singles))
    client, raw = statistics.median(clients), statistics.median(raws)
    ratio = statistics.median(c / r for c, r in zip(clients, raws, strict=True))
    print(f"{label}: {n:,} token events a run ({len(orjson.dumps(TOKEN))} bytes of data each)")
    print(f"  client (batched, numbered):  {client:>10,.0f} events/s  ({batches} batches a run)")
    streamed = statistics.median(streams)
    print(f"  client (streamed, numbered): {streamed:>10,.0f} events/s  ({appends} appends a run)")
    print(f"  raw publish_many x{BATCH} HTTP: {raw:>10,.0f} events/s")
    print(f"  one request per event:       {single:>10,.0f} events/s  ({singles:,} events)")
    print(
        f"  client/raw (median of {rounds} rounds): {ratio:.2f}   client/one-per-request: "
        f"{client / single:.0f}"
    )


def main(quick: bool) -> None:
    n = 20_000
    rounds = 3 if quick else 9
    singles = 1_000 if quick else 3_000
    pin(0, LOAD_CPU)
    logs = Path(tempfile.mkdtemp(prefix="bench-producer-client-"))
    with gateway_proc(free_port(), SERVER_CPU, logs / "gateway-memory.log", None) as gw:
        measure("memory bridge", f"http://127.0.0.1:{gw.port}", n, singles, rounds)
    with RedisServer() as srv:
        assert srv.proc is not None
        pin(srv.proc.pid, LOAD_CPU)
        with gateway_proc(free_port(), SERVER_CPU, logs / "gateway-redis.log", srv.url) as gw:
            measure("Redis bridge", f"http://127.0.0.1:{gw.port}", n, singles, rounds)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer events")
    main(parser.parse_args().quick)
