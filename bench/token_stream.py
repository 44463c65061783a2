"""What an agent UI produces: one token per POST at a fixed rate, followed over SSE, on the
Redis bridge; the gateway against the naive Redis design (bench/baselines.py `redis`:
one plain XADD per POST, one blocking-XREAD connection per follower) and against Vercel's
`resumable-stream` in the same run. The third is bench/resumable_stream/server.mjs (Node):
the run is the producer's in-process stream and every follower a resumer fed over Redis
pub/sub (one PUBLISH per chunk per follower); `npm ci` installs it on first use.

For 1 and 100 followers of one run, a producer POSTs one ~30-byte token event at
`--rate` events/s for `--seconds`, then ENDs. `gateway-stream` is the gateway with the
producer it is built for: one streamed append (PROTOCOL 3.3) for the whole turn, an
HTTP/1.1 chunked ndjson body with one line written per token at the same rate, its acks
read as they come (a raw socket: the duplex client an agent would use). Printed per
server:
- server CPU per event, µs (the server process from /proc: producer route through to
  every follower's SSE write), and per delivered event;
- Redis CPU per event, µs (INFO cpu of the private redis-server, before/after);
- Redis commands per event, in and out of scripts (INFO commandstats: every command's
  call count, summed, before/after; EVALSHA counts as one, the commands its script runs
  count too);
- publish -> receive latency p50 / p99, ms (the producer's timestamp in each payload).

Each server is a fresh process per case and first serves `--warmup` seconds of the same
load on another run, not measured: a fresh Node process's JIT otherwise puts its first
second's latencies (80-130 ms at 100 followers) into the p99.

The server is pinned to CPU 0 (node through `taskset` before exec, so that its startup
threads are pinned too); redis-server, the producer and the followers to CPU 1.

`--runs N` streams N runs at once, each with its producer and followers; `--rate 0` lets
every producer write as fast as it can (the full-speed case: `--runs 10 --rate 0
--followers 1`, where the gateway retains 1,000,000 events per run so that a follower
that lags gets every event rather than a gap).

Run: .venv/bin/python bench/token_stream.py [--quick] [--rate 100] [--seconds 20]
     [--servers gateway,naive,resumable-stream] [--warmup 1] [--runs 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import RedisServer
from sse_load import (
    ROOT,
    ClientSpec,
    HttpClient,
    Proc,
    SSELoad,
    baseline_proc,
    free_port,
    gateway_proc,
    percentile,
    pin,
    redis_cpu,
)

SERVER_CPU = {0}
LOAD_CPU = {1}
SERVERS = ("gateway", "gateway-stream", "naive", "resumable-stream")
NODE_DIR = ROOT / "bench" / "resumable_stream"


def node_ready() -> str:
    """The node binary, after `npm ci` in NODE_DIR unless its node_modules holds exactly
    what the lockfile pins (npm writes its own copy of the lockfile there)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        sys.exit("the resumable-stream server needs Node.js 20+ and npm on PATH")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True)
    if int(version.stdout.strip().lstrip("v").split(".")[0]) < 20:
        sys.exit(f"the resumable-stream server needs Node.js 20+, found {version.stdout}")
    installed = NODE_DIR / "node_modules" / ".package-lock.json"
    pinned = json.loads((NODE_DIR / "package-lock.json").read_text())["packages"]
    if not installed.is_file() or {
        path: meta.get("version") for path, meta in pinned.items() if path
    } != {
        path: meta.get("version")
        for path, meta in json.loads(installed.read_text())["packages"].items()
    }:
        print(f"npm ci in {NODE_DIR} ...", flush=True)
        done = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR)
        if done.returncode != 0:
            sys.exit(f"npm ci failed in {NODE_DIR} (exit {done.returncode})")
    return node


def resumable_stream_proc(
    node: str, port: int, cpus: set[int] | None, log: Path, redis_url: str
) -> Proc:
    """bench/resumable_stream/server.mjs, pinned by `taskset` before node starts.

    Node starts its helper threads (V8 platform workers, libuv) at startup, and Proc's
    sched_setaffinity after the exec pins the main thread only. Proc.cpu() reads the
    leader's /proc/<pid>/stat, whose utime/stime are the whole thread group's.
    """
    argv = [node, str(NODE_DIR / "server.mjs"), "--port", str(port), "--redis-url", redis_url]
    if cpus and len(os.sched_getaffinity(0) | cpus) > 1:
        taskset = shutil.which("taskset")
        if taskset is None:
            sys.exit("taskset (util-linux) is needed to pin node before it starts")
        argv = [taskset, "-c", ",".join(map(str, sorted(cpus))), *argv]
    return Proc(argv, port, cpus, log)


def unpinned_threads(proc: Proc, cpus: set[int]) -> list[int]:
    """Threads of the server whose CPU affinity is not `cpus`."""
    stray = []
    for task in Path(f"/proc/{proc.popen.pid}/task").iterdir():
        try:
            if os.sched_getaffinity(int(task.name)) != cpus:
                stray.append(int(task.name))
        except OSError:  # the thread exited meanwhile
            pass
    return stray


def command_calls(client: Any) -> int:
    return sum(int(stats["calls"]) for stats in client.info("commandstats").values())


def measure(
    proc: Proc,
    redis: Any,
    followers: int,
    rate: float,
    seconds: float,
    label: str = "",
    streamed: bool = False,
    runs: int = 1,
) -> dict[str, float]:
    """`runs` runs at once, each with its producer (`rate` 0: as fast as it can) and
    `followers` followers; figures per event over all of them."""
    run_ids = [f"tok-{followers}-{i}-{time.monotonic_ns()}" for i in range(runs)]
    # The runs exist before the followers attach (the gateway answers 404 otherwise).
    load = SSELoad(
        proc.port,
        [ClientSpec(f"/v1/runs/{run_id}/stream") for run_id in run_ids for _ in range(followers)],
        procs=1 if followers * runs == 1 else 2,
        cpus=LOAD_CPU,
    )
    cpu0, rcpu0, calls0 = proc.cpu(), redis_cpu(redis), command_calls(redis)
    produce = _produce_streamed if streamed else _produce_claimed

    async def producers() -> int:
        tokens = [await _claim_only(proc.port, run_id) for run_id in run_ids]
        load.start()
        sent = await asyncio.gather(
            *(produce(proc.port, rate, seconds, r, t) for r, t in zip(run_ids, tokens, strict=True))
        )
        return sum(sent)

    sent = asyncio.run(producers())
    result = load.wait(120)
    cpu, rcpu, calls = proc.cpu() - cpu0, redis_cpu(redis) - rcpu0, command_calls(redis) - calls0
    if result.events != sent * followers or result.finished != followers * runs:
        print(
            f"warning{label}: {result.events} of {sent * followers} events delivered, "
            f"{result.finished} of {followers * runs} followers got the end frame",
            file=sys.stderr,
        )
    delivered = max(1, result.events)
    return {
        "sent": sent,
        "delivered": result.events,
        "server_us_per_event": cpu / sent * 1e6,
        "server_us_per_delivered": cpu / delivered * 1e6,
        "redis_us_per_event": rcpu / sent * 1e6,
        "redis_commands_per_event": calls / sent,
        "p50_ms": percentile(result.latencies_ms, 50),
        "p99_ms": percentile(result.latencies_ms, 99),
    }


async def _claim_only(port: int, run_id: str) -> str:
    http = HttpClient("127.0.0.1", port)
    status, claim = await http.post_json("/v1/runs", {"run_id": run_id, "lease_seconds": 600})
    http.close()
    assert status == 201, (status, claim)
    token: str = claim["producer_token"]
    return token


async def _produce_claimed(port: int, rate: float, seconds: float, run_id: str, token: str) -> int:
    http = HttpClient("127.0.0.1", port)
    headers = {"X-Producer-Token": token}
    interval = 1 / rate if rate else 0.0
    start = time.perf_counter()
    sent = 0
    while time.perf_counter() - start < seconds:
        status, _ = await http.post_json(
            f"/v1/runs/{run_id}/events",
            {"event": "token", "data": {"t": time.time(), "text": "tok"}},
            headers,
        )
        assert status == 200, status
        sent += 1
        if interval:
            await asyncio.sleep(max(0.0, start + sent * interval - time.perf_counter()))
    await http.post_json(f"/v1/runs/{run_id}/end", {"status": "success"}, headers)
    http.close()
    return sent


async def _produce_streamed(port: int, rate: float, seconds: float, run_id: str, token: str) -> int:
    """One streamed append for the whole turn: a line per token, acks read as they come."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        (
            f"POST /v1/runs/{run_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"X-Producer-Token: {token}\r\nX-Producer-Seq: 1\r\n"
            "Content-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
        ).encode()
    )
    acked = 0

    async def read_acks() -> bytes:
        nonlocal acked
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        last = b""
        while True:  # chunked reply: size line, data, CRLF
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return last
            data = await reader.readexactly(size + 2)
            for line in data[:-2].splitlines():
                reply = json.loads(line)
                acked += len(reply.get("ids", ()))
                last = line

    acks = asyncio.ensure_future(read_acks())
    interval = 1 / rate if rate else 0.0
    start = time.perf_counter()
    sent = 0
    while time.perf_counter() - start < seconds:
        line = b'{"event":"token","data":{"t":%r,"text":"tok"}}\n' % time.time()
        writer.write(b"%x\r\n%s\r\n" % (len(line), line))
        await writer.drain()  # (returns at once unless the server has stopped reading)
        sent += 1
        if interval:
            await asyncio.sleep(max(0.0, start + sent * interval - time.perf_counter()))
        elif sent % 64 == 0:
            await asyncio.sleep(0)  # let the acks and the other producers run
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    done = json.loads(await asyncio.wait_for(acks, 30))
    assert done.get("done") and done["count"] == sent == acked, (done, sent, acked)
    writer.close()
    http = HttpClient("127.0.0.1", port)
    await http.post_json(
        f"/v1/runs/{run_id}/end", {"status": "success"}, {"X-Producer-Token": token}
    )
    http.close()
    return sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 s per case instead of 20")
    parser.add_argument(
        "--rate", type=float, default=100.0, help="tokens/s per producer; 0: as fast as it can"
    )
    parser.add_argument("--runs", type=int, default=1, help="runs streaming at once")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--followers", default="1,100")
    parser.add_argument(
        "--warmup",
        type=float,
        default=1.0,
        help="seconds of the same load on each fresh server before it is measured",
    )
    parser.add_argument(
        "--servers", default=",".join(SERVERS), help=f"comma list of: {', '.join(SERVERS)}"
    )
    args = parser.parse_args()
    seconds = 5.0 if args.quick else args.seconds
    chosen = {name.strip() for name in args.servers.split(",") if name.strip()}
    if not chosen or chosen - set(SERVERS):
        parser.error(f"--servers: unknown {sorted(chosen - set(SERVERS))}; pick from {SERVERS}")
    servers = [name for name in SERVERS if name in chosen]
    node = node_ready() if "resumable-stream" in chosen else ""
    pin(0, LOAD_CPU)
    with tempfile.TemporaryDirectory() as tmp, RedisServer() as server:
        pin(server.proc.pid, LOAD_CPU)  # type: ignore[union-attr]
        redis = server.client()
        pace = f"{args.rate:g} ev/s" if args.rate else "full speed"
        print(f"{args.runs} run(s), each at {pace} for {seconds:g} s, Redis bridge")
        header = (
            f"{'server':<17}{'followers':>10}{'server µs/ev':>14}{'µs/delivered':>14}"
            f"{'redis µs/ev':>13}{'cmds/ev':>9}{'p50 ms':>9}{'p99 ms':>9}{'events':>9}"
        )
        print(header)
        for followers in (int(f) for f in args.followers.split(",")):
            for name in servers:
                port = free_port()
                log = Path(tmp) / f"{name}-{followers}.log"
                if name in ("gateway", "gateway-stream"):
                    # (Retention past what a lagging follower needs at full speed.)
                    retain = ("--max-events-per-run", "1000000") if not args.rate else ()
                    proc = gateway_proc(port, SERVER_CPU, log, server.url, *retain)
                elif name == "naive":
                    proc = baseline_proc("redis", port, SERVER_CPU, log, server.url)
                else:
                    proc = resumable_stream_proc(node, port, SERVER_CPU, log, server.url)
                with proc:
                    stray = unpinned_threads(proc, SERVER_CPU)
                    if stray and len(os.sched_getaffinity(0) | SERVER_CPU) > 1:
                        print(f"warning: {name} threads {stray} not pinned", file=sys.stderr)
                    streamed = name == "gateway-stream"
                    if args.warmup > 0:  # Node's JIT warms up for about a second
                        measure(
                            proc,
                            redis,
                            followers,
                            args.rate,
                            args.warmup,
                            " (warm-up)",
                            streamed,
                            args.runs,
                        )
                    row = measure(
                        proc,
                        redis,
                        followers,
                        args.rate,
                        seconds,
                        streamed=streamed,
                        runs=args.runs,
                    )
                print(
                    f"{name:<17}{followers:>10}{row['server_us_per_event']:>14.0f}"
                    f"{row['server_us_per_delivered']:>14.0f}{row['redis_us_per_event']:>13.0f}"
                    f"{row['redis_commands_per_event']:>9.2f}{row['p50_ms']:>9.2f}"
                    f"{row['p99_ms']:>9.2f}{row['sent']:>9}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
