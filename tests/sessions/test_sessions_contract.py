"""Sessions keep the run's promise (docs/protocol.md §6, §7), on memory and Redis (and the
cluster where marked): the turn record is written by the same atomic step as the claim,
append or END it reflects; a session's turns are in the backend's order; the session
feed follows a session exactly or answers a gap. Each test names the behaviour it holds.

Real parts only: real `redis-server` processes, a real TCP relay that loses replies
(`tests/support/fault_relay.py`), real bridges. Every test is bounded by `anyio.fail_after`.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from uuid import uuid4

import anyio
import orjson
import pytest
from redis.asyncio import Redis

from gateway.bridge.memory import MemoryStreamBridge
from gateway.bridge.provider import open_bridge
from gateway.errors import BackendUnavailable
from gateway.redis.bridge import RedisStreamBridge
from gateway.redis.session_keys import session_keys
from gateway.sessions import turns as T
from gateway.sessions.base import SessionStore
from gateway.sessions.cursor import SessionCursor
from gateway.sessions.feed import TurnOpened, follow_session
from gateway.sessions.provider import session_store_for
from gateway.sessions.shaping import shape_input_message
from gateway.settings import Settings
from gateway.values import End, StreamEvent, StreamGap, encode_json
from tests.support.fault_relay import FaultRelay
from tests.support.redis_servers import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

TIMEOUT = 60.0
MESSAGE = {"messageId": "m-1", "role": "user", "parts": [{"kind": "text", "text": "q"}]}


def sid() -> str:
    return f"s-{uuid4().hex[:10]}"


def rid() -> str:
    return f"r-{uuid4().hex[:10]}"


@pytest.fixture(params=["memory", "redis", pytest.param("cluster", marks=pytest.mark.cluster)])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def url_of(backend: str, request: pytest.FixtureRequest) -> str | None:
    """The backend's Redis URL (None: memory); the cluster's with the scheme that makes
    the gateway use a cluster client."""
    if backend == "redis":
        return str(request.getfixturevalue("redis_url"))
    if backend == "cluster":
        url = str(request.getfixturevalue("redis_cluster").url)
        return url.replace("redis://", "redis+cluster://", 1)
    return None


@asynccontextmanager
async def opened(
    backend: str, key_prefix: str, redis_url: str | None = None, **over: Any
) -> AsyncIterator[tuple[Any, SessionStore]]:
    settings = Settings(
        redis_url=redis_url if backend != "memory" else None,
        redis_key_prefix=key_prefix,
        heartbeat_interval_seconds=over.pop("heartbeat", 0.5),
        **over,
    )
    async with open_bridge(settings) as bridge:
        yield bridge, session_store_for(bridge, settings)


@pytest.fixture
async def parts(
    backend: str, key_prefix: str, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[Any, SessionStore]]:
    async with opened(backend, key_prefix, url_of(backend, request)) as made:
        yield made


def without_times(turn: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in turn.items() if k not in ("created_at", "last_updated")}


# -- 1. the record is part of the write -------------------------------------------------


async def test_the_claim_append_and_end_write_the_record_themselves(
    parts: tuple[Any, SessionStore],
) -> None:
    """Nothing but the bridge's own calls: no hook after them (a caller that stops right
    after the bridge returned, or never learns it did, leaves nothing behind)."""
    bridge, store = parts
    s, r = sid(), rid()
    with anyio.fail_after(TIMEOUT):
        claim = await bridge.claim(r, session_id=s, input_message=MESSAGE)
        (turn,) = await store.list_turns(s)
        assert turn["state"] == "running" and turn["order"] == 1
        assert turn["history"] == [shape_input_message(MESSAGE)]
        await bridge.publish_many(
            r, [("token", {"text": "It is "}), ("token", "4")], producer_token=claim.token
        )
        assert (await store.list_turns(s))[0]["text"] == "It is 4"
        await bridge.publish_end(r, "success", producer_token=claim.token)
        (turn,) = await store.list_turns(s)
        assert turn["state"] == "success" and turn["text"] == "It is 4"
        assert await store.running_turn(s) is None


async def test_a_retry_after_a_lost_reply_leaves_the_record_exact(
    backend: str, key_prefix: str, request: pytest.FixtureRequest
) -> None:
    """Issue #25 item 1: Redis applies a numbered append / an END, the reply is lost,
    the producer retries and gets `duplicate` / `deduplicated`: the record has the
    events once, and the END (so a clear is not refused as `session_active`). On memory
    (no reply to lose) the retry alone must change nothing."""
    s, r = sid(), rid()
    relay: FaultRelay | None = None
    if backend == "cluster":
        pytest.skip("the relay fronts one server")
    async with anyio.create_task_group() as tg:
        url = None
        if backend == "redis":
            server: RedisServer = request.getfixturevalue("redis_server")
            relay = FaultRelay(("127.0.0.1", server.port))
            await tg.start(relay.serve)
            url = f"redis://127.0.0.1:{relay.port}"
        with anyio.fail_after(TIMEOUT):
            async with opened(backend, key_prefix, url) as (bridge, store):

                async def lossy(call: Any) -> Any:
                    if relay is None:
                        return await call()
                    relay.armed = True
                    with pytest.raises(BackendUnavailable):
                        await call()
                    assert relay.cut >= 1
                    return None

                claim = await bridge.claim(r, session_id=s, input_message=MESSAGE)
                if isinstance(bridge, RedisStreamBridge):
                    # Loaded first: a reply lost to a NOSCRIPT refusal is of a write
                    # that never ran (alone on a fresh server, it was the first one).
                    await bridge.ensure_scripts()
                batch = [("token", {"text": "a"}), ("state", "input-required")]
                await lossy(
                    lambda: bridge.publish_many(r, batch, producer_token=claim.token, seq=1)
                )
                again = await bridge.publish_many(r, batch, producer_token=claim.token, seq=1)
                assert again.duplicate or relay is None
                batch = [("ui", {"type": "text-delta", "delta": "b"}), ("state", "running")]
                await lossy(
                    lambda: bridge.publish_many(r, batch, producer_token=claim.token, seq=3)
                )
                await bridge.publish_many(r, batch, producer_token=claim.token, seq=3)
                (turn,) = await store.list_turns(s)
                assert (turn["text"], turn["state"]) == ("ab", "running")
                await lossy(lambda: bridge.publish_end(r, "success", producer_token=claim.token))
                end = await bridge.publish_end(r, "success", producer_token=claim.token)
                assert end.deduplicated
                (turn,) = await store.list_turns(s)
                assert (turn["text"], turn["state"]) == ("ab", "success")
                assert await store.running_turn(s) is None
                assert await store.delete_session(s, retire=False) == [r]  # not 409
        tg.cancel_scope.cancel()


async def test_a_retired_session_opens_no_turn_and_its_late_writes_stay_invisible(
    parts: tuple[Any, SessionStore],
) -> None:
    bridge, store = parts
    s, r = sid(), rid()
    with anyio.fail_after(TIMEOUT):
        claim = await bridge.claim(r, session_id=s, input_message=MESSAGE)
        assert await store.delete_session(s, retire=True) == [r]
        await bridge.publish(r, "token", "late", producer_token=claim.token)
        late = await bridge.claim(rid(), session_id=s, input_message=MESSAGE)
        await bridge.publish(late.run_id, "token", "x", producer_token=late.token)
        assert await store.list_turns(s) == []
        assert await store.running_turn(s) is None
        assert s not in [row["session_id"] for row in await store.list_sessions(200)]


# -- the Lua fold is the Python spec --------------------------------------------------------


def _sequences() -> list[list[tuple[str, Any]]]:
    rng = random.Random(25)
    deep: Any = "x"
    for _ in range(251):
        deep = [deep]
    deeper: Any = "x"
    for _ in range(253):
        deeper = [deeper]
    pieces = ["plain ", "é", "日本語", "🙂", "\u2028", "", 'a\\"b', "\x00"]
    names = [
        "token",
        "text-delta",
        "ui",
        "state",
        "status",
        "artifact",
        "history",
        "message",
        "text-set",
        "other",
    ]
    fixed: list[tuple[str, Any]] = [
        ("token", {"text": "hello "}),
        ("token", "world"),
        ("token", ["not", "text"]),
        ("token", {"text": 5}),
        ("text-delta", {"text": "!"}),
        ("ui", {"type": "text-delta", "delta": " ui"}),
        ("ui", {"type": "text-start", "id": "t"}),
        ("ui", ["text-delta"]),
        ("state", {"state": "input-required"}),
        ("state", "input-required"),
        ("state", "bogus"),
        ("state", ["running"]),
        ("status", {"state": "working", "message": {"m": 1.5, "big": 2**60}}),
        ("status", "not an object"),
        ("status", {"state": "auth-required", "deep": deep}),
        ("status", {"state": "running", "deep": deeper}),
        ("artifact", {"artifactId": "a", "parts": [1]}),
        ("artifact", {"artifactId": "a", "parts": [2]}),
        ("artifact", {"artifactId": 7, "parts": []}),
        ("artifact", {"artifactId": 7, "parts": []}),
        ("artifact", {"parts": ["x" * 70_000]}),
        ("artifact", {"n": deep}),
        ("artifact", {"n": [deep]}),
        ("history", {"role": "agent", "parts": []}),
        ("message", ["not an object"]),
        ("text-set", {"text": "replaced "}),
        ("text-set", "replaced "),
        ("other", {"text": "ignored"}),
    ]
    many = [("artifact", {"artifactId": f"x{i}"}) for i in range(40)]
    many += [("history", {"i": i}) for i in range(40)]
    big = [("token", "ü" * 60_000 + "🙂" * 10_000) for _ in range(4)]  # past 200,000
    randomish: list[tuple[str, Any]] = []
    for _ in range(300):
        name = rng.choice(names)
        piece = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 4)))
        data: Any = {
            "token": {"text": piece},
            "text-delta": piece,
            "ui": {"type": rng.choice(["text-delta", "x"]), "delta": piece},
            "state": rng.choice(["running", "input-required", "auth-required", "x"]),
            "status": {"state": rng.choice(["working", "input-required", "completed"])},
            "artifact": {"artifactId": rng.choice(["a", "b", "c", None]), "v": piece},
            "history": {"p": piece},
            "message": {"p": piece},
            "text-set": {"text": piece},
            "other": piece,
        }[name]
        randomish.append((name, data))
    return [fixed, many, big, randomish, [*fixed, ("state", "running"), *randomish]]


@pytest.mark.parametrize("sequence", range(5))
async def test_the_backends_fold_a_turn_as_turns_py_says(
    parts: tuple[Any, SessionStore], sequence: int
) -> None:
    """`turns.fold_encoded` is the spec; the memory bridge calls it, Redis runs
    `lua/turn_fold.lua`: the same events (in batches, as producers send them) give the
    same record, field by field (times aside: each backend keeps its own clock)."""
    bridge, store = parts
    events = _sequences()[sequence]
    s, r = sid(), rid()
    with anyio.fail_after(TIMEOUT):
        claim = await bridge.claim(r, session_id=s, input_message=MESSAGE)
        expected = T.new_turn(s, r, shape_input_message(MESSAGE), 0.0, 1)
        for start in range(0, len(events), 7):
            batch = events[start : start + 7]
            await bridge.publish_many(r, batch, producer_token=claim.token)
            T.fold_encoded(expected, [(n, encode_json(d)) for n, d in batch], 0.0)
            (turn,) = await store.list_turns(s)
            assert without_times(turn) == without_times(expected), start
        await bridge.publish_end(r, "error", {"why": 1}, producer_token=claim.token)
        T.end_turn(expected, "error", 0.0)
        # a write after the END folds nothing (the log refuses it; the record too)
        (turn,) = await store.list_turns(s)
        assert without_times(turn) == without_times(expected)
        assert orjson.loads(encode_json({"turns": [turn]}))  # every reader can read it back


# -- 2. one order, the backend's ------------------------------------------------------------


async def test_a_turn_claimed_through_a_gateway_whose_clock_is_behind_sorts_after(
    key_prefix: str,
) -> None:
    """Issue #25 item 2, with the clock injected (memory bridge): a claim accepted after
    another sorts after it whatever the gateway's clock says; so does the feed's "next
    turn" for a client resuming with `<previous>/end`."""
    clock = [2_000_000_000.0]
    settings = Settings(redis_key_prefix=key_prefix, heartbeat_interval_seconds=0.5)
    bridge = MemoryStreamBridge(settings, clock=lambda: clock[0])
    store = bridge.sessions
    s, first, second = sid(), rid(), rid()
    with anyio.fail_after(TIMEOUT):
        a = await bridge.claim(first, session_id=s, input_message=MESSAGE)
        await bridge.publish_end(first, "success", producer_token=a.token)
        clock[0] -= 5.0  # an NTP step, or another gateway 5 s behind
        await bridge.claim(second, session_id=s, input_message=MESSAGE)
        turns = await store.list_turns(s)
        assert [t["run_id"] for t in turns] == [first, second]
        assert turns[1]["created_at"] < turns[0]["created_at"]  # the clock did go back
        assert await store.running_turn(s) == second
        feed = follow_session(bridge, store, s, SessionCursor("end", first), 0.5)
        _, items = await anext(feed)
        assert isinstance(items[0], TurnOpened) and items[0].run_id == second
        await feed.aclose()
    await bridge.close()


async def test_turns_claimed_through_two_gateways_share_one_order(
    backend: str, key_prefix: str, request: pytest.FixtureRequest
) -> None:
    """Two bridges on one backend (two gateways): the order is the backend's counter."""
    if backend == "memory":
        pytest.skip("two gateways share a backend only on Redis")
    url = url_of(backend, request)
    s = sid()
    runs = [rid() for _ in range(6)]
    with anyio.fail_after(TIMEOUT):
        async with (
            opened(backend, key_prefix, url) as (one, store),
            opened(backend, key_prefix, url) as (two, _),
        ):
            for i, r in enumerate(runs):
                claim = await (one if i % 2 else two).claim(r, session_id=s)
                await (two if i % 2 else one).publish(
                    r, "token", str(i), producer_token=claim.token
                )
            turns = await store.list_turns(s)
            assert [t["run_id"] for t in turns] == runs
            assert [t["order"] for t in turns] == [1, 2, 3, 4, 5, 6]


# -- 3, 4. the feed is exact or explicit ----------------------------------------------------


async def test_resuming_behind_the_newest_200_turns_follows_exactly(
    parts: tuple[Any, SessionStore],
) -> None:
    """Issue #25 item 4: after 205 turns, a cursor at the end of the first turn continues
    with the second (the feed pages the session by order), never the sixth."""
    bridge, store = parts
    s = sid()
    runs = [f"{s}-{i:03d}" for i in range(205)]
    with anyio.fail_after(TIMEOUT * 2):
        for r in runs:
            claim = await bridge.claim(r, session_id=s, input_message=MESSAGE)
            await bridge.publish(r, "token", r, producer_token=claim.token)
            await bridge.publish_end(r, "success", producer_token=claim.token)
        feed = follow_session(bridge, store, s, SessionCursor("end", runs[0]), 0.5)
        seen: list[str] = []
        async for _, items in feed:
            for item in items:
                if isinstance(item, TurnOpened):
                    seen.append(item.run_id)
                assert not isinstance(item, StreamGap)
            if len(seen) == 3 and isinstance(items[-1], End):
                break
        await feed.aclose()
        assert seen == runs[1:4]


async def test_resuming_in_a_turn_whose_log_is_gone_is_the_run_s_gap(
    parts: tuple[Any, SessionStore],
) -> None:
    """Issue #25 item 3: the feed asks the bridge, with the bridge's cursor rules: the
    same gap as the run stream (`stream_removed`), never a bare `turn_end`."""
    bridge, store = parts
    s, r = sid(), rid()
    with anyio.fail_after(TIMEOUT):
        claim = await bridge.claim(r, session_id=s, input_message=MESSAGE)
        ids = (
            await bridge.publish_many(
                r, [("token", "a"), ("token", "b")], producer_token=claim.token
            )
        ).ids
        await bridge.publish_end(r, "success", producer_token=claim.token)
        await bridge.cleanup(r)
        for position in ("0-0", ids[0]):
            feed = follow_session(bridge, store, s, SessionCursor("event", r, position), 0.5)
            _, items = await anext(feed)
            await feed.aclose()
            assert isinstance(items[-1], StreamGap), items
            assert items[-1].reason == "stream_removed"
            assert not any(isinstance(item, End | StreamEvent) for item in items)


async def test_index_reads_stay_within_a_small_pool(
    backend: str, key_prefix: str, request: pytest.FixtureRequest
) -> None:
    """A page of the parked listing reads a record per row: in one round trip on one
    connection, never a connection per row (a small pool would run out)."""
    if backend != "redis":
        pytest.skip("one Redis server's connection pool")
    url = url_of(backend, request)
    with anyio.fail_after(TIMEOUT):
        async with opened(backend, key_prefix, url, redis_max_connections=4) as (bridge, store):
            sessions = [sid() for _ in range(30)]
            for s in sessions:
                claim = await bridge.claim(rid(), session_id=s, input_message=MESSAGE)
                await bridge.publish(
                    claim.run_id, "state", "input-required", producer_token=claim.token
                )
            rows = await store.list_sessions(50, parked=True)
            assert sorted(row["session_id"] for row in rows) == sorted(sessions)
            assert {row["last_state"] for row in rows} == {"input-required"}


async def test_a_record_from_before_the_upgrade_is_settled_from_its_run(
    backend: str, key_prefix: str, request: pytest.FixtureRequest
) -> None:
    """A record the previous layout wrote (in the session's slot, by the HTTP route after
    the append) is still read, and settled from its run: left `running` by a lost hook,
    it takes the run's END status; a clear removes it with the session."""
    if backend != "redis":
        pytest.skip("nothing in process memory outlives an upgrade (and one server will do)")
    url = url_of(backend, request)
    s, r = sid(), rid()
    with anyio.fail_after(TIMEOUT):
        async with opened(backend, key_prefix, url) as (bridge, store):
            claim = await bridge.claim(r)  # the run, as the new code sees it
            await bridge.publish(r, "token", "hi", producer_token=claim.token)
            keys = session_keys(key_prefix, s)
            old = T.new_turn(s, r, shape_input_message(MESSAGE), 1_700_000_000.0)
            T.apply_events(old, [("token", "hi")], 1_700_000_001.0)
            raw = Redis.from_url(url)
            try:
                await raw.hset(keys.legacy_prefix + r, mapping={"rev": 2, "state": "running"})
                await raw.hset(keys.legacy_prefix + r, "doc", encode_json(old))
                await raw.zadd(keys.legacy_turns, {r: 1_700_000_001.0})
                await raw.zadd(keys.legacy_exp, {r: float("inf")})
            finally:
                await raw.aclose()
            (turn,) = await store.list_turns(s)
            assert (turn["run_id"], turn["state"], turn["text"]) == (r, "running", "hi")
            assert await store.running_turn(s) == r
            await bridge.publish_end(r, "success", producer_token=claim.token)
            (turn,) = await store.list_turns(s)
            assert turn["state"] == "success"  # settled from the run
            assert await store.running_turn(s) is None
            new = await bridge.claim(rid(), session_id=s, input_message=MESSAGE)
            turns = await store.list_turns(s)
            assert [t["run_id"] for t in turns] == [r, new.run_id]  # the old one first
            await bridge.publish_end(new.run_id, "success", producer_token=new.token)
            assert sorted(await store.delete_session(s, retire=False)) == sorted([r, new.run_id])
            assert await store.list_turns(s) == []
