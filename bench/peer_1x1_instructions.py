"""Instructions per event of the peer harness's 1 x 1 scenario (`peer_1x1.py`), counted by
valgrind's callgrind: the process's own work, whatever else the machine is doing.

The timed figures of a 2-core machine shared with Redis and other load move by several
percent between runs, more than a small change to the bridge; an instruction count is the
same for the same code and inputs. The script runs `peer_1x1.py` under callgrind with
`--events 3000` and with `--events 6000` and prints the difference over 3,000: start-up
and the warm-up cancel out. Kernel time (the syscalls) is not counted, and under
callgrind the process runs some 30 times slower than Redis, so readers take smaller
batches than at full speed: compare two commits with this, not with timed figures.

Run (a private Redis, as for the harness; about a minute):
    .venv/bin/python bench/peer_1x1_instructions.py --redis-url redis://127.0.0.1:6401/0
For another commit, run this file from that commit's checkout.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def instructions(redis_url: str, events: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        run = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={tmp}/out",
                sys.executable,
                str(HERE / "peer_1x1.py"),
                "--redis-url",
                redis_url,
                "--events",
                str(events),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    found = re.search(r"Collected : (\d+)", run.stderr)
    assert found, run.stderr[-2000:]
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis-url", required=True)
    args = parser.parse_args()
    small, large = instructions(args.redis_url, 3000), instructions(args.redis_url, 6000)
    print(f"1 x 1: {(large - small) / 3000:,.0f} instructions per event (callgrind)")


if __name__ == "__main__":
    main()
