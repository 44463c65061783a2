"""Scripts read a hash by name (`--! read <prefix> <key> <field> ...`, expanded by the
loader, `gateway/redis/scripts.py`, into one `HMGET` whose replies land in locals named
after the fields), never by a reply's position, so adding a field to a read cannot make
another line read the wrong one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import redis

from gateway.redis.scripts import expand, lua_source

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


def test_a_read_with_when_reads_those_fields_only_when_its_condition_holds(
    redis_url: str, key_prefix: str
) -> None:
    script = expand(
        "--! read run KEYS[1] a b\n"
        "--!+ when ARGV[1] == '1': c\n"
        "return {run_a or '-', run_b or '-', run_c or '-'}\n"
    )
    assert script.count("'HMGET'") == 2  # one of them runs: a read is one HMGET
    client = redis.Redis.from_url(redis_url)
    try:
        key = f"{key_prefix}:when"
        client.hset(key, mapping={"a": "1", "b": "2", "c": "3"})
        assert client.eval(script, 1, key, "1") == [b"1", b"2", b"3"]
        assert client.eval(script, 1, key, "0") == [b"1", b"2", b"-"]
    finally:
        client.close()


def test_the_append_reads_the_numbering_only_for_a_numbered_batch() -> None:
    text = lua_source("publish")
    (when,) = [line for line in text.splitlines() if line.startswith("if batch_seq then run_")]
    (otherwise,) = [line for line in text.splitlines() if line.startswith("else run_token,")]
    assert "'seq_next'" in when and "'seq_next'" not in otherwise
    assert "'token'" in when and "'token'" in otherwise
