"""The commit-msg hook (.githooks/commit-msg) refuses a subject over 72 characters and
lets a 72-character one, with a body of any width, through."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(10)

HOOK = Path(__file__).resolve().parent.parent / ".githooks" / "commit-msg"


def run_hook(tmp_path: Path, message: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message)
    return subprocess.run([str(HOOK), str(path)], capture_output=True, text=True, check=False)


def test_a_subject_of_72_characters_passes(tmp_path: Path) -> None:
    assert run_hook(tmp_path, "s" * 72 + "\n\n" + "b" * 200 + "\n").returncode == 0


def test_a_subject_of_73_characters_is_refused(tmp_path: Path) -> None:
    done = run_hook(tmp_path, "# a comment git strips\n" + "s" * 73 + "\n")
    assert done.returncode == 1
    assert "73 characters" in done.stderr
