"""Shared bits of the bench scripts: repo path setup and a private redis-server."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support.redis_servers import RedisServer  # noqa: E402

__all__ = ["ROOT", "RedisServer"]
