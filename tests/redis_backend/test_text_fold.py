"""The deferred text fold at its edges (lua/turn_fold.lua: a turn's text waits in the log,
counted in the run record's `tpend`, until a fold is due). Where the log or the record
goes away, or a new record replaces one, the record must still equal what folding every
event at once gives, or say `truncated`; never hold another turn's text, and never leave
a record that is only a mark."""

from __future__ import annotations

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


def keys(prefix: str, run_id: str) -> dict[str, str]:
    tag = f"{prefix}{{{run_id}}}"
    return {name: f"{tag}:{name}" for name in ("meta", "log", "turn", "text")}


async def test_a_parked_turn_keeps_its_text_when_the_run_expires(
    fresh_redis: RedisServer,
) -> None:
    """A parked record has no TTL and outlives the run's keys: text written while it is
    parked is in the record at once, not waiting in a log that expires."""
    prefix = f"b-{uuid4().hex[:8]}:"
    settings = Settings(redis_url=fresh_redis.url, redis_key_prefix=prefix)
    with anyio.fail_after(30):
        async with open_bridge(settings) as bridge:
            store = session_store_for(bridge, settings)
            run_id = f"r-{uuid4().hex[:8]}"
            token = (await bridge.claim(run_id, session_id="s-p")).token
            await bridge.publish(run_id, "token", {"text": "Sure. "}, producer_token=token)
            await bridge.publish(run_id, "state", "input-required", producer_token=token)
            await bridge.publish(run_id, "token", {"text": "Which account?"}, producer_token=token)
            k = keys(prefix, run_id)
            with fresh_redis.client() as raw:
                assert raw.pttl(k["turn"]) == -1  # parked: the record has no TTL
                raw.delete(k["meta"], k["log"])  # what their TTL does, the record staying
            (turn,) = await store.list_turns("s-p")
    assert turn["state"] == "input-required"
    assert turn["text"] == "Sure. Which account?"
    assert turn["truncated"] is False


async def test_text_folds_later_again_once_the_turn_runs_again(
    fresh_redis: RedisServer,
) -> None:
    """Leaving parked goes back to deferring (the lone token's budget), and the text
    stays in order across the switch."""
    prefix = f"b-{uuid4().hex[:8]}:"
    settings = Settings(redis_url=fresh_redis.url, redis_key_prefix=prefix)
    with anyio.fail_after(30):
        async with open_bridge(settings) as bridge:
            store = session_store_for(bridge, settings)
            run_id = f"r-{uuid4().hex[:8]}"
            token = (await bridge.claim(run_id, session_id="s-r")).token
            await bridge.publish(run_id, "state", "input-required", producer_token=token)
            await bridge.publish(run_id, "token", {"text": "a"}, producer_token=token)
            await bridge.publish(run_id, "state", "running", producer_token=token)
            await bridge.publish(run_id, "token", {"text": "b"}, producer_token=token)
            k = keys(prefix, run_id)
            with fresh_redis.client() as raw:
                assert raw.hget(k["meta"], "tpend") == b"1"  # "b" waits in the log
                assert raw.get(k["text"]) == b"a"
            (turn,) = await store.list_turns("s-r")
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
    prefix = f"b-{uuid4().hex[:8]}:"
    settings = Settings(redis_url=fresh_redis.url, redis_key_prefix=prefix)
    with anyio.fail_after(30):
        async with open_bridge(settings) as bridge:
            store = session_store_for(bridge, settings)
            run_id = f"r-{uuid4().hex[:8]}"
            token = (await bridge.claim(run_id, session_id="s-e")).token
            await bridge.publish(run_id, "token", {"text": "lost"}, producer_token=token)
            with fresh_redis.client() as raw:
                assert raw.delete(keys(prefix, run_id)["log"]) == 1  # a DEL, an eviction
            await bridge.publish_end(run_id, "success", producer_token=token)
            (turn,) = await store.list_turns("s-e")
    assert turn["text"] == ""
    assert turn["truncated"] is True


async def test_no_record_is_made_of_a_mark_alone(fresh_redis: RedisServer) -> None:
    """A run whose record was cleared, and whose log then lost text, gets no record
    holding only `trunc` (it would have no TTL, and stop the next claim's record)."""
    prefix = f"b-{uuid4().hex[:8]}:"
    settings = Settings(redis_url=fresh_redis.url, redis_key_prefix=prefix)
    with anyio.fail_after(30):
        async with open_bridge(settings) as bridge:
            store = session_store_for(bridge, settings)
            run_id = f"r-{uuid4().hex[:8]}"
            k = keys(prefix, run_id)
            token = (await bridge.claim(run_id, session_id="s-x")).token
            await bridge.publish(run_id, "state", "input-required", producer_token=token)
            await store.delete_session("s-x", retire=False)
            await bridge.publish(run_id, "state", "running", producer_token=token)
            await bridge.publish(run_id, "token", {"text": "a"}, producer_token=token)
            with fresh_redis.client() as raw:
                assert raw.hget(k["meta"], "tpend") == b"1"
                raw.delete(k["log"])  # a DEL, an eviction
            await bridge.publish(run_id, "state", "running", producer_token=token)  # folds
            with fresh_redis.client() as raw:
                assert not raw.exists(k["turn"])
