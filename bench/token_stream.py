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

`--sweep 10,100,400,1000` finds the knee: for each count of concurrent runs (each at
`--rate`, default 50 tokens/s in a sweep, one follower per run unless `--followers` says
otherwise), `gateway-stream` and `resumable-stream` in turn (the order alternates from
point to point), a fresh server each, Redis flushed between them. The load is
bench/token_load.py: `--load-procs` worker processes (pinned with Redis to CPU 1), every
run's tokens on one absolute schedule, the gateway's as one streamed append per run,
resumable-stream's as one POST per token pipelined on a connection per run (it has no
streamed append). After `--warmup` seconds of that load, `--seconds` are measured: only
tokens written in that window count, and one counts as delivered if it reached its follower
within `--grace` seconds after the window. Per point and server:
- server CPU µs per token sent, and per token delivered; Redis CPU µs per token; Redis
  commands per token (INFO commandstats);
- p50 / p99 publish -> receive ms over every token sent (one that never arrived counts as
  later than the grace: p99 prints `>grace` once more than 1 % is missing);
- delivered as a share of sent (a token due on a producer connection the server had
  closed counts as sent and not delivered; the row names the error codes it ended with);
- the load's own p99 schedule lateness, ms, and the share of the asked tokens it wrote: a
  point where it wrote under 99 % or ran over 10 ms late is marked `LOAD` (the generator,
  not the server, was the limit) and never counted as the server's figure;
- CPU 0's busy share not spent by the server (other processes on the shared machine) and
  CPU 1's busy share (Redis and the load), from /proc/stat.
Then, per server, the largest swept count at p99 <= 50 ms with >= 95 % delivered, and the
first count where it stops keeping up (delivered < 95 %).

`python-floor` (sweep only, named in `--servers`) is bench/python_floor.py: not a product,
the least a CPython process does per token for the same socket work (the same claim, SSE
follower and streamed append; per token one pipelined EVALSHA that reads the fence, XADDs
and SPUBLISHes, then the ack and the follower's frame; raw asyncio on uvloop, httptools,
hiredis), driven by the same load as `gateway-stream`, to tell what CPU per token is
reachable in CPython at all.

Run: .venv/bin/python bench/token_stream.py [--quick] [--rate 100] [--seconds 20]
     [--servers gateway,naive,resumable-stream] [--warmup 1] [--runs 1]
     .venv/bin/python bench/token_stream.py --sweep 10,100,400,1000 [--seconds 20]
     [--warmup 2] [--grace 2] [--load-procs 2] [--json rows.json]
     .venv/bin/python bench/token_load.py --runs 1000   # can the load keep up? (a sink)
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
from collections import Counter
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
from token_load import LoadReport, TokenLoad

SERVER_CPU = {0}
LOAD_CPU = {1}
DEFAULT_SERVERS = ("gateway", "gateway-stream", "naive", "resumable-stream")
FLOOR_SERVER = "python-floor"  # --sweep only, and only when named
SERVERS = (*DEFAULT_SERVERS, FLOOR_SERVER)
NODE_DIR = ROOT / "bench" / "resumable_stream"
FLOOR = ROOT / "bench" / "python_floor.py"


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


def floor_proc(port: int, cpus: set[int] | None, log: Path, redis_url: str) -> Proc:
    """bench/python_floor.py, started as the gateway is (`--port`, `--redis-url`)."""
    argv = [sys.executable, str(FLOOR), "--port", str(port), "--redis-url", redis_url]
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


def command_counts(client: Any) -> Counter[str]:
    """Calls so far per command (INFO commandstats), a script's own commands included."""
    return Counter(
        {
            name.removeprefix("cmdstat_"): int(stats["calls"])
            for name, stats in client.info("commandstats").items()
        }
    )


def command_calls(client: Any) -> int:
    return sum(command_counts(client).values())


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


# ------------------------------------------------------------------------ the knee

SWEEP_SERVERS = ("gateway-stream", "resumable-stream")
KNEE_P99_MS = 50.0
KEEPS_UP = 0.95  # delivered / sent
LOAD_SENT = 0.99  # written / asked
# The load's p99 schedule lateness: its followers share its event loop, so this also
# bounds what the load adds to a measured latency (a fifth of the 50 ms criterion).
LOAD_LATE_MS = 10.0
CPU0_SHARED = 0.25  # CPU 0's busy share not the server's above which the row says so


def cpu_jiffies() -> dict[str, tuple[int, int]]:
    """Per CPU (`cpu0`, `cpu1`, ...): (busy, total) jiffies from /proc/stat."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *values = line.split()
        if name.startswith("cpu") and name != "cpu":
            ticks = [int(v) for v in values[:8]]
            out[name] = (sum(ticks) - ticks[3] - ticks[4], sum(ticks))  # minus idle, iowait
    return out


def sweep_point(
    name: str,
    proc: Proc,
    redis: Any,
    runs: int,
    followers: int,
    rate: float,
    warmup: float,
    seconds: float,
    grace: float,
    load_procs: int,
) -> dict[str, Any]:
    run_ids = [f"knee-{runs}-{i}-{time.monotonic_ns()}" for i in range(runs)]
    kind = "stream" if name in ("gateway-stream", FLOOR_SERVER) else "post"
    load = TokenLoad(
        proc.port,
        kind,
        run_ids,
        followers=followers,
        rate=rate,
        procs=load_procs,
        cpus=LOAD_CPU,
    )
    try:
        load.start()
        t0 = time.time() + 0.5
        w0 = t0 + warmup
        w1 = w0 + seconds
        stop_at = w1 + grace
        load.go(t0, w0, w1, stop_at)
        time.sleep(max(0.0, w0 - time.time()))
        cpu0, rcpu0, counts0, jiffies0 = (
            proc.cpu(),
            redis_cpu(redis),
            command_counts(redis),
            cpu_jiffies(),
        )
        time.sleep(max(0.0, w1 - time.time()))
        cpu, rcpu, counts, jiffies = (
            proc.cpu() - cpu0,
            redis_cpu(redis) - rcpu0,
            command_counts(redis) - counts0,
            cpu_jiffies(),
        )
        report = load.wait(stop_at - time.time() + 120)
    finally:
        load.kill()
    return knee_row(
        name, runs, followers, rate, seconds, grace, cpu, rcpu, counts, jiffies0, jiffies, report
    )


def knee_row(
    name: str,
    runs: int,
    followers: int,
    rate: float,
    seconds: float,
    grace: float,
    cpu: float,
    rcpu: float,
    counts: Counter[str],
    jiffies0: dict[str, tuple[int, int]],
    jiffies: dict[str, tuple[int, int]],
    report: LoadReport,
) -> dict[str, Any]:
    sent = max(1, report.sent)
    expected = sent * followers
    lat = sorted(report.latencies_ms)
    missing = expected - len(lat)

    def pct(q: float) -> float:  # over every token sent; a missing one is later than any
        index = min(expected - 1, max(0, round(q / 100 * (expected - 1))))
        return lat[index] if index < len(lat) else float("inf")

    def busy(cpu_name: str) -> float:
        (b0, t0), (b1, t1) = jiffies0[cpu_name], jiffies[cpu_name]
        return (b1 - b0) / max(1, t1 - t0)

    asked = runs * rate * seconds
    late_p99 = report.lateness_ms(99)
    load_ok = report.sent >= LOAD_SENT * asked and late_p99 <= LOAD_LATE_MS
    return {
        "server": name,
        "runs": runs,
        "sent": report.sent,
        "asked": asked,
        "delivered": len(lat),
        "delivered_share": len(lat) / expected,
        "missing": missing,
        "accepted": report.accepted,
        "accept_known": report.accept_known,
        "refused": report.refused,
        "closed": report.closed,
        "server_us_per_token": cpu / sent * 1e6,
        "server_us_per_delivered": cpu / max(1, len(lat)) * 1e6,
        "redis_us_per_token": rcpu / sent * 1e6,
        "redis_commands_per_token": counts.total() / sent,
        "commands": {command: n / sent for command, n in counts.most_common()},
        "p50_ms": pct(50),
        "p99_ms": pct(99),
        "load_late_p99_ms": late_p99,
        "load_written_share": report.sent / asked,
        "load_us_per_token": report.cpu / sent * 1e6,
        "load_ok": load_ok,
        "cpu0_other": max(0.0, busy("cpu0") - cpu / seconds) if "cpu0" in jiffies else 0.0,
        "cpu1_busy": busy("cpu1") if "cpu1" in jiffies else 0.0,
        "grace_ms": grace * 1000,
    }


def print_knee_header() -> None:
    print(
        f"{'runs':>5} {'server':<17}{'µs/tok':>8}{'µs/dlv':>8}{'redis µs':>9}{'cmds':>6}"
        f"{'p50 ms':>8}{'p99 ms':>8}{'dlv %':>7}{'load p99':>9}{'wrote %':>8}"
        f"{'load µs':>8}{'cpu0 oth':>9}{'cpu1':>6}  note"
    )


def fmt_ms(value: float, grace_ms: float) -> str:
    return f">{grace_ms:.0f}" if value == float("inf") else f"{value:.1f}"


def print_knee_row(row: dict[str, Any]) -> None:
    # (Nothing delivered: a CPU cost per delivered token has no meaning.)
    per_delivered = f"{row['server_us_per_delivered']:.0f}" if row["delivered"] else "n/a"
    notes = []
    if not row["load_ok"]:
        notes.append("LOAD: the load ran late or short, not the server's figure")
    elif row["delivered_share"] < KEEPS_UP:
        notes.append("not keeping up")
    elif row["p99_ms"] > KNEE_P99_MS:
        notes.append("p99 > 50 ms")
    if row["closed"]:
        closed = ", ".join(f"{n} {code}" for code, n in sorted(row["closed"].items()))
        notes.append(f"producer connections ended by the server: {closed}")
    if row["cpu0_other"] > CPU0_SHARED:
        notes.append("CPU 0 shared with other processes")
    print(
        f"{row['runs']:>5} {row['server']:<17}{row['server_us_per_token']:>8.0f}"
        f"{per_delivered:>8}{row['redis_us_per_token']:>9.1f}"
        f"{row['redis_commands_per_token']:>6.2f}{fmt_ms(row['p50_ms'], row['grace_ms']):>8}"
        f"{fmt_ms(row['p99_ms'], row['grace_ms']):>8}{100 * row['delivered_share']:>7.1f}"
        f"{row['load_late_p99_ms']:>9.1f}{100 * row['load_written_share']:>8.1f}"
        f"{row['load_us_per_token']:>8.1f}{100 * row['cpu0_other']:>8.0f}%"
        f"{100 * row['cpu1_busy']:>5.0f}%  {'; '.join(notes)}",
        flush=True,
    )
    if row["commands"]:  # which commands a token costs, a script's own counted
        each = ", ".join(f"{name} {n:.2f}" for name, n in row["commands"].items() if n >= 0.01)
        print(f"{'':>6}commands per token: {each}", flush=True)


def knee_summary(rows: list[dict[str, Any]], servers: list[str]) -> list[str]:
    lines = []
    for name in servers:
        mine = sorted((r for r in rows if r["server"] == name), key=lambda r: r["runs"])
        carried = [
            r["runs"]
            for r in mine
            if r["load_ok"] and r["p99_ms"] <= KNEE_P99_MS and r["delivered_share"] >= KEEPS_UP
        ]
        behind = [r["runs"] for r in mine if r["load_ok"] and r["delivered_share"] < KEEPS_UP]
        load_limited = [r["runs"] for r in mine if not r["load_ok"]]
        line = (
            f"{name}: carries {max(carried) if carried else 'none'} of the swept counts at "
            f"p99 <= {KNEE_P99_MS:g} ms"
        )
        line += (
            f"; stops keeping up (delivered < {100 * KEEPS_UP:g} %) at {min(behind)}"
            if behind
            else "; keeps up at every swept count it was measured at"
        )
        if load_limited:
            line += f"; not measured (load-limited) at {', '.join(map(str, load_limited))}"
        lines.append(line)
    # The issue's per-point ratios (#38's targets at 100 runs), where both servers ran.
    if "gateway-stream" in servers and "resumable-stream" in servers:
        for runs in sorted({r["runs"] for r in rows}):
            pair = {r["server"]: r for r in rows if r["runs"] == runs}
            if not {"gateway-stream", "resumable-stream"} <= pair.keys():
                continue
            gw, rs = pair["gateway-stream"], pair["resumable-stream"]
            caveat = "" if gw["load_ok"] and rs["load_ok"] else " (a LOAD point: not the servers')"
            lines.append(
                f"{runs} runs, gateway-stream / resumable-stream: CPU per token "
                f"{ratio(gw['server_us_per_token'], rs['server_us_per_token'])} (target <= 0.7), "
                f"Redis CPU per token "
                f"{ratio(gw['redis_us_per_token'], rs['redis_us_per_token'])} (<= 2), "
                f"commands per token {gw['redis_commands_per_token']:.2f} (<= 3), p99 "
                f"{ratio(gw['p99_ms'], rs['p99_ms'])} (<= 1){caveat}"
            )
    return lines


def ratio(a: float, b: float) -> str:
    if a == float("inf") or b == float("inf") or b == 0:
        return "n/a"
    return f"{a / b:.2f}"


def run_sweep(args: argparse.Namespace, seconds: float, servers: list[str]) -> None:
    if set(servers) - {*SWEEP_SERVERS, FLOOR_SERVER}:
        sys.exit(f"--sweep measures {', '.join(SWEEP_SERVERS)} (and {FLOOR_SERVER}) only")
    points = [int(p) for p in args.sweep.split(",")]
    followers = int(args.followers) if given("--followers") else 1
    rate = args.rate if given("--rate") else 50.0
    warmup = args.warmup if given("--warmup") else 2.0
    if rate <= 0:
        sys.exit("--sweep needs a rate above 0")
    node = node_ready() if "resumable-stream" in servers else ""
    pin(0, LOAD_CPU)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, RedisServer() as server:
        pin(server.proc.pid, LOAD_CPU)  # type: ignore[union-attr]
        redis = server.client()
        print(
            f"sweep: runs {args.sweep}, {rate:g} tokens/s each, {followers} follower(s) per "
            f"run, warm-up {warmup:g} s, measured {seconds:g} s, grace {args.grace:g} s, "
            f"{args.load_procs} load processes, Redis bridge; uptime: {uptime()}",
            flush=True,
        )
        print_knee_header()
        for n, runs in enumerate(points):
            order = servers if n % 2 == 0 else servers[::-1]
            for name in order:
                redis.flushall()
                port = free_port()
                log = Path(tmp) / f"{name}-{runs}.log"
                if name == "gateway-stream":
                    # (Every run's streamed append is open at once, all without an API key.)
                    proc = gateway_proc(
                        port,
                        SERVER_CPU,
                        log,
                        server.url,
                        "--max-append-streams-per-key",
                        str(max(256, 2 * runs)),
                    )
                elif name == FLOOR_SERVER:
                    proc = floor_proc(port, SERVER_CPU, log, server.url)
                else:
                    proc = resumable_stream_proc(node, port, SERVER_CPU, log, server.url)
                with proc:
                    stray = unpinned_threads(proc, SERVER_CPU)
                    if stray and len(os.sched_getaffinity(0) | SERVER_CPU) > 1:
                        print(f"warning: {name} threads {stray} not pinned", file=sys.stderr)
                    row = sweep_point(
                        name,
                        proc,
                        redis,
                        runs,
                        followers,
                        rate,
                        warmup,
                        seconds,
                        args.grace,
                        args.load_procs,
                    )
                row["uptime"] = uptime()
                rows.append(row)
                print_knee_row(row)
        redis.flushall()
    print(f"uptime: {uptime()}")
    for line in knee_summary(rows, servers):
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))


def given(flag: str) -> bool:
    """Whether `flag` is on the command line (the sweep has its own defaults)."""
    return any(a == flag or a.startswith(flag + "=") for a in sys.argv[1:])


def uptime() -> str:
    """The load averages as `uptime` prints them (the machine is shared)."""
    return "load average: " + ", ".join(Path("/proc/loadavg").read_text().split()[:3])


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
        "--servers",
        default=",".join(DEFAULT_SERVERS),
        help=f"comma list of: {', '.join(SERVERS)} ({FLOOR_SERVER}: --sweep only)",
    )
    parser.add_argument(
        "--sweep", default="", help="comma list of concurrent run counts: find the knee"
    )
    parser.add_argument(
        "--grace", type=float, default=2.0, help="sweep: seconds a token may take to arrive"
    )
    parser.add_argument("--load-procs", type=int, default=2, help="sweep: load processes")
    parser.add_argument("--json", default="", help="sweep: write the rows to this file")
    args = parser.parse_args()
    seconds = 5.0 if args.quick else args.seconds
    chosen = {name.strip() for name in args.servers.split(",") if name.strip()}
    if not chosen or chosen - set(SERVERS):
        parser.error(f"--servers: unknown {sorted(chosen - set(SERVERS))}; pick from {SERVERS}")
    servers = [name for name in SERVERS if name in chosen]
    if args.sweep:
        if args.servers == ",".join(DEFAULT_SERVERS):
            servers = list(SWEEP_SERVERS)
        run_sweep(args, seconds, servers)
        return
    if FLOOR_SERVER in chosen:
        parser.error(f"--servers: {FLOOR_SERVER} is measured with --sweep only")
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
