"""Starting a turn twice (docs/protocol.md, "Starting a turn twice and stopping one"):
a claim's idempotency key, on both backends (`make_bridge`), and the one rule both call
(`gateway.bridge.turn_keys.decide`)."""

from __future__ import annotations

import time
from typing import Any
from uuid import uuid4

import anyio
import pytest
from redis.asyncio import Redis

from gateway.bridge import turn_keys
from gateway.errors import InvalidInput, RunOwned, TurnExists
from gateway.redis.session_keys import turn_key
from gateway.values import RunInfo
from tests.conftest import BridgeFactory

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


def rid() -> str:
    return f"run-{uuid4().hex[:10]}"


async def test_a_second_claim_with_the_key_starts_nothing(make_bridge: BridgeFactory) -> None:
    async with make_bridge() as bridge:
        with anyio.fail_after(10):
            first = await bridge.claim(rid(), session_id="s1", idempotency_key="msg-1")
            second = rid()
            with pytest.raises(TurnExists) as told:
                await bridge.claim(second, session_id="s1", idempotency_key="msg-1")
            assert told.value.run_id == first.run_id
            assert told.value.details() == {"run_id": first.run_id}
            assert await bridge.get_run(second) is None  # nothing started
            # Unique per session; other keys are free.
            await bridge.claim(rid(), session_id="s2", idempotency_key="msg-1")
            await bridge.claim(rid(), session_id="s1", idempotency_key="msg-2")
            # An ended turn keeps its key for the ended TTL.
            await bridge.publish_end(first.run_id, "success", producer_token=first.token)
            with pytest.raises(TurnExists):
                await bridge.claim(rid(), session_id="s1", idempotency_key="msg-1")
            # The same run's claim without takeover is a second start too...
            with pytest.raises(TurnExists):
                await bridge.claim(first.run_id, session_id="s1", idempotency_key="msg-1")


async def test_takeover_of_its_own_turn_goes_on(make_bridge: BridgeFactory) -> None:
    # A producer that lost the claim's reply retries with takeover and gets the turn back.
    async with make_bridge() as bridge:
        with anyio.fail_after(10):
            first = await bridge.claim(rid(), session_id="s", idempotency_key="k")
            again = await bridge.claim(
                first.run_id, session_id="s", idempotency_key="k", takeover=True
            )
            assert again.epoch == first.epoch + 1
            with pytest.raises(TurnExists):  # still one turn for the key
                await bridge.claim(rid(), session_id="s", idempotency_key="k", takeover=True)


async def test_the_key_is_free_after_the_ended_ttl(make_bridge: BridgeFactory) -> None:
    async with make_bridge(ended_ttl_seconds=0.3) as bridge:
        with anyio.fail_after(10):
            first = await bridge.claim(rid(), session_id="s", idempotency_key="k")
            await bridge.publish_end(first.run_id, "success", producer_token=first.token)
            ended = await bridge.get_run(first.run_id)
            assert ended is not None
            await anyio.sleep(max(0.0, ended.updated_at + 0.35 - time.time()))  # time passing
            later = await bridge.claim(rid(), session_id="s", idempotency_key="k")
            with pytest.raises(TurnExists) as told:
                await bridge.claim(rid(), session_id="s", idempotency_key="k")
            assert told.value.run_id == later.run_id


async def test_a_refused_claim_leaves_the_key_free(make_bridge: BridgeFactory) -> None:
    async with make_bridge() as bridge:
        with anyio.fail_after(10):
            owned = await bridge.claim(rid(), session_id="s")
            with pytest.raises(RunOwned):
                await bridge.claim(owned.run_id, session_id="s", idempotency_key="k")
            fresh = await bridge.claim(rid(), session_id="s", idempotency_key="k")
            assert fresh.epoch == 1


async def test_a_double_submit_race_starts_one_run(make_bridge: BridgeFactory) -> None:
    async with make_bridge() as bridge:
        for attempt in range(5):
            key = f"race-{attempt}"
            runs = [rid() for _ in range(8)]
            won: list[str] = []
            told: list[str] = []

            async def claim(
                run_id: str, key: str = key, won: list[str] = won, told: list[str] = told
            ) -> None:
                try:
                    claim = await bridge.claim(run_id, session_id="s", idempotency_key=key)
                    won.append(claim.run_id)
                except TurnExists as exc:
                    told.append(exc.run_id)

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    for run_id in runs:
                        tg.start_soon(claim, run_id)
            assert len(won) == 1 and told == [won[0]] * 7
            started = [r for r in runs if await bridge.get_run(r) is not None]
            assert started == won


async def test_bad_keys_are_refused(make_bridge: BridgeFactory) -> None:
    async with make_bridge() as bridge:
        with anyio.fail_after(10):
            for bad in ("", "a b", "x" * 201, "é", "a{b}"):
                with pytest.raises(InvalidInput):
                    await bridge.claim(rid(), session_id="s", idempotency_key=bad)
            with pytest.raises(InvalidInput, match="session_id"):
                await bridge.claim(rid(), idempotency_key="k")


async def test_redis_entry_of_a_claim_that_never_completed(make_bridge: BridgeFactory) -> None:
    """A gateway that died between the key's entry and the run's claim: the entry
    counts while young (that claim may still be on its way), then the key is free."""
    if make_bridge.backend != "redis":
        pytest.skip("the two-step claim is Redis's")
    assert make_bridge.redis_url is not None
    async with make_bridge() as bridge, Redis.from_url(make_bridge.redis_url) as redis:
        with anyio.fail_after(10):
            now_ms = int(time.time() * 1000)
            young = turn_key(make_bridge.key_prefix, "s", "young")
            old = turn_key(make_bridge.key_prefix, "s", "old")
            await redis.hset(young, mapping={"run": "ghost-1", "at": now_ms})
            stale_ms = now_ms - int(turn_keys.UNCLAIMED_SECONDS * 1000) - 1000
            await redis.hset(old, mapping={"run": "ghost-2", "at": stale_ms})
            with pytest.raises(TurnExists) as told:
                await bridge.claim(rid(), session_id="s", idempotency_key="young")
            assert told.value.run_id == "ghost-1"
            taken = await bridge.claim(rid(), session_id="s", idempotency_key="old")
            assert await redis.hget(old, "run") == taken.run_id.encode()
            ttl = await redis.pttl(old)
            assert 0 < ttl <= 2 * 86_400_000 + 3_600_000  # bounded


def _info(*, ended: bool, updated_at: float) -> RunInfo:
    fields: dict[str, Any] = dict(
        run_id="r",
        session_id="s",
        status="success" if ended else "running",
        created_at=0.0,
        updated_at=updated_at,
        first_event_id=None,
        last_event_id=None,
        retained_events=0,
        cancel_requested=False,
        epoch=1,
        lease_expires_at=0.0,
        log_exists=True,
        error=None,
    )
    return RunInfo(**fields)


def test_decide_is_the_one_rule() -> None:
    def decide(info: RunInfo | None, held_for: float = 0.0, **kw: Any) -> str:
        args: dict[str, Any] = dict(holder="r", run_id="new", takeover=False, now=100.0)
        args.update(kw)
        return turn_keys.decide(info, held_for, ended_ttl=10.0, **args)

    assert decide(_info(ended=False, updated_at=0.0)) == "exists"
    assert decide(_info(ended=True, updated_at=95.0)) == "exists"  # within the ended TTL
    assert decide(_info(ended=True, updated_at=80.0)) == "take"  # past it
    assert decide(None, held_for=1.0) == "exists"  # a claim between its steps
    assert decide(None, held_for=turn_keys.UNCLAIMED_SECONDS + 1) == "take"
    live = _info(ended=False, updated_at=0.0)
    assert decide(live, run_id="r", takeover=True) == "take"
    assert decide(live, run_id="r", takeover=False) == "exists"


@pytest.mark.cluster
async def test_on_a_cluster(redis_cluster: Any, key_prefix: str) -> None:
    """Every script stays in one slot: the key's entry in the session's, the lease cut
    in the run's (a cross-slot script would be refused by the cluster)."""
    from gateway.bridge.provider import open_bridge
    from gateway.settings import Settings

    url = redis_cluster.url.replace("redis://", "redis+cluster://", 1)
    settings = Settings(redis_url=url, redis_key_prefix=key_prefix)
    async with open_bridge(settings) as bridge:
        with anyio.fail_after(20):
            won: list[str] = []
            told: list[str] = []

            async def claim(run_id: str) -> None:
                try:
                    won.append(
                        (await bridge.claim(run_id, session_id="c", idempotency_key="k")).run_id
                    )
                except TurnExists as exc:
                    told.append(exc.run_id)

            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    tg.start_soon(claim, rid())
            assert len(won) == 1 and told == won * 3
            run = await bridge.claim(won[0], session_id="c", idempotency_key="k", takeover=True)
            await bridge.renew_lease(run.run_id, producer_token=run.token, stream="m")
            last = (await bridge.publish(run.run_id, "t", 1, producer_token=run.token)).ids[-1]
            ends = await bridge.cut_lease(
                run.run_id, producer_token=run.token, stream="m", grace=1, last_id=last
            )
            assert ends is not None and ends < time.time() + 2
