"""The peer-harness table of BENCHMARKS.md from result files of `bench_bridge.py`.

Each argument is `label=file[,file...]`; a column pools every repetition of its files
and prints the median with the lowest and highest repetition. The last two columns are
the last label against the first and the second.

Run: python bench/peer_table.py DeerFlow=df1.json,df2.json 3b653a4=old.json now=new1.json
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from typing import Any

Row = dict[str, Any]


def _fanout(subs: int, field: str) -> Callable[[dict[str, Any]], list[float]]:
    return lambda doc: [row[field] for row in doc["fanout"][str(subs)]["rows"]]


def _many(field: str) -> Callable[[dict[str, Any]], list[float]]:
    return lambda doc: [row[field] for row in doc["many"]["rows"]]


def _resume(field: str) -> Callable[[dict[str, Any]], list[float]]:
    return lambda doc: [row[field] for row in doc["resume"]["rows"]]


FIGURES: list[tuple[str, Callable[[dict[str, Any]], list[float]]]] = [
    ("1 run \u00d7 1 subscriber, delivered ev/s", _fanout(1, "delivered_per_s")),
    ("same, Python CPU µs per event", _fanout(1, "cpu_us_per_delivered")),
    ("same, Redis CPU µs per event", _fanout(1, "redis_cpu_us_per_delivered")),
    ("1 run \u00d7 10 subscribers, ev/s", _fanout(10, "delivered_per_s")),
    ("1 run \u00d7 100 subscribers, ev/s", _fanout(100, "delivered_per_s")),
    ("1 run \u00d7 400 subscribers, ev/s", _fanout(400, "delivered_per_s")),
    ("same, Python CPU µs per delivered event", _fanout(400, "cpu_us_per_delivered")),
    ("100 runs \u00d7 4 subscribers, ev/s", _many("delivered_per_s")),
    ("one resume, 200 events + END, ms", _resume("single_median_ms")),
    ("100 concurrent resumes, wall ms", _resume("concurrent_wall_ms")),
]


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}" if value < 10 else f"{value:.1f}"


def main(argv: list[str]) -> None:
    columns: list[tuple[str, list[dict[str, Any]]]] = []
    for arg in argv:
        label, _, files = arg.partition("=")
        docs = []
        for name in files.split(","):
            with open(name, encoding="utf-8") as handle:
                docs.append(json.load(handle))
        columns.append((f"{label} ({len(docs)} run{'' if len(docs) == 1 else 's'})", docs))
    head = ["figure", *(label for label, _ in columns)]
    if len(columns) >= 2:
        head.append(f"{columns[-1][0].split(' (')[0]} / {columns[0][0].split(' (')[0]}")
    if len(columns) >= 3:
        head.append(f"{columns[-1][0].split(' (')[0]} / {columns[1][0].split(' (')[0]}")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for title, pick in FIGURES:
        cells = [title]
        medians = []
        for _, docs in columns:
            values = [v for doc in docs for v in pick(doc)]
            median = statistics.median(values)
            medians.append(median)
            cells.append(f"{_fmt(median)} ({_fmt(min(values))}\u2013{_fmt(max(values))})")
        if len(columns) >= 2:
            cells.append(f"{medians[-1] / medians[0]:.2f}")
        if len(columns) >= 3:
            cells.append(f"{medians[-1] / medians[1]:.2f}")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
