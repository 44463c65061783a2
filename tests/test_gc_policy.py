"""`gateway serve` applies its collector policy (gateway/gc_policy.py) once started, and
`--no-gc-tuning` leaves Python's defaults.

The policy is process state, so each case is a real `gateway serve` in a subprocess: a
thread of that same process waits for `/healthz` to answer (a request handled means the
server's startup, where the policy is applied, has returned), prints the collector's
state as one JSON line and sends the process SIGTERM, its ordinary graceful stop.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.gc_policy import GC_THRESHOLDS

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import gc, json, os, signal, sys, threading, time, urllib.request
from gateway.cli import main

port, flags = sys.argv[1], sys.argv[2:]
defaults = gc.get_threshold()

def watch():
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        time.sleep(0.05)
    print(json.dumps({"defaults": defaults, "threshold": gc.get_threshold(),
                      "frozen": gc.get_freeze_count()}), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=watch, daemon=True).start()
main(["serve", "--port", port, *flags])
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def served_gc_state(*flags: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(free_port()), *flags],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=45,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    state: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return state


def test_serve_freezes_start_up_objects_and_raises_thresholds() -> None:
    state = served_gc_state()
    assert state["frozen"] > 10_000  # the app, its routes, the modules: tens of thousands
    assert tuple(state["threshold"]) == GC_THRESHOLDS


def test_no_gc_tuning_leaves_python_defaults() -> None:
    state = served_gc_state("--no-gc-tuning")
    assert state["frozen"] == 0
    assert state["threshold"] == state["defaults"]
