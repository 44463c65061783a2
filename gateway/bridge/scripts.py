"""Loads the Lua scripts that live in `lua/` (repository root; `gateway/lua` in a wheel)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

_PACKAGED = Path(__file__).resolve().parent.parent / "lua"  # installed wheel
_SOURCE = Path(__file__).resolve().parent.parent.parent / "lua"  # source checkout


def _lua_dir() -> Path:
    for candidate in (_PACKAGED, _SOURCE):
        if (candidate / "publish.lua").is_file():
            return candidate
    raise FileNotFoundError(f"Lua scripts not found in {_PACKAGED} or {_SOURCE}")


@cache
def lua_source(name: str) -> str:
    """The text of `lua/<name>.lua` (read once per process)."""
    return (_lua_dir() / f"{name}.lua").read_text(encoding="utf-8")
