"""The turn record's field names have one declaration (`gateway/redis/turn_fields.py`):
the Lua that writes the record gets them from the loader, the decoder and the session
hints read them from it. Each test fails if a copy spells a field name itself."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from pathlib import Path

import orjson
import pytest

from gateway.redis import session_hints, sessions, turn_fields
from gateway.redis.scripts import lua_source

pytestmark = pytest.mark.timeout(10)

LUA = Path(__file__).resolve().parents[2] / "lua"
DECLARED = set(turn_fields.LUA_TABLE.values())
# The record's scripts: what writes it (turn_fold, pasted into these) and what reads it.
WRITERS = ("claim", "publish", "publish_end")


def test_the_loader_gives_the_scripts_the_declared_table() -> None:
    for name in WRITERS:
        line = next(
            line
            for line in lua_source(name).splitlines()
            if line.lstrip().startswith("local TURN_FIELD =")
        )
        pairs = dict(re.findall(r"(\w+) = '([^']*)'", line))
        assert pairs == turn_fields.LUA_TABLE, name


def test_the_lua_names_only_declared_fields() -> None:
    text = (LUA / "turn_fold.lua").read_text(encoding="utf-8")
    used = set(re.findall(r"TURN_FIELD\.(\w+)", text))
    assert used and used <= set(turn_fields.LUA_TABLE)
    # every command on the record's hash (`tk`) names its fields through the table
    spelled = [
        literal
        for line in text.splitlines()
        if re.search(r"redis\.call\('H\w+', tk\b", line)
        for literal in re.findall(r"'([^']*)'", line.split("tk", 1)[1])
        if literal in DECLARED or literal.rstrip("0123456789") in DECLARED
    ]
    assert spelled == []


def _constants_in(function: object) -> set[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))  # type: ignore[arg-type]
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def test_the_python_readers_spell_no_field() -> None:
    # (the reply's keys, such as "state" and "status", are the reader's shape, not fields)
    hash_only = DECLARED - {"state", "status", "order"}
    assert _constants_in(sessions._record) & hash_only == set()
    assert _constants_in(session_hints.SessionHints.moved) & DECLARED == set()


def test_the_decoder_reads_every_declared_field() -> None:
    F = turn_fields
    values = {
        F.SESSION: b"s-1",
        F.ORDER: b"3",
        F.STATE: b"input-required",
        F.CREATED: b"1000",
        F.UPDATED: b"2500",
        F.CHARS: b"5",
        F.TRUNC: b"1",
        F.STATUS: orjson.dumps({"state": "input-required"}),
        F.ARTS: b"1",
        F.ART + "1": orjson.dumps({"artifactId": "a"}),
        F.AID + "1": b"a",
        F.HIST: b"1",
        F.HIST_ITEM + "1": orjson.dumps({"role": "user"}),
    }
    reply: list[object] = [b"hello"]
    for field, value in values.items():
        reply += [field.encode(), value]
    assert sessions._record("r-1", reply) == {
        "run_id": "r-1",
        "session_id": "s-1",
        "order": 3,
        "state": "input-required",
        "created_at": 1.0,
        "last_updated": 2.5,
        "text": "hello",
        "status": {"state": "input-required"},
        "artifacts": [{"artifactId": "a"}],
        "history": [{"role": "user"}],
        "truncated": True,
    }
