"""A/B of one streamed append's server CPU per token: two gateway processes on one Redis,
one of them running another source tree, measured in alternating rounds.

On a shared machine the CPU per event of bench/token_stream.py moves by ±30 % from run
to run (other jobs' bursts, cold caches), more than most single changes save; two
servers alive side by side, measured turn about (A B, B A, ...), see the same machine.
Each round is token_stream.py's `gateway-stream` case: `--followers` followers (1 by
default), one streamed append with a line per token at `--rate`, server CPU from /proc
(per delivered event with more than one follower).

A is the gateway in `--baseline` (a checkout of another commit, e.g.
`git worktree add /tmp/base <commit>` or `git archive <commit> | tar -x -C /tmp/base`:
its `gateway` package is put first on the server's PYTHONPATH); B is this tree.
Servers on CPU 0; Redis, the producer and the follower on CPU 1.

Run: .venv/bin/python bench/token_stream_ab.py --baseline /tmp/base [--rounds 8]
     [--seconds 4] [--rate 100] [--followers 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from _common import RedisServer
from sse_load import VENV_BIN, Proc, free_port, pin
from token_stream import LOAD_CPU, SERVER_CPU, measure


def start(port: int, log: Path, redis_url: str, pythonpath: str | None) -> Proc:
    env_before = os.environ.get("PYTHONPATH")
    if pythonpath is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = pythonpath  # Proc's child inherits the environment
    try:
        argv = [str(VENV_BIN / "gateway"), "serve", "--port", str(port), "--redis-url", redis_url]
        return Proc(argv, port, SERVER_CPU, log)
    finally:
        if env_before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = env_before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="source tree of server A")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--followers", type=int, default=1)
    args = parser.parse_args()
    baseline = Path(args.baseline).resolve()
    if not (baseline / "gateway" / "__init__.py").is_file():
        sys.exit(f"--baseline: no gateway package in {baseline}")
    pin(0, LOAD_CPU)
    cpu: dict[str, list[float]] = {"A": [], "B": []}
    with tempfile.TemporaryDirectory() as tmp, RedisServer() as server:
        pin(server.proc.pid, LOAD_CPU)  # type: ignore[union-attr]
        redis = server.client()
        a = start(free_port(), Path(tmp) / "a.log", server.url, str(baseline))
        b = start(free_port(), Path(tmp) / "b.log", server.url, None)
        procs = {"A": a, "B": b}
        try:
            for proc in procs.values():  # warm-up, not measured
                measure(proc, redis, args.followers, args.rate, 1.0, " (warm-up)", streamed=True)
            unit = "event" if args.followers == 1 else "delivered event"
            print(
                f"A = {baseline}, B = this tree; server µs per {unit}, {args.rate:g} tokens/s, "
                f"{args.followers} follower(s)"
            )
            for n in range(args.rounds):
                for name in ("A", "B") if n % 2 == 0 else ("B", "A"):
                    row = measure(
                        procs[name], redis, args.followers, args.rate, args.seconds, streamed=True
                    )
                    cpu[name].append(row["server_us_per_delivered"])
                    print(
                        f"round {n} {name}: {row['server_us_per_delivered']:.1f} µs/{unit}, "
                        f"p50 {row['p50_ms']:.2f} ms, p99 {row['p99_ms']:.2f} ms",
                        flush=True,
                    )
        finally:
            for proc in procs.values():
                proc.stop()
    pairs = [b / a for a, b in zip(cpu["A"], cpu["B"], strict=True)]
    print(f"A: {' '.join(f'{v:.1f}' for v in cpu['A'])}")
    print(f"B: {' '.join(f'{v:.1f}' for v in cpu['B'])}")
    print(
        f"B/A: sums {sum(cpu['B']) / sum(cpu['A']):.2f}, median of rounds "
        f"{statistics.median(pairs):.2f}, B lower in {sum(p < 1 for p in pairs)} of {len(pairs)}"
    )


if __name__ == "__main__":
    main()
