"""The npm package in js/ (@gateway/ai): its own `npm test` against real gateways.

`npm test` builds the package with strict `tsc`, type-checks it against the AI SDK's
`ChatTransport` and resumable-stream's context, then runs its `node:test` suites; each
suite starts `gateway serve` (the memory bridge) on a free port itself and drives it
through localhost relays and proxies: the streamed producer 40 ms away, a dropped
connection, a buffering proxy, cancel, the UI message helper with the AI SDK's own
`streamText`, the browser transport on Node's fetch, the resumable-stream adapter used
as that package's README shows, and reader tokens.

`npm ci` runs from scripts/bootstrap, or here when js/node_modules is older than its
lockfile. A system test (tests/system/): `make test-fast` skips it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

JS_DIR = Path(__file__).resolve().parents[2] / "js"
GATEWAY_BIN = Path(sys.executable).parent / "gateway"


def _npm_ci(npm: str) -> None:
    installed = JS_DIR / "node_modules" / ".package-lock.json"
    lock = JS_DIR / "package-lock.json"
    if installed.is_file() and installed.stat().st_mtime >= lock.stat().st_mtime:
        return
    subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=JS_DIR,
        check=True,
        timeout=300,
    )


@pytest.mark.timeout(300)
def test_npm_package_suite() -> None:
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        pytest.skip("node and npm are needed for the npm package's tests")
    _npm_ci(npm)
    proc = subprocess.run(
        [npm, "test", "--silent"],
        cwd=JS_DIR,
        env={"GATEWAY_BIN": str(GATEWAY_BIN), **os.environ},  # an explicit GATEWAY_BIN wins
        capture_output=True,
        text=True,
        timeout=240,
    )
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    assert re.search(r"^\S* ?fail 0$", report, re.MULTILINE), report
