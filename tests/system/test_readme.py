"""README's curl block, run as written against a fresh `gateway serve --demo`.

The only change made to the block is the address: the test's server listens on a free
port instead of 8000. The block runs twice, so a fresh run id each time is checked too.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.test_cli import ROOT, Server, clean_env, start_server

pytestmark = pytest.mark.timeout(60)
__all__ = ["start_server"]

BLOCK = re.compile(r"<!-- readme-curl-start -->\n(.*?)<!-- readme-curl-end -->", re.S)


def readme_block() -> str:
    match = BLOCK.search((ROOT / "README.md").read_text())
    assert match, "README.md lost its curl block markers"
    return "\n".join(line.removeprefix("    ") for line in match.group(1).splitlines())


def test_readme_curl_block_runs_as_written(start_server: Callable[..., Server]) -> None:
    server = start_server("--demo")
    server.wait_healthy()
    script = readme_block()
    assert "localhost:8000" in script
    script = script.replace("localhost:8000", f"127.0.0.1:{server.port}")
    for _ in range(2):
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=Path("/tmp"),
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr + done.stdout
        out = done.stdout
        # END's reply, then the stream: the second token (after the cursor) and END only
        assert '"deduplicated":false' in out.replace(" ", "")
        assert out.count("event: token") == 1 and '"text":"lo"' in out
        assert '"text":"Hel"' not in out
        assert out.rstrip().endswith('data: {"status":"success"}')
