"""The Lua scripts ship inside the wheel and an installed (non-editable) copy finds them."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.name for p in (ROOT / "lua").glob("*.lua"))


@pytest.mark.timeout(180)
def test_wheel_carries_lua_and_installed_copy_loads_it(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(ROOT),
        ],
        check=True,
    )
    (wheel,) = (tmp_path / "dist").glob("gateway-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert SCRIPTS and all(f"gateway/lua/{name}" in names for name in SCRIPTS)

    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
    )
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from gateway.bridge.scripts import _lua_dir, lua_source;"
        "print(_lua_dir()); assert 'XADD' in lua_source('publish')"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(site)],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert Path(out) == site / "gateway" / "lua"
