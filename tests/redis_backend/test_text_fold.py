"""The deferred text fold at its edges (lua/turn_fold.lua: a turn's text waits in the log,
counted in the run record's `tpend`, until a fold is due). Where the log or the record
goes away, or a new record replaces one, the record must still equal what folding every
event at once gives, or say `truncated`; never hold another turn's text, and never leave
a record that is only a mark."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

import anyio
import pytest

from gateway.bridge.provider import open_bridge
from gateway.sessions.provider import session_store_for
from gateway.settings import Settings
from tests.conftest import BridgeFactory
from tests.support.redis_servers import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@dataclass
class Turn:
    """A run claimed under `session` on a Redis bridge of its own key prefix."""

    bridge: Any
    store: Any
    run_id: str
    token: str
    keys: dict[str, str]  # meta, log, turn, text

    async def publish(self, kind: str, data: Any) -> None:
        await self.bridge.publish(self.run_id, kind, data, producer_token=self.token)

    async def turns(self, session: str) -> list[Any]:
        return list(await self.store.list_turns(session))


@asynccontextmanager
async def claimed(redis: RedisServer, session: str) -> AsyncIterator[Turn]:
    prefix = f"b-{uuid4().hex[:8]}:"
    settings = Settings(redis_url=redis.url, redis_key_prefix=prefix)
    with anyio.fail_after(30):
        async with open_bridge(settings) as bridge:
            run_id = f"r-{uuid4().hex[:8]}"
            token = (await bridge.claim(run_id, session_id=session)).token
            tag = f"{prefix}{{{run_id}}}"
            keys = {name: f"{tag}:{name}" for name in ("meta", "log", "turn", "text")}
            yield Turn(bridge, session_store_for(bridge, settings), run_id, token, keys)


async def test_a_parked_turn_keeps_its_text_when_the_run_expires(
    fresh_redis: RedisServer,
) -> None:
    """A parked record has no TTL and outlives the run's keys: text written while it is
    parked is in the record at once, not waiting in a log that expires."""
    async with claimed(fresh_redis, "s-p") as run:
        await run.publish("token", {"text": "Sure. "})
        await run.publish("state", "input-required")
        await run.publish("token", {"text": "Which account?"})
        with fresh_redis.client() as raw:
            assert raw.pttl(run.keys["turn"]) == -1  # parked: the record has no TTL
            raw.delete(run.keys["meta"], run.keys["log"])  # as their TTL does
        (turn,) = await run.turns("s-p")
    assert turn["state"] == "input-required"
    assert turn["text"] == "Sure. Which account?"
    assert turn["truncated"] is False


async def test_text_folds_later_again_once_the_turn_runs_again(
    fresh_redis: RedisServer,
) -> None:
    """Leaving parked goes back to deferring (the lone token's budget), and the text
    stays in order across the switch."""
    async with claimed(fresh_redis, "s-r") as run:
        await run.publish("state", "input-required")
        await run.publish("token", {"text": "a"})
        await run.publish("state", "running")
        await run.publish("token", {"text": "b"})
        with fresh_redis.client() as raw:
            assert raw.hget(run.keys["meta"], "tpend") == b"1"  # "b" waits in the log
            assert raw.get(run.keys["text"]) == b"a"
        (turn,) = await run.turns("s-r")
    assert turn["text"] == "ab"


async def scenario_cleared_then_claimed(make_bridge: BridgeFactory) -> dict[str, Any]:
    async with make_bridge() as bridge:
        store = session_store_for(bridge, make_bridge.settings())
        run_id = f"r-{uuid4().hex[:8]}"
        token = (await bridge.claim(run_id, session_id="s-c")).token
        await bridge.publish(run_id, "token", {"text": "OLD "}, producer_token=token)
        await bridge.publish(run_id, "state", "input-required", producer_token=token)
        await store.delete_session("s-c", retire=False)  # parked, so clearing is allowed
        assert await store.list_turns("s-c") == []
        # The producer writes on with no record to fold into, then is taken over under
        # the same session: a new record, which holds none of the old one's text.
        await bridge.publish(run_id, "state", "running", producer_token=token)
        await bridge.publish(run_id, "token", {"text": "ORPHAN "}, producer_token=token)
        token = (await bridge.claim(run_id, session_id="s-c", takeover=True)).token
        await bridge.publish(run_id, "token", {"text": "NEW"}, producer_token=token)
        (turn,) = await store.list_turns("s-c")
        return dict(turn)


async def test_a_new_record_takes_no_text_of_the_cleared_one(
    make_bridge: BridgeFactory,
) -> None:
    with anyio.fail_after(30):
        turn = await scenario_cleared_then_claimed(make_bridge)
    assert turn["text"] == "NEW"
    assert turn["state"] == "running"


async def test_an_end_on_a_recreated_log_does_not_hide_lost_text(
    fresh_redis: RedisServer,
) -> None:
    """The END appended to a log recreated after a DEL is not one of the pending
    events: the token the DEL took is reported (`truncated`)."""
    async with claimed(fresh_redis, "s-e") as run:
        await run.publish("token", {"text": "lost"})
        with fresh_redis.client() as raw:
            assert raw.delete(run.keys["log"]) == 1  # a DEL, an eviction
        await run.bridge.publish_end(run.run_id, "success", producer_token=run.token)
        (turn,) = await run.turns("s-e")
    assert turn["text"] == ""
    assert turn["truncated"] is True


async def test_no_record_is_made_of_a_mark_alone(fresh_redis: RedisServer) -> None:
    """A run whose record was cleared, and whose log then lost text, gets no record
    holding only `trunc` (it would have no TTL, and stop the next claim's record)."""
    async with claimed(fresh_redis, "s-x") as run:
        await run.publish("state", "input-required")
        await run.store.delete_session("s-x", retire=False)
        await run.publish("state", "running")
        await run.publish("token", {"text": "a"})
        with fresh_redis.client() as raw:
            assert raw.hget(run.keys["meta"], "tpend") == b"1"
            raw.delete(run.keys["log"])  # a DEL, an eviction
        await run.publish("state", "running")  # folds
        with fresh_redis.client() as raw:
            assert not raw.exists(run.keys["turn"])
