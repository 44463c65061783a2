"""The connection the Redis bridge's command pool uses: redis-py's, packing with hiredis.

redis-py's asyncio connection packs every command in Python (its synchronous one already
packs with hiredis when it is installed): for a publish, whose script call carries a
dozen arguments, that was about a tenth of the bridge's CPU per event. `pack_command`
is the connection's public hook for it; `hiredis.pack_command` produces the same bytes
for the argument types the bridge sends (bytes, str, int), and anything else goes the
way redis-py packs it.
"""

from __future__ import annotations

from typing import Any

import hiredis
from redis.asyncio import Connection

_PACKED_TYPES = (bytes, str, int)


class PackedConnection(Connection):
    """A plain TCP connection whose commands hiredis packs."""

    def pack_command(self, *args: Any) -> list[bytes]:
        for arg in args:
            if type(arg) not in _PACKED_TYPES:  # bool, float, memoryview, ...: redis-py's way
                return super().pack_command(*args)
        first = args[0]
        if " " in first if isinstance(first, str) else b" " in first:
            # A command name with its subcommand ("SCRIPT LOAD"): separate arguments.
            return super().pack_command(*args)
        try:
            return [hiredis.pack_command(args)]
        except Exception:  # what redis-py would refuse: let it refuse it, its own way
            return super().pack_command(*args)
