"""Loads the Lua scripts that live in `lua/` (repository root; `gateway/lua` in a wheel)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any, Final

from redis.commands.core import AsyncScript

from ..cursor import EPOCH_SPAN
from ..sequence import MAX_LOOKBACK
from ..sessions import turns
from . import turn_fields

_PACKAGED = Path(__file__).resolve().parent.parent / "lua"  # installed wheel
_SOURCE = Path(__file__).resolve().parent.parent.parent / "lua"  # source checkout


def _lua_dir() -> Path:
    for candidate in (_PACKAGED, _SOURCE):
        if (candidate / "publish.lua").is_file():
            return candidate
    raise FileNotFoundError(f"Lua scripts not found in {_PACKAGED} or {_SOURCE}")


_INCLUDE = "--! include "
_CONST = "--! const "
_READ = "--! read "
_MORE = "--!+ "

# The record of a numbering's newest ids in the run hash (lua/publish.lua): buckets of
# at least SEQ_BUCKET events, the current one (`seq_cur`) rewritten by each numbered
# append, the SEQ_BUCKETS newest closed ones in a ring of fields (`sq0`, `sq1`, ...), so
# that at least MAX_LOOKBACK events are recorded. Small buckets cost less to rewrite;
# fewer fields cost less per field: 32 of 32 events keep 1,024 in ~10 KB.
SEQ_BUCKET: Final = 32
CONSTANTS: Final = {
    "EPOCH_SPAN": EPOCH_SPAN,
    "LOOKBACK": MAX_LOOKBACK,
    "SEQ_BUCKET": SEQ_BUCKET,
    "SEQ_BUCKETS": -(-MAX_LOOKBACK // SEQ_BUCKET),
    "TURN_FIELD": turn_fields.LUA_TABLE,
    "TURN_IS_EVENT": turns.TURN_EVENTS,
    "TURN_IS_TEXT": turns.TEXT_EVENTS,
}


@cache
def lua_source(name: str) -> str:
    """The text of `lua/<name>.lua` (read once per process), with each line
    `--! include <other>` replaced by the text of `lua/<other>.lua` (Redis scripts
    cannot load each other: a shared library is pasted into every script that uses it)
    and each line `--! const <NAME>` by `local <NAME> = <value>` from `CONSTANTS` (a
    number the Python code decides by, a table of names, or a set of names as a function
    `name -> bool`, given to the script from
    its one definition), and each `--! read <prefix> <key> <field> ...` (its fields
    going on over lines `--!+ <field> ...`) by one `HMGET` of those fields into locals
    named `<prefix>_<field>`: a hash read by name, once, at no cost per call (a table
    by name cost a read of 22 fields 2-4 us more in Redis, measured with
    redis-benchmark). A read may end in `when <condition>: <field> ...`, fields read
    only when the Lua condition holds (nil otherwise), in the same one `HMGET`: each
    field a script reads costs about 1 % of a lone append's Redis time, the `HMGET`
    itself about 2 % (bench/lua_cost.py --instructions)."""
    return expand((_lua_dir() / f"{name}.lua").read_text(encoding="utf-8"), f"lua/{name}.lua")


def expand(text: str, name: str = "<text>") -> str:
    """`text` with its `--!` lines expanded as `lua_source` does."""
    lines: list[str] = []
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith(_MORE):
            if not lines or not lines[-1].lstrip().startswith(_READ):
                raise ValueError(f"{name}: {_MORE.strip()} after no {_READ.strip()}")
            lines[-1] = f"{lines[-1].rstrip()} {line.lstrip()[len(_MORE) :].strip()}\n"
        else:
            lines.append(line)
    return "".join(_expand(line) for line in lines)


def _expand(line: str) -> str:
    if line.startswith(_INCLUDE):
        return lua_source(line[len(_INCLUDE) :].strip())
    if line.lstrip().startswith(_READ):
        indent = line[: len(line) - len(line.lstrip())]
        spec, _, when = line.lstrip()[len(_READ) :].partition(" when ")
        prefix, key, *fields = spec.split()
        if not when:
            return f"{indent}local {_hmget(prefix, key, fields)}\n"
        condition, _, more = when.rpartition(":")
        every = [*fields, *more.split()]
        names = ", ".join(f"{prefix}_{field}" for field in every)
        return (
            f"{indent}local {names}\n"
            f"{indent}if {condition.strip()} then {_hmget(prefix, key, every)}\n"
            f"{indent}else {_hmget(prefix, key, fields)} end\n"
        )
    if line.lstrip().startswith(_CONST):
        indent = line[: len(line) - len(line.lstrip())]
        constant = line.lstrip()[len(_CONST) :].strip()
        return f"{indent}local {constant} = {_lua_value(CONSTANTS[constant])}\n"
    return line


def _hmget(prefix: str, key: str, fields: list[str]) -> str:
    """`<prefix>_<field>, ... = unpack(redis.call('HMGET', <key>, '<field>', ...))`"""
    names = ", ".join(f"{prefix}_{field}" for field in fields)
    quoted = ", ".join(_lua_value(field) for field in fields)
    return f"{names} = unpack(redis.call('HMGET', {key}, {quoted}))"


def _lua_value(value: object) -> str:
    if isinstance(value, frozenset):
        # A set of names is a membership function: scripts make their constants at every
        # call, and a closure costs about a tenth of a table (lua/turn_fold.lua).
        tests = " or ".join(f"name == {_lua_value(name)}" for name in sorted(value))
        return f"function(name) return {tests} end"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_lua_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str):
        if not re.fullmatch(r"[\w:.-]*", value):
            raise ValueError(f"not a plain Lua name: {value!r}")
        return f"'{value}'"
    return str(value)


async def ensure_loaded(client: Any, scripts: Sequence[AsyncScript]) -> int:
    """Load whichever of `scripts` Redis lacks (after a `SCRIPT FLUSH` or a restart).

    `SCRIPT EXISTS` on a Redis Cluster asks every primary and reports a script as
    present only where all have it; `SCRIPT LOAD` goes to every primary. Returns how
    many scripts were (re)loaded; errors are the client's (the caller wraps them).
    """
    if not scripts:
        return 0
    present = await client.script_exists(*(script.sha for script in scripts))
    missing = [script for script, there in zip(scripts, present, strict=True) if not there]
    for script in missing:
        await client.script_load(script.script)
    return len(missing)
