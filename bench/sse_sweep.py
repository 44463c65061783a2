"""Delivered events/s and p99 publish->receive latency against the number of SSE
subscribers (1 -> 2,000) of one run, gateway (memory bridge) vs a plain sse-starlette
endpoint, same run; writes bench/results/sse_sweep.png and .csv (linked from BENCHMARKS.md).

For every subscriber count N, on each server:
- throughput: the producer posts batches of 50 over HTTP as fast as the server takes
  them; delivered events/s until every subscriber has END;
- latency: a 50 events/s token stream (one POST per 20 ms) for a few seconds; p99 of
  publish->receive over every delivered event (a server that cannot keep up shows it).

Server on CPU 0; 2 load processes and the producer on CPU 1.

Run: .venv/bin/python bench/sse_sweep.py [--quick]
"""

from __future__ import annotations

import argparse
import csv
import tempfile
from pathlib import Path

from sse_load import (
    ROOT,
    Fanout,
    baseline_proc,
    free_port,
    gateway_proc,
    http_fanout,
    raise_nofile,
    started,
)

SERVER_CPU = {0}
LOAD_CPU = {1}
COUNTS = (1, 10, 100, 500, 1_000, 2_000)
RESULTS = ROOT / "bench" / "results"


def main(quick: bool) -> None:
    raise_nofile()
    logs = Path(tempfile.mkdtemp(prefix="bench-sse-sweep-"))
    deliveries = 100_000 if quick else 300_000
    seconds = 2 if quick else 4
    rows: list[dict[str, float | str]] = []
    with started(
        {
            "gateway": lambda: gateway_proc(free_port(), SERVER_CPU, logs / "gateway.log"),
            "sse-starlette": lambda: baseline_proc(
                "memory", free_port(), SERVER_CPU, logs / "baseline.log"
            ),
        }
    ) as servers:
        for server in servers.values():
            http_fanout(server, 1, 10, 200, cpus=LOAD_CPU)  # warm-up
        print(f"{'subs':>6} {'server':<14} {'events/s':>10} {'p99 @50/s':>10} {'p50 @50/s':>10}")
        for n in COUNTS:
            events = max(200, min(20_000, deliveries // n))
            for name, server in servers.items():
                peak: Fanout = http_fanout(server, 1, n, events, cpus=LOAD_CPU)
                paced: Fanout = http_fanout(server, 1, n, 50 * seconds, rate=50, cpus=LOAD_CPU)
                rows.append(
                    {
                        "subscribers": n,
                        "server": name,
                        "events_per_s": round(peak.rate),
                        "p99_ms": round(paced.p99_ms, 2),
                        "p50_ms": round(paced.p50_ms, 2),
                    }
                )
                print(
                    f"{n:>6} {name:<14} {peak.rate:>10,.0f} {paced.p99_ms:>8.1f}ms"
                    f" {paced.p50_ms:>8.1f}ms"
                )
    RESULTS.mkdir(parents=True, exist_ok=True)
    with (RESULTS / "sse_sweep.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, RESULTS / "sse_sweep.png")
    print(f"wrote {RESULTS / 'sse_sweep.png'} and sse_sweep.csv")


def plot(rows: list[dict[str, float | str]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, style in (("gateway", "o-"), ("sse-starlette", "s--")):
        mine = [r for r in rows if r["server"] == name]
        xs = [r["subscribers"] for r in mine]
        left.plot(xs, [r["events_per_s"] for r in mine], style, label=name)
        right.plot(xs, [r["p99_ms"] for r in mine], style, label=name)
    left.set(
        xscale="log",
        yscale="log",
        xlabel="SSE subscribers of one run",
        ylabel="delivered events/s",
        title="Throughput (producer: batches of 50 over HTTP)",
    )
    right.set(
        xscale="log",
        yscale="log",
        xlabel="SSE subscribers of one run",
        ylabel="p99 publish->receive (ms)",
        title="p99 latency, 50 events/s token stream",
    )
    for ax in (left, right):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle("One process, memory bridge vs sse-starlette queue-per-subscriber (2 vCPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    main(parser.parse_args().quick)
