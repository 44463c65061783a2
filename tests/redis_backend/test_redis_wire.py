"""The command pool's connections pack commands with hiredis, byte for byte as redis-py
would, and refuse what redis-py refuses the way it does."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Connection

from gateway.bridge.provider import open_bridge
from gateway.redis.wire import PackedConnection
from gateway.settings import Settings

pytestmark = pytest.mark.timeout(30)

BIG = b"x" * 20_000  # past redis-py's buffer cutoff: its packer sends it as a chunk of its own

CASES: list[tuple[Any, ...]] = [
    ("EVALSHA", "0" * 40, 2, "p:{r}:meta", "p:{r}:log", "tok", 50, "", "e", b'{"t":"\xc3\xa9"}'),
    ("SET", "clé", "välue"),
    ("SET", "k", BIG),
    ("PEXPIRE", "k", 2**63 - 1),
    ("SET", "k", -5),
    ("SET", "k", ""),
    ("SCRIPT LOAD", "return 1"),  # a subcommand in the command name
    (b"XINFO STREAM", b"k"),
    ("ZADD", "z", 1.5, "m"),  # a float: redis-py's packer
    ("SET", "k", memoryview(b"v")),
]


def _packed(connection: Connection, args: tuple[Any, ...]) -> bytes | str:
    try:
        return b"".join(connection.pack_command(*args))
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


@pytest.mark.parametrize("args", CASES, ids=lambda args: str(args[0]))
def test_packs_what_redis_py_packs(args: tuple[Any, ...]) -> None:
    assert _packed(PackedConnection(), args) == _packed(Connection(), args)


@pytest.mark.parametrize("args", [("SET", "k", True), ("SET", "k", None), ("SET", "\udc80", "v")])
def test_refuses_what_redis_py_refuses(args: tuple[Any, ...]) -> None:
    refusal = _packed(Connection(), args)
    assert isinstance(refusal, str)
    assert _packed(PackedConnection(), args) == refusal


def test_hiredis_packs_the_bridge_commands() -> None:
    # One buffer per command, large values included (redis-py's own packer splits them).
    assert len(PackedConnection().pack_command("SET", "k", BIG)) == 1
    assert len(Connection().pack_command("SET", "k", BIG)) > 1


@pytest.mark.anyio
async def test_the_bridge_pool_uses_it_for_plain_tcp(redis_url: str, key_prefix: str) -> None:
    settings = Settings(redis_url=redis_url, redis_key_prefix=key_prefix)
    async with open_bridge(settings) as bridge:
        assert bridge.client.connection_pool.connection_class is PackedConnection
        await bridge.ping()
