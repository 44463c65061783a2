"""Property-based fuzzing of the JSON API from its own `/openapi.json` (schemathesis):
no generated request may produce a 500 or a status the document does not declare.

`/wait` is left out: a valid request for a live run legitimately blocks for its
`timeout`, which a fuzzer would spend the whole budget on; its 4xx handling is covered
in tests/http_app/test_http_routes.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.http_server import make_settings, serve

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")


@pytest.mark.timeout(600)
def test_fuzzed_requests_get_documented_statuses_and_no_500(key_prefix: str) -> None:
    if not SCHEMATHESIS.exists():
        pytest.fail("schemathesis is a test dependency; run scripts/bootstrap")
    with serve(make_settings("memory", None, key_prefix)) as server:
        result = subprocess.run(
            [
                str(SCHEMATHESIS),
                "run",
                f"{server.base_url}/openapi.json",
                "--checks",
                "not_a_server_error,status_code_conformance",
                "--phases",
                "examples,fuzzing",
                "--max-examples",
                "15",
                "--workers",
                "2",
                "--request-timeout",
                "10",
                "--exclude-path-regex",
                "/wait$",
                "--seed",
                "1",
                "--no-color",
            ],
            capture_output=True,
            text=True,
            timeout=550,
            check=False,
        )
    summary = result.stdout[-3000:]
    assert result.returncode == 0, summary
    counts = re.search(r"(\d+) generated, (\d+) passed", summary)
    assert counts is not None, summary
    assert int(counts[1]) >= 50 and counts[1] == counts[2], summary
