"""Scripts read a hash by name (`--! read <prefix> <key> <field> ...`, expanded by the
loader, `gateway/redis/scripts.py`, into one `HMGET` whose replies land in locals named
after the fields), never by a reply's position, so adding a field to a read cannot make
another line read the wrong one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.redis.scripts import lua_source

pytestmark = pytest.mark.timeout(10)

LUA = Path(__file__).resolve().parents[2] / "lua"


def test_a_read_becomes_one_hmget_into_locals_named_by_field() -> None:
    text = lua_source("publish_end")
    (line,) = [line for line in text.splitlines() if line.startswith("local run_token,")]
    names, fields = re.fullmatch(
        r"local (.*) = unpack\(redis\.call\('HMGET', KEYS\[1\], (.*)\)\)", line
    ).groups()  # type: ignore[union-attr]
    fields_read = re.findall(r"'(\w+)'", fields)
    assert names.split(", ") == [f"run_{field}" for field in fields_read]
    assert "tpend" in fields_read and "tfold" in fields_read  # (its continuation line)
    assert "--!" not in text


def test_no_script_reads_a_hash_reply_by_position() -> None:
    for path in sorted(LUA.glob("*.lua")):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"\b(meta|pend|held|record)\[\d", text), path.name
        assert "'HMGET', KEYS" not in text, path.name  # (a read by name instead)
