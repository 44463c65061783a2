"""`gateway serve --workers 1` vs `--workers 2` on the Redis bridge, in the same run.

1,000 SSE subscribers over 100 runs (10 each) follow while one producer publishes to
all 100 runs at a fixed total rate (`--rate` events/s, on an absolute schedule of
100 ms ticks, each tick one `publish_many` per run carrying the events due), for
`--seconds`, then ENDs every run. Delivered events/s = data events received by all
subscribers / (last subscriber's END - first publish). Printed for each: delivered
events/s, p50/p99 publish->receive latency, gateway CPU (the parent and every worker,
from /proc) per delivered event, redis-server CPU, load-generator CPU, and how the
kernel spread the 1,000 connections over the workers. Target: 2 workers deliver
>= 1.6x what 1 worker does.

CPU placement: with 4 or more CPUs the gateway (parent and workers) is pinned to CPUs
0-1 in both runs, so one worker leaves a core the second one can use, and everything
else to the other CPUs. With fewer, nothing is pinned: the workers, the two
load-generator processes (bench/sse_load.py), the producer (this process, writing
straight into Redis with the gateway's own `RedisStreamBridge`, like
bench/sse_redis.py) and redis-server share the cores. The same events are published
in both runs, so a saturated server simply takes longer. The "machine busy" figure is
the CPU all of these used / (CPUs x delivery time): near 100 %, the machine and not
the gateway is the limit, and a second worker cannot deliver more; each worker's
"busy" figure is its CPU time / delivery time (near 100 %: that worker is the limit).

Run: .venv/bin/python bench/workers.py [--quick] [--rate N] [--seconds S]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from _common import RedisServer
from sse_load import (
    CLK_TCK,
    VENV_BIN,
    Fanout,
    Proc,
    free_port,
    http_fanout,
    pin,
    raise_nofile,
    redis_cpu,
    socket_inodes,
)
from sse_redis import _producer_bridge, redis_producer

from gateway.values import RawJSON

RUNS, SUBS_PER_RUN = 100, 10
PAD = b"x" * 160
TICK = 0.1  # one publish_many per run per tick: a larger tick costs the producer less


def _children(pid: int) -> list[int]:
    with contextlib.suppress(FileNotFoundError):
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return []


def _cpu_of(pid: int) -> float:
    with contextlib.suppress(FileNotFoundError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    return 0.0


class Gateway(Proc):
    """`gateway serve --workers N`; `cpu()` sums the parent and all its children."""

    def __init__(
        self, workers: int, port: int, redis_url: str, log: Path, cpus: set[int] | None
    ) -> None:
        self.workers = workers
        argv = [str(VENV_BIN / "gateway"), "serve", "--port", str(port)]
        argv += ["--redis-url", redis_url, "--workers", str(workers)]
        super().__init__(argv, port, cpus, log)
        deadline = time.monotonic() + 30
        while self.log.read_text().count("Application startup complete") < workers:
            if time.monotonic() > deadline or self.popen.poll() is not None:
                raise RuntimeError(f"workers did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)
        for pid in self.pids():  # workers spawned before the parent was pinned
            pin(pid, cpus)

    def worker_cpu(self) -> dict[int, float]:
        """CPU seconds of each process that holds client connections or could."""
        pids = self.pids() if self.workers == 1 else _children(self.popen.pid)
        return {pid: _cpu_of(pid) for pid in pids}

    def pids(self) -> list[int]:
        kids = _children(self.popen.pid)
        return [self.popen.pid, *kids, *(g for k in kids for g in _children(k))]

    def cpu(self) -> float:
        return sum(_cpu_of(pid) for pid in self.pids())

    def spread(self) -> list[int]:
        """Established client connections held by each process (workers: one each)."""
        established = set()
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == self.port and fields[3] == "01":
                established.add(fields[9])
        counts = [len(socket_inodes(pid) & established) for pid in self.pids()]
        return sorted((c for c in counts if c), reverse=True)


def rate_producer(
    url: str, total_rate: float, seconds: float, stats: dict[str, float]
) -> tuple[Any, Any, int]:
    """(prepare, produce, events per run): `total_rate` events/s over all runs; `stats`
    receives how long the publishing took and the producer's CPU seconds."""
    prepare, _ = redis_producer(url, 0)
    per_run = total_rate / RUNS
    events = max(1, round(per_run * seconds))

    def produce(tokens: dict[str, str]) -> tuple[float, float]:
        async def go() -> tuple[float, float]:
            bridge = _producer_bridge(url)

            async def one(run_id: str, token: str, began: float) -> None:
                sent, next_at = 0, began
                while sent < events:
                    next_at += TICK
                    delay = next_at - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    due = min(events, int((time.monotonic() - began) * per_run) + 1)
                    if due <= sent:
                        continue
                    data = RawJSON(b'{"t":%.6f,"p":"%s"}' % (time.time(), PAD))
                    batch = [("token", data)] * (due - sent)
                    await bridge.publish_many(run_id, batch, producer_token=token)
                    sent = due
                await bridge.publish_end(run_id, "success", producer_token=token)

            start, began, cpu0 = time.time(), time.monotonic(), time.process_time()
            await asyncio.gather(*(one(r, t, began) for r, t in tokens.items()))
            stats["publish_seconds"] = time.monotonic() - began
            stats["producer_cpu"] = time.process_time() - cpu0
            await bridge.close()
            return start, time.time()

        return asyncio.run(go())

    return prepare, produce, events


def _line(name: str, f: Fanout, spread: list[int]) -> str:
    lost = "" if f.delivered == f.expected else f"  (got {f.delivered}/{f.expected}!)"
    redis_us = f.extra_cpu / max(1, f.delivered) * 1e6
    return (
        f"  {name:<10} {f.rate:>9,.0f} ev/s  p50 {f.p50_ms:7.1f} ms  p99 {f.p99_ms:7.1f} ms"
        f"  gateway {f.server_cpu:5.1f} s CPU ({f.cpu_us_per_event:4.1f} us/ev)"
        f"  redis {f.extra_cpu:4.1f} s ({redis_us:3.1f} us/ev)  clients {f.client_cpu:4.1f} s"
        f"  connections per worker {'/'.join(map(str, spread))}{lost}"
    )


def measure(
    workers: int,
    srv: RedisServer,
    ctl: redis.Redis,
    rate: float,
    seconds: float,
    cpus: tuple[set[int] | None, set[int] | None],
    logs: Path,
) -> float:
    """One `gateway serve --workers N` under the load; prints its lines, returns ev/s."""
    gateway_cpus, rest_cpus = cpus
    log = logs / f"gateway-{workers}.log"
    with Gateway(workers, free_port(), srv.url, log, gateway_cpus) as server:
        warm_prepare, warm_produce = redis_producer(srv.url, 100)
        http_fanout(server, 4, 10, 100, prepare=warm_prepare, produce=warm_produce, cpus=rest_cpus)
        stats: dict[str, float] = {}
        prepare, produce, events = rate_producer(srv.url, rate, seconds, stats)
        spread: list[int] = []
        worker_cpu0: dict[int, float] = {}

        def produce_and_look(tokens: dict[str, str]) -> Any:
            spread[:] = server.spread()  # every subscriber is connected by now
            worker_cpu0.update(server.worker_cpu())
            return produce(tokens)

        result = http_fanout(
            server,
            RUNS,
            SUBS_PER_RUN,
            events,
            prepare=prepare,
            produce=produce_and_look,
            cpus=rest_cpus,
            tag=f"w{workers}",
            extra_cpu=lambda: redis_cpu(ctl),
        )
        busy = sorted(
            (
                (cpu - worker_cpu0.get(pid, 0.0)) / result.seconds
                for pid, cpu in server.worker_cpu().items()
            ),
            reverse=True,
        )
    total_cpu = result.server_cpu + result.extra_cpu + result.client_cpu + stats["producer_cpu"]
    ncpu = len(os.sched_getaffinity(0))
    print(_line(f"{workers} worker{'s' if workers > 1 else ''}", result, spread))
    print(
        f"{'':13}publishing took {stats['publish_seconds']:.2f} s (planned {seconds:g}), "
        f"producer {stats['producer_cpu']:.1f} s CPU, delivery took {result.seconds:.2f} s; "
        f"workers busy {' / '.join(f'{b:.0%}' for b in busy[:workers])}, "
        f"machine busy {total_cpu / (ncpu * result.seconds):.0%}"
    )
    return result.rate


def main(rate: float, seconds: float) -> None:
    raise_nofile()
    logs = Path(tempfile.mkdtemp(prefix="bench-workers-"))
    ncpu = len(os.sched_getaffinity(0))
    split = ncpu >= 4
    gateway_cpus = {0, 1} if split else None
    rest_cpus = os.sched_getaffinity(0) - {0, 1} if split else None
    placement = "gateway on CPUs 0-1, the rest on the others" if split else "nothing pinned"
    print(
        f"1,000 subscribers over {RUNS} runs; producer {rate:,.0f} events/s in all for "
        f"{seconds:g} s (demand {rate * SUBS_PER_RUN:,.0f} delivered events/s); "
        f"{ncpu} CPUs, {placement}"
    )
    pin(0, rest_cpus)  # the producer
    with RedisServer("--maxclients", "20000") as srv:
        assert srv.proc is not None
        pin(srv.proc.pid, rest_cpus)
        ctl = redis.Redis.from_url(srv.url, client_name="bench-control")
        rates = {
            n: measure(n, srv, ctl, rate, seconds, (gateway_cpus, rest_cpus), logs) for n in (1, 2)
        }
    print(f"  ratio 2 workers / 1 worker: {rates[2] / rates[1]:.2f}  (target >= 1.6)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 3 s publishing window")
    parser.add_argument("--rate", type=float, default=20_000, help="published events/s")
    parser.add_argument("--seconds", type=float, default=None, help="publishing window")
    args = parser.parse_args()
    main(args.rate, args.seconds or (3.0 if args.quick else 10.0))
