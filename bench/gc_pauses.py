"""Pauses of Python's cyclic collector in the gateway under bench/token_stream.py's load,
per generation, with the publish -> receive p99 and the gateway's RSS over the run.

The load is token_stream.py's `gateway-stream` case: `--runs` runs at once, each one
streamed append writing a token line at `--rate` per second, one follower per run, on
the Redis bridge. Each server mode is its own gateway process (run under
bench/gc_probe.py, which times every collector pass with `gc.callbacks`), all alive side
by side on one Redis and measured turn about (A B C, C B A, ...) so that they see the same
machine. Modes:
- `tuned`: the gateway as it starts by default (its collector policy on);
- `default`: `--no-gc-tuning`, Python's own collector settings;
- `disabled`: `--no-gc-tuning` and the collector switched off (a reference only: no
  pass, memory not bounded).
Each round is `--seconds` long after one `--warmup` per server. RSS of every server is
sampled every `--rss-every` seconds for the whole run (rounds and the time between).

Servers on CPU 0; Redis, the producers and the followers on CPU 1.

Run: .venv/bin/python bench/gc_pauses.py [--runs 100] [--rate 50] [--seconds 10]
     [--rounds 4] [--modes tuned,default] [--rss-csv out.csv] [--probe-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _common import RedisServer
from sse_load import ROOT, Proc, free_port, percentile, pin
from token_stream import LOAD_CPU, SERVER_CPU, measure

MODES = {"tuned": ((), False), "default": (("--no-gc-tuning",), False)}
MODES["disabled"] = (("--no-gc-tuning",), True)


def start(mode: str, tmp: Path, redis_url: str) -> tuple[Proc, Path]:
    extra, disable = MODES[mode]
    out = tmp / f"gc-{mode}.json"
    port = free_port()
    argv = [sys.executable, str(ROOT / "bench" / "gc_probe.py"), str(out)]
    argv += ["--disable"] if disable else []
    argv += ["--", "serve", "--port", str(port), "--redis-url", redis_url, *extra]
    return Proc(argv, port, SERVER_CPU, tmp / f"{mode}.log"), out


class RssSampler(threading.Thread):
    def __init__(self, procs: dict[str, Proc], every: float) -> None:
        super().__init__(daemon=True)
        self.procs, self.every = procs, every
        self.samples: list[tuple[float, str, int]] = []
        self.stopped = threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        while not self.stopped.wait(self.every):
            at = time.monotonic() - self.t0
            for name, proc in self.procs.items():
                if proc.popen.poll() is None:
                    self.samples.append((at, name, proc.rss()))


def pauses(
    probe: dict[str, Any], windows: list[tuple[float, float]], key: str = "seconds"
) -> dict[int, list[float]]:
    """Milliseconds (`key`: wall clock `seconds` or `cpu_seconds`) of each pass that
    started inside one of `windows`, by generation."""
    found: dict[int, list[float]] = {0: [], 1: [], 2: []}
    for wall, gen, seconds in zip(probe["wall"], probe["generation"], probe[key], strict=True):
        if any(t0 <= wall <= t1 for t0, t1 in windows):
            found[gen].append(seconds * 1e3)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=10.0, help="per round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--modes", default="tuned,default", help=f"of {', '.join(MODES)}")
    parser.add_argument("--rss-every", type=float, default=1.0)
    parser.add_argument("--rss-csv", type=Path, help="write every RSS sample here")
    parser.add_argument("--probe-dir", type=Path, help="keep each server's probe file here")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes: pick from {', '.join(MODES)}")
    pin(0, LOAD_CPU)
    p99: dict[str, list[float]] = {m: [] for m in modes}
    p50: dict[str, list[float]] = {m: [] for m in modes}
    windows: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmpdir, RedisServer() as server:
        tmp = Path(tmpdir)
        pin(server.proc.pid, LOAD_CPU)  # type: ignore[union-attr]
        redis = server.client()
        started = {m: start(m, tmp, server.url) for m in modes}
        procs = {m: proc for m, (proc, _) in started.items()}
        sampler = RssSampler(procs, args.rss_every)
        sampler.start()
        print(
            f"{args.runs} runs x {args.rate:g} tokens/s x 1 follower, one streamed append per "
            f"run, Redis bridge; {args.rounds} rounds of {args.seconds:g} s per mode",
            flush=True,
        )
        try:
            for mode in modes:
                measure(
                    procs[mode], redis, 1, args.rate, args.warmup, " (warm-up)", True, args.runs
                )
            for n in range(args.rounds):
                for mode in modes if n % 2 == 0 else modes[::-1]:
                    t0 = time.time()
                    row = measure(
                        procs[mode],
                        redis,
                        1,
                        args.rate,
                        args.seconds,
                        streamed=True,
                        runs=args.runs,
                    )
                    windows[mode].append((t0, time.time()))
                    p99[mode].append(row["p99_ms"])
                    p50[mode].append(row["p50_ms"])
                    print(
                        f"round {n} {mode:<9} p50 {row['p50_ms']:6.2f} ms  p99 "
                        f"{row['p99_ms']:6.2f} ms  server {row['server_us_per_event']:5.0f} "
                        f"µs/token  RSS {procs[mode].rss() / 2**20:6.1f} MiB",
                        flush=True,
                    )
        finally:
            sampler.stopped.set()
            for proc in procs.values():
                proc.stop()
        probes = {m: json.loads(out.read_text()) for m, (_, out) in started.items()}
        if args.probe_dir:
            args.probe_dir.mkdir(parents=True, exist_ok=True)
            for _, out in started.values():
                (args.probe_dir / out.name).write_text(out.read_text())
    print("\ncollector passes inside the measured rounds, per generation (ms: wall clock, CPU)")
    print(
        f"{'mode':<10}{'gen':>4}{'passes':>8}{'per s':>7}{'p50':>8}{'p99':>8}{'max':>8}"
        f"{'cpu p99':>9}{'cpu max':>9}"
    )
    measured = args.rounds * args.seconds
    for mode in modes:
        found = pauses(probes[mode], windows[mode])
        cpu = pauses(probes[mode], windows[mode], "cpu_seconds")
        for gen, ms in found.items():
            print(
                f"{mode:<10}{gen:>4}{len(ms):>8}{len(ms) / measured:>7.1f}"
                f"{percentile(ms, 50):>8.2f}{percentile(ms, 99):>8.2f}"
                f"{max(ms, default=float('nan')):>8.2f}{percentile(cpu[gen], 99):>9.2f}"
                f"{max(cpu[gen], default=float('nan')):>9.2f}"
            )
    print("\npublish -> receive, median of rounds (and each round's p99)")
    for mode in modes:
        print(
            f"{mode:<10} p50 {statistics.median(p50[mode]):6.2f} ms  p99 "
            f"{statistics.median(p99[mode]):6.2f} ms  ({' '.join(f'{v:.1f}' for v in p99[mode])})"
        )
    print("\nRSS MiB over the run (first sample, then quarters, last; max)")
    for mode in modes:
        rss = [b / 2**20 for _, name, b in sampler.samples if name == mode]
        if rss:
            marks = [rss[min(len(rss) - 1, i * (len(rss) - 1) // 4)] for i in range(5)]
            print(f"{mode:<10} {' '.join(f'{v:6.1f}' for v in marks)}  max {max(rss):6.1f}")
        probe = probes[mode]
        print(
            f"{'':<10} threshold {tuple(probe['threshold'])}, frozen {probe['freeze_count']}, "
            f"enabled {probe['enabled']}"
        )
    if args.rss_csv:
        args.rss_csv.write_text(
            "seconds,mode,rss_bytes\n"
            + "".join(f"{at:.1f},{name},{b}\n" for at, name, b in sampler.samples)
        )


if __name__ == "__main__":
    main()
