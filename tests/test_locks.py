"""The hash-checked locks in requirements/ follow pyproject.toml: every dependency of each
set is pinned there at a version its range allows, with hashes, and the serve set holds
nothing of the test toolchain (./scripts/serve installs only what serving needs)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.timeout(20)

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^ ;\\]+)", re.MULTILINE)


def pins(name: str) -> dict[str, str]:
    text = (ROOT / "requirements" / f"{name}.txt").read_text()
    return {canonicalize_name(m[1]): m[2] for m in PIN.finditer(text)}


def declared(*extras: str) -> list[Requirement]:
    specs = list(PROJECT["dependencies"])
    for extra in extras:
        specs += PROJECT["optional-dependencies"][extra]
    return [Requirement(spec) for spec in specs]


@pytest.mark.parametrize(
    ("lock", "extras"), [("serve", ()), ("test", ("test",)), ("all", ("test", "bench"))]
)
def test_each_lock_pins_every_declared_dependency_within_its_range(
    lock: str, extras: tuple[str, ...]
) -> None:
    locked = pins(lock)
    for requirement in declared(*extras):
        version = locked.get(canonicalize_name(requirement.name))
        assert version is not None, f"{requirement.name} is not in requirements/{lock}.txt"
        assert requirement.specifier.contains(version, prereleases=True), (
            f"requirements/{lock}.txt pins {requirement.name}=={version}, "
            f"outside {requirement.specifier}: run make lock"
        )


@pytest.mark.parametrize("lock", ["serve", "test", "all"])
def test_every_pin_carries_hashes(lock: str) -> None:
    text = (ROOT / "requirements" / f"{lock}.txt").read_text()
    for block in re.split(r"\n(?=[A-Za-z0-9])", text.strip()):
        if PIN.match(block):
            assert "--hash=sha256:" in block, block.splitlines()[0]


def test_the_sets_agree_on_every_version() -> None:
    everything = pins("all")
    for lock in ("serve", "test"):
        for name, version in pins(lock).items():
            assert everything[name] == version, (lock, name)


def test_serving_installs_no_test_toolchain() -> None:
    serve = pins("serve")
    for tool in ("pytest", "playwright", "mypy", "ruff", "schemathesis", "langgraph"):
        assert tool not in serve
