"""Run `gateway <args>` with every pass of Python's cyclic collector timed (bench only).

    python bench/gc_probe.py OUT.json [--disable] -- serve --port 8000 ...

A `gc.callbacks` hook records each pass (wall-clock start, generation, duration in
wall-clock and in CPU time, objects collected) into flat arrays, which the collector
does not track and which so add nothing to what it scans. At exit (the gateway's own
graceful exit on SIGTERM) it writes them to OUT.json with the process's final
thresholds, freeze count and per-generation stats, for bench/gc_pauses.py to cut into
measured windows. On a busy machine the wall-clock duration includes time the process
waited for a CPU; the CPU time does not. `--disable` switches the collector off before
the gateway starts (the experiment of issue 38: latency without any pass, memory not
bounded). SIGUSR1 appends a census of the objects the collector tracks (per generation,
the commonest types) to OUT.census.jsonl; SIGUSR2 appends what one full pass would free
there (a census of the cyclic garbage, by type and function).
"""

from __future__ import annotations

import atexit
import gc
import json
import signal
import sys
import time
from array import array
from pathlib import Path
from typing import Any


def install(out: Path) -> None:
    # wall clock, perf counter and this thread's CPU time at the running pass's start
    started = array("d", [0.0, 0.0, 0.0])
    wall, generation, collected = array("d"), array("b"), array("q")
    seconds, cpu_seconds = array("d"), array("d")

    def on_pass(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0], started[1], started[2] = (
                time.time(),
                time.perf_counter(),
                time.thread_time(),
            )
            return
        seconds.append(time.perf_counter() - started[1])
        cpu_seconds.append(time.thread_time() - started[2])
        wall.append(started[0])
        generation.append(info["generation"])
        collected.append(info["collected"])

    def dump() -> None:
        out.write_text(
            json.dumps(
                {
                    "wall": wall.tolist(),
                    "generation": generation.tolist(),
                    "seconds": seconds.tolist(),
                    "cpu_seconds": cpu_seconds.tolist(),
                    "collected": collected.tolist(),
                    "threshold": gc.get_threshold(),
                    "freeze_count": gc.get_freeze_count(),
                    "enabled": gc.isenabled(),
                    "stats": gc.get_stats(),
                }
            )
        )

    census_path = out.with_suffix(".census.jsonl")

    def census(signum: int, frame: object) -> None:
        # What the collector walks right now: objects per generation, the commonest types.
        counts: dict[str, int] = {}
        for obj in gc.get_objects():
            name = type(obj).__qualname__
            counts[name] = counts.get(name, 0) + 1
        top = sorted(counts.items(), key=lambda kv: -kv[1])[:12]
        sizes = [len(gc.get_objects(g)) for g in range(3)]
        with census_path.open("a") as f:
            f.write(json.dumps({"wall": time.time(), "generations": sizes, "top": top}) + "\n")

    def garbage(signum: int, frame: object) -> None:
        # What is cyclic garbage right now: one full pass keeping what it would free.
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        gc.set_debug(0)
        counts: dict[str, int] = {}
        for obj in gc.garbage:
            name = type(obj).__qualname__
            if name in ("function", "method", "cell") and hasattr(obj, "__qualname__"):
                name += f" {obj.__qualname__}"
            if name == "frame":
                name += f" {obj.f_code.co_qualname}"  # type: ignore[attr-defined]
            counts[name] = counts.get(name, 0) + 1
        gc.garbage.clear()
        top = sorted(counts.items(), key=lambda kv: -kv[1])[:40]
        with census_path.open("a") as f:
            f.write(json.dumps({"wall": time.time(), "garbage": top}) + "\n")

    gc.callbacks.append(on_pass)
    atexit.register(dump)
    signal.signal(signal.SIGUSR1, census)
    signal.signal(signal.SIGUSR2, garbage)


def main() -> None:
    args = sys.argv[1:]
    split = args.index("--")
    options, gateway_args = args[:split], args[split + 1 :]
    install(Path(options[0]))
    if "--disable" in options[1:]:
        gc.disable()
    from gateway.cli import main as gateway_main

    gateway_main(gateway_args)


if __name__ == "__main__":
    main()
