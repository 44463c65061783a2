"""The peer harness's one-run, one-subscriber scenario alone, for alternated A/B runs.

`../shared/peer-bench/bench_bridge.py` runs every scenario in a fresh child process; this
calls its `scenario_throughput(adapter, url, 1, 1, events)` directly, after a 2,000-event
warm-up in the same process, and prints delivered events/s, Python CPU and Redis CPU
per event. It flushes the database it is given, like the harness.

Run (a private Redis, as for the harness):
    .venv/bin/python bench/peer_1x1.py --redis-url redis://127.0.0.1:6401/0
    DEERFLOW_SRC=... <DeerFlow's python> bench/peer_1x1.py --adapter deerflow ...
Alternate the sides (another commit: this script from its checkout) and compare medians.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT.parent / "shared" / "peer-bench"
sys.path.insert(0, str(ROOT))  # this checkout's gateway, whatever is installed


def load_harness(directory: Path) -> Any:
    spec = importlib.util.spec_from_file_location("bench_bridge", directory / "bench_bridge.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def main(args: argparse.Namespace) -> None:
    harness = load_harness(Path(args.harness))
    adapter = harness.load_adapter(args.adapter or str(Path(args.harness) / "adapter_gateway.py"))
    await harness.scenario_throughput(adapter, args.redis_url, 1, 1, 2_000)
    row = await harness.scenario_throughput(adapter, args.redis_url, 1, 1, args.events)
    assert row["gaps"] == 0 and row["delivered"] == row["expected"], row
    print(
        f"1 x 1, {args.events} events: {row['delivered_per_s']:,.0f} ev/s, "
        f"Python CPU {row['cpu_us_per_delivered']:.1f} µs/event, "
        f"Redis CPU {row['redis_cpu_us_per_delivered']:.1f} µs/event"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--harness", default=str(HARNESS))
    parser.add_argument("--adapter", help="'deerflow', or an adapter file (default: the gateway's)")
    parser.add_argument("--events", type=int, default=20_000)
    asyncio.run(main(parser.parse_args()))
