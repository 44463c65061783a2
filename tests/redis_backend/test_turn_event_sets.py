"""The turn record's event sets have one declaration (`gateway/sessions/turns.py`): the
loader gives them to the Lua as membership functions (`TURN_IS_EVENT`, `TURN_IS_TEXT`),
so the memory fold and the Redis fold, and the Redis append's choice of what to fold
later, decide by the same names."""

from __future__ import annotations

import pytest
import redis

from gateway.redis.scripts import lua_source
from gateway.sessions import turns

pytestmark = pytest.mark.timeout(10)

# Every name either set holds, and names close to them that neither does.
NAMES = sorted(turns.TURN_EVENTS | {"tokens", "text", "ui-chunk", "", "end", "e"})


@pytest.mark.parametrize(
    ("constant", "members"),
    [
        ("TURN_IS_EVENT", turns.TURN_EVENTS),
        ("TURN_IS_TEXT", turns.TEXT_EVENTS),
    ],
)
def test_the_scripts_decide_by_the_declared_sets(
    redis_url: str, constant: str, members: frozenset[str]
) -> None:
    (line,) = {
        line.strip()
        for name in ("publish", "publish_end", "claim")
        for line in lua_source(name).splitlines()
        if line.lstrip().startswith(f"local {constant} =")
    }  # one rendering, the same in every script that folds
    script = line + f"\nreturn {constant}(ARGV[1]) and 1 or 0\n"
    client = redis.Redis.from_url(redis_url)
    try:
        got = {name for name in NAMES if client.eval(script, 0, name) == 1}
    finally:
        client.close()
    assert got == members


def test_text_events_are_turn_events_the_record_folds_later() -> None:
    assert turns.TEXT_EVENTS < turns.TURN_EVENTS
    # (a state or status event folds at once: lua/publish.lua notes a parked turn by it)
    assert (turns.STATE_EVENTS | turns.STATUS_EVENTS).isdisjoint(turns.TEXT_EVENTS)
