"""The Lua scripts ship inside the wheel and an installed (non-editable) copy finds them."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
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
        "from gateway.redis.scripts import _lua_dir, lua_source;"
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


# Distribution name -> the module it installs, where the two differ.
_IMPORT_NAMES = {"pyjwt": "jwt", "prometheus-client": "prometheus_client"}


def test_every_runtime_dependency_is_imported_by_the_package() -> None:
    """A runtime dependency nothing in gateway/ imports belongs in an extra (e.g. bench)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted: dict[str, str] = {}
    for requirement in project["dependencies"]:
        name = re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower()
        wanted[name] = _IMPORT_NAMES.get(name, name.replace("-", "_"))
    imported: set[str] = set()
    for path in (ROOT / "gateway").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    unused = sorted(name for name, module in wanted.items() if module not in imported)
    assert not unused, f"runtime dependencies gateway/ never imports: {unused}"
    assert "sse-starlette" not in wanted
