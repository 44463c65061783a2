"""The command pool's connections pack commands with hiredis (redis-py >= 8.2 does it
itself when hiredis is installed), and `wire.pack`, which packs the bridge's script calls
once, gives the bytes redis-py's connection would send."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Connection

from gateway.bridge.provider import open_bridge
from gateway.redis.wire import pack
from gateway.settings import Settings

pytestmark = pytest.mark.timeout(30)

BIG = b"x" * 20_000  # past redis-py's Python packer's buffer cutoff: it splits such a value

CASES: list[tuple[Any, ...]] = [
    ("EVALSHA", "0" * 40, 2, "p:{r}:meta", "p:{r}:log", "tok", 50, "", "e", b'{"t":"\xc3\xa9"}'),
    ("SET", "clé", "välue"),
    ("SET", "k", BIG),
    ("PEXPIRE", "k", 2**63 - 1),
    ("SET", "k", -5),
    ("SET", "k", ""),
    ("SCRIPT", "LOAD", "return 1"),
    ("XRANGE", b"k", "-", "+", "COUNT", 512),
]


@pytest.mark.parametrize("args", CASES, ids=lambda args: str(args[0]))
def test_pack_gives_what_redis_py_sends(args: tuple[Any, ...]) -> None:
    assert pack(*args) == b"".join(Connection().pack_command(*args))


def test_redis_py_packs_with_hiredis() -> None:
    # One buffer per command, large values included: hiredis's packer (redis-py's Python
    # packer, which 8.1 used on asyncio connections, splits large values).
    assert len(Connection().pack_command("SET", "k", BIG)) == 1


@pytest.mark.anyio
async def test_the_bridge_pool_packs_with_hiredis(redis_url: str, key_prefix: str) -> None:
    settings = Settings(redis_url=redis_url, redis_key_prefix=key_prefix)
    async with open_bridge(settings) as bridge:
        connection = bridge.client.connection_pool.make_connection()
        assert len(connection.pack_command("SET", "k", BIG)) == 1
        await bridge.ping()
