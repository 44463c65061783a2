"""The sessions/turns store contract (docs/protocol.md §6), run against memory and a real Redis.

Every test is bounded by `anyio.fail_after`; nothing synchronises by sleeping. Times
passed as `now` are synthetic and strictly increasing, so ordering is deterministic.
Redis-only tests (restart, stale index rows, TTLs, SCRIPT FLUSH) skip on memory.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from uuid import uuid4

import anyio
import pytest
from redis.asyncio import Redis

from gateway.bridge.memory import MemoryStreamBridge
from gateway.bridge.provider import open_bridge
from gateway.errors import InvalidInput, SessionActive, StreamEnded
from gateway.redis.bridge import RedisStreamBridge
from gateway.redis.keys import run_keys
from gateway.redis.session_keys import index_keys, session_keys
from gateway.sessions import SessionStore
from gateway.sessions.provider import session_store_for
from gateway.settings import Settings

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

TIMEOUT = 15.0
T0 = 1_700_000_000.0


class Writes:
    """A session store whose turns are written the way producers write them: through the
    bridge (claim, append, END), which writes the records in its own steps; reads go to
    the store. `now` drives the memory bridge's clock (Redis takes its own time). Each
    write claims the run with takeover first, so synthetic times never lapse a lease."""

    def __init__(self, bridge: Any, store: SessionStore, clock: list[float]) -> None:
        self.bridge = bridge
        self.store = store
        self._clock = clock

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def _claim(self, session_id: str, run_id: str, message: Any, now: float) -> str | None:
        self._clock[0] = now
        try:
            claim = await self.bridge.claim(
                run_id, session_id=session_id, input_message=message, takeover=True
            )
        except StreamEnded:
            return None
        return str(claim.token)

    async def start_turn(self, session_id: str, run_id: str, message: Any, now: float) -> bool:
        await self._claim(session_id, run_id, message, now)
        return not await self.store.is_retired(session_id)

    async def apply_events(
        self, session_id: str, run_id: str, events: list[tuple[str, Any]], now: float
    ) -> bool:
        token = await self._claim(session_id, run_id, None, now)
        if token is not None and events:
            await self.bridge.publish_many(run_id, events, producer_token=token)
        return not await self.store.is_retired(session_id)

    async def end_turn(self, session_id: str, run_id: str, status: str, now: float) -> bool:
        token = await self._claim(session_id, run_id, None, now)
        if token is not None:
            await self.bridge.publish_end(run_id, status, producer_token=token)  # type: ignore[arg-type]
        return not await self.store.is_retired(session_id)


class Stores:
    """`stores.open()` makes a store on this test's backend; on Redis each call is a new
    client and a new store instance (what a gateway restart looks like to the data)."""

    def __init__(self, backend: str, redis_url: str | None, key_prefix: str) -> None:
        self.backend = backend
        self.redis_url = redis_url
        self.settings = Settings(redis_url=redis_url, redis_key_prefix=key_prefix)
        self.clients: list[Redis] = []
        self.bridges: list[RedisStreamBridge] = []
        self.clock = [T0]
        self._memory: Writes | None = None

    def open(self) -> Any:
        if self.backend == "memory":
            if self._memory is None:
                bridge = MemoryStreamBridge(self.settings, clock=lambda: self.clock[0])
                self._memory = Writes(bridge, bridge.sessions, self.clock)
            return self._memory
        assert self.redis_url is not None
        bridge = RedisStreamBridge.connect(self.settings)
        self.bridges.append(bridge)
        self.clients.append(Redis.from_url(self.redis_url))
        return Writes(bridge, session_store_for(bridge, self.settings), self.clock)

    @property
    def redis(self) -> Redis:
        if not self.clients:
            self.open()
        return self.clients[0]


@pytest.fixture(params=["memory", "redis"])
async def stores(request: pytest.FixtureRequest, key_prefix: str) -> AsyncIterator[Stores]:
    backend = str(request.param)
    url = request.getfixturevalue("redis_url") if backend == "redis" else None
    made = Stores(backend, url, key_prefix)
    try:
        yield made
    finally:
        for bridge in made.bridges:
            await bridge.close()
        for client in made.clients:
            await client.aclose()


@pytest.fixture
def store(stores: Stores) -> Any:
    return stores.open()


def sid() -> str:
    return f"s-{uuid4().hex[:10]}"


def rid() -> str:
    return f"r-{uuid4().hex[:10]}"


def message(text: str = "hello", **metadata: Any) -> dict[str, Any]:
    return {
        "messageId": f"m-{uuid4().hex[:6]}",
        "role": "user",
        "parts": [{"kind": "text", "text": text}],
        "metadata": metadata,
    }


def ids(rows: list[Any]) -> list[str]:
    return [r["session_id"] for r in rows]


async def test_both_backends_satisfy_the_protocol(store: Any) -> None:
    assert isinstance(store.store, SessionStore)


async def test_index_newest_first_with_turn_count_and_limit(stores: Stores) -> None:
    store = stores.open()
    memory = stores.backend == "memory"  # Redis keeps its own time
    with anyio.fail_after(TIMEOUT):
        sessions = [sid() for _ in range(6)]
        for i, s in enumerate(sessions):
            for j in range(i % 3 + 1):
                await store.start_turn(s, rid(), message(), T0 + i * 10 + j)
        rows = await store.list_sessions(limit=4)
        assert ids(rows) == sessions[::-1][:4]
        assert [r["turn_count"] for r in rows] == [3, 2, 1, 3]
        assert rows[0]["last_updated"] == T0 + 52 or not memory
        assert all(set(r) == {"session_id", "last_updated", "turn_count"} for r in rows)
        # activity on an old session moves it to the front
        run = rid()
        await store.start_turn(sessions[0], run, message(), T0 + 100)
        await store.apply_events(sessions[0], run, [("token", {"text": "x"})], T0 + 101)
        rows = await store.list_sessions(limit=2)
        assert ids(rows) == [sessions[0], sessions[5]]
        assert rows[0]["last_updated"] == T0 + 101 or not memory
        assert rows[0]["turn_count"] == 2
        assert ids(await store.list_sessions(limit=200)) == [sessions[0], *sessions[:0:-1]]


@pytest.mark.parametrize("bad", [0, 201, -1, True, "abc", "0"])
async def test_bad_limits_are_rejected(store: Any, bad: Any) -> None:
    with anyio.fail_after(TIMEOUT):
        with pytest.raises(InvalidInput):
            await store.list_sessions(limit=bad)
        with pytest.raises(InvalidInput):
            await store.list_turns(sid(), limit=bad)


async def test_bad_ids_are_rejected(store: Any) -> None:
    with anyio.fail_after(TIMEOUT):
        with pytest.raises(InvalidInput):
            await store.start_turn("bad id", rid(), None, T0)
        with pytest.raises(InvalidInput):
            await store.list_turns("{x}")
        with pytest.raises(InvalidInput):
            await store.apply_events(sid(), "-nope", [], T0)


async def test_parked_narrows_to_sessions_whose_newest_turn_waits(store: Any) -> None:
    with anyio.fail_after(TIMEOUT):
        asking, authing, running, older_parked, answered, ended = (sid() for _ in range(6))
        t = T0

        async def turn(s: str, *events: tuple[str, Any], end: str | None = None) -> str:
            nonlocal t
            r = rid()
            t += 1
            await store.start_turn(s, r, message(), t)
            if events:
                t += 1
                await store.apply_events(s, r, list(events), t)
            if end:
                t += 1
                await store.end_turn(s, r, end, t)
            return r

        await turn(asking, ("state", {"state": "input-required"}))
        await turn(running, ("token", "working"))
        await turn(older_parked, ("state", "input-required"))
        await turn(older_parked, ("token", "newer turn runs"))  # newest-created turn runs
        await turn(answered, ("state", "input-required"))
        await turn(answered, ("state", "running"))  # ... is running again? no: its own turn
        await turn(ended, ("status", {"state": "input-required"}), end="success")
        await turn(authing, ("status", {"state": "auth-required", "message": {"m": 1}}))

        rows = await store.list_sessions(limit=50, parked=True)
        assert ids(rows) == [authing, asking]
        assert [r["last_state"] for r in rows] == ["auth-required", "input-required"]
        assert set(rows[0]) == {"session_id", "last_updated", "turn_count", "last_state"}
        everything = await store.list_sessions(limit=50)
        assert len(everything) == 6 and "last_state" not in everything[0]

        # an OLDER turn parking later does not make the session parked (newest-created rule)
        first = (await store.list_turns(older_parked))[0]["run_id"]
        t += 1
        await store.apply_events(older_parked, first, [("state", "auth-required")], t)
        assert older_parked not in ids(await store.list_sessions(parked=True))

        # the parked turn resumes -> the session leaves the parked index
        parked_run = (await store.list_turns(asking))[0]["run_id"]
        t += 1
        await store.apply_events(asking, parked_run, [("state", "running")], t)
        assert ids(await store.list_sessions(parked=True)) == [authing]
        t += 1
        await store.apply_events(asking, parked_run, [("state", "input-required")], t)
        assert ids(await store.list_sessions(parked=True, limit=1)) == [asking]


async def test_in_flight_turn_visible_with_partial_text(stores: Stores) -> None:
    store = stores.open()
    with anyio.fail_after(TIMEOUT):
        s, r = sid(), rid()
        await store.start_turn(s, r, message("what is 2+2?", incognito=True), T0)
        await store.apply_events(s, r, [("token", {"text": "It is "}), ("token", "4")], T0 + 1)
        (turn,) = await store.list_turns(s)
        assert turn["run_id"] == r and turn["session_id"] == s
        assert turn["state"] == "running"
        assert turn["text"] == "It is 4"
        if stores.backend == "memory":  # Redis keeps its own time
            assert turn["last_updated"] == T0 + 1 and turn["created_at"] == T0
        else:
            assert turn["last_updated"] >= turn["created_at"] > T0
        assert turn["history"][0]["parts"] == [{"kind": "text", "text": "what is 2+2?"}]
        assert turn["history"][0]["metadata"] == {"incognito": True}
        await store.apply_events(s, r, [("artifact", {"artifactId": "a", "parts": []})], T0 + 2)
        await store.end_turn(s, r, "success", T0 + 3)
        (turn,) = await store.list_turns(s)
        assert turn["state"] == "success" and turn["text"] == "It is 4"
        assert turn["artifacts"] == [{"artifactId": "a", "parts": []}]
        # a second END and later events change nothing
        await store.end_turn(s, r, "error", T0 + 4)
        await store.apply_events(s, r, [("token", "late")], T0 + 5)
        assert (await store.list_turns(s))[0] == turn


async def test_status_artifacts_history_are_stored_untransformed(store: Any) -> None:
    with anyio.fail_after(TIMEOUT):
        s, r = sid(), rid()
        status = {
            "state": "working",
            "message": {"parts": [{"kind": "text", "text": "…"}]},
            "timestamp": "2026-01-01T00:00:00Z",
            "unicode": "ü\u2028",
            "n": 1.5,
        }
        artifact = {"artifactId": "x", "name": "answer", "parts": [{"kind": "data", "data": [1]}]}
        marker = {"kind": "message", "role": "user", "metadata": {"steer": True}, "parts": []}
        await store.start_turn(s, r, None, T0)
        await store.apply_events(
            s, r, [("status", status), ("artifact", artifact), ("message", marker)], T0 + 1
        )
        (turn,) = await store.list_turns(s)
        assert turn["status"] == status
        assert turn["artifacts"] == [artifact]
        assert turn["history"] == [marker]


async def test_turns_limit_and_order(store: Any) -> None:
    with anyio.fail_after(TIMEOUT):
        s = sid()
        runs = [rid() for _ in range(5)]
        for i, r in enumerate(runs):
            await store.start_turn(s, r, message(f"q{i}"), T0 + i)
        # the first turn is updated last: ordering is still by the claims' order
        await store.apply_events(s, runs[0], [("token", "late answer")], T0 + 10)
        got = await store.list_turns(s, limit=3)
        assert [t["run_id"] for t in got] == runs[2:]
        assert [t["order"] for t in got] == [3, 4, 5]
        assert len(await store.list_turns(s, limit=200)) == 5
        assert await store.list_turns(sid()) == []


async def test_start_turn_is_idempotent(store: Any) -> None:
    with anyio.fail_after(TIMEOUT):
        s, r = sid(), rid()
        await store.start_turn(s, r, message("first"), T0)
        await store.apply_events(s, r, [("token", "partial")], T0 + 1)
        await store.start_turn(s, r, message("takeover"), T0 + 2)  # e.g. a takeover claim
        (turn,) = await store.list_turns(s)
        assert turn["text"] == "partial"
        assert turn["history"][0]["parts"][0]["text"] == "first"


@pytest.mark.parametrize(
    "raw, expected_history",
    [
        (message("machine", origin="scheduler"), []),  # server-fired: stores none
        ({"role": "user", "parts": "not a list"}, []),  # unshapeable: not stored
        (None, []),
        (
            message("x", hidden=True, incognito=True),
            [
                {
                    "kind": "message",
                    "role": "user",
                    "parts": [],
                    "metadata": {"hidden": True, "incognito": True},
                }
            ],
        ),
    ],
)
async def test_turn_runs_whatever_the_message(
    store: Any, raw: Any, expected_history: list[Any]
) -> None:
    with anyio.fail_after(TIMEOUT):
        s, r = sid(), rid()
        assert await store.start_turn(s, r, raw, T0)
        await store.apply_events(s, r, [("token", "answer")], T0 + 1)
        (turn,) = await store.list_turns(s)
        assert turn["text"] == "answer"
        history = turn["history"]
        for h in history:
            h.pop("messageId", None)
        assert history == expected_history


async def test_shaping_applies_in_the_store(store: Any) -> None:
    with anyio.fail_after(TIMEOUT):
        s, r = sid(), rid()
        raw = {
            "messageId": "m",
            "role": "user",
            "parts": [
                {"kind": "text", "text": "y" * 20_000},
                {"kind": "file", "file": {"name": "a", "bytes": "QUJD"}},
            ],
            "metadata": {"display": "shown text", "secret": 1},
        }
        await store.start_turn(s, r, raw, T0)
        (turn,) = await store.list_turns(s)
        assert turn["history"] == [
            {
                "kind": "message",
                "messageId": "m",
                "role": "user",
                "parts": [
                    {"kind": "text", "text": "shown text"},
                    {"kind": "file", "file": {"name": "a", "omittedBytes": 3}},
                ],
            }
        ]


async def test_readers_get_detached_copies(store: Any) -> None:
    with anyio.fail_after(TIMEOUT):
        s, r = sid(), rid()
        artifact: dict[str, Any] = {"artifactId": "a", "parts": []}
        await store.start_turn(s, r, None, T0)
        await store.apply_events(s, r, [("artifact", artifact)], T0 + 1)
        artifact["parts"].append("producer mutated")
        (turn,) = await store.list_turns(s)
        turn["artifacts"].append("reader mutated")
        assert (await store.list_turns(s))[0]["artifacts"] == [{"artifactId": "a", "parts": []}]


async def test_retire_excludes_late_producer_writes_forever(stores: Stores) -> None:
    with anyio.fail_after(TIMEOUT):
        store = stores.open()
        s, r, other = sid(), rid(), sid()
        await store.start_turn(s, r, message(), T0)
        await store.apply_events(s, r, [("token", "partial")], T0 + 1)
        await store.start_turn(other, rid(), message(), T0 + 2)
        assert await store.delete_session(s, retire=True) == [r]
        assert await store.is_retired(s)

        # the in-flight producer keeps saving: every write is dropped
        assert not await store.apply_events(s, r, [("token", " more")], T0 + 3)
        assert not await store.end_turn(s, r, "success", T0 + 4)
        assert not await store.start_turn(s, rid(), message(), T0 + 5)
        assert not await store.apply_events(s, rid(), [("state", "input-required")], T0 + 6)

        for reader in (store, stores.open()):  # the same store, then a "restarted" gateway
            assert await reader.is_retired(s)
            assert await reader.list_turns(s) == []
            assert ids(await reader.list_sessions()) == [other]
            assert ids(await reader.list_sessions(parked=True)) == []
            assert not await reader.apply_events(s, r, [("token", "x")], T0 + 7)
        assert await store.delete_session(s, retire=True) == []  # idempotent
        assert not await store.is_retired(other)


async def test_retire_races_a_concurrent_producer(stores: Stores) -> None:
    with anyio.fail_after(TIMEOUT):
        store = stores.open()
        for round_ in range(10):
            s, r = sid(), rid()
            await store.start_turn(s, r, message(), T0 + round_)

            async def produce(s: str = s, r: str = r) -> None:
                for i in range(20):
                    await store.apply_events(s, r, [("token", f"{i} ")], T0 + 100 + i)
                    await store.apply_events(s, r, [("state", "input-required")], T0 + 200 + i)

            async with anyio.create_task_group() as tg:
                tg.start_soon(produce)
                tg.start_soon(store.delete_session, s, True)
            await produce()  # and some more, strictly after the retire
            for reader in (store, stores.open()):
                assert await reader.list_turns(s) == []
                assert s not in ids(await reader.list_sessions(limit=200))
                assert s not in ids(await reader.list_sessions(limit=200, parked=True))


async def test_clear_refused_while_a_turn_runs(store: Any) -> None:
    with anyio.fail_after(TIMEOUT):
        s, r1, r2 = sid(), rid(), rid()
        await store.start_turn(s, r1, message(), T0)
        await store.end_turn(s, r1, "success", T0 + 1)
        await store.start_turn(s, r2, message(), T0 + 2)
        await store.apply_events(s, r2, [("token", "streaming")], T0 + 3)
        with pytest.raises(SessionActive) as info:
            await store.delete_session(s, retire=False)
        assert info.value.code == "session_active"
        assert len(await store.list_turns(s)) == 2  # nothing deleted
        assert ids(await store.list_sessions()) == [s]

        await store.end_turn(s, r2, "cancelled", T0 + 4)
        assert sorted(await store.delete_session(s, retire=False)) == sorted([r1, r2])
        assert await store.list_turns(s) == []
        assert s not in ids(await store.list_sessions())
        assert not await store.is_retired(s)

        # the id stays usable
        r3 = rid()
        assert await store.start_turn(s, r3, message("again"), T0 + 5)
        assert [t["run_id"] for t in await store.list_turns(s)] == [r3]
        assert ids(await store.list_sessions()) == [s]


async def test_clear_allowed_while_parked(store: Any) -> None:
    with anyio.fail_after(TIMEOUT):
        s, r = sid(), rid()
        await store.start_turn(s, r, message(), T0)
        await store.apply_events(s, r, [("state", "input-required")], T0 + 1)
        assert ids(await store.list_sessions(parked=True)) == [s]
        assert await store.delete_session(s, retire=False) == [r]
        assert await store.list_sessions(parked=True) == []
        assert await store.list_sessions() == []


async def test_clear_and_retire_of_unknown_session(store: Any) -> None:
    with anyio.fail_after(TIMEOUT):
        assert await store.delete_session(sid(), retire=False) == []
        s = sid()
        assert await store.delete_session(s, retire=True) == []
        assert not await store.start_turn(s, rid(), message(), T0)
        assert await store.list_sessions() == []


# -- retention ---------------------------------------------------------------------------------


async def test_memory_retention_follows_runs_and_spares_parked() -> None:
    with anyio.fail_after(TIMEOUT):
        clock = [T0]
        settings = Settings(stream_ttl_seconds=100, ended_ttl_seconds=10)
        bridge = MemoryStreamBridge(settings, clock=lambda: clock[0])
        store = Writes(bridge, bridge.sessions, clock)
        s = sid()
        done, parked, running = rid(), rid(), rid()
        for i, r in enumerate((done, parked, running)):
            await store.start_turn(s, r, message(), T0 + i)
        await store.end_turn(s, done, "success", T0 + 3)
        await store.apply_events(s, parked, [("state", "auth-required")], T0 + 4)
        clock[0] += 11
        assert {t["run_id"] for t in await store.list_turns(s)} == {parked, running}
        assert (await store.list_sessions())[0]["turn_count"] == 2
        clock[0] += 100
        assert [t["run_id"] for t in await store.list_turns(s)] == [parked]
        clock[0] += 10**9
        assert [t["run_id"] for t in await store.list_turns(s)] == [parked]
        await store.end_turn(s, parked, "success", clock[0])
        clock[0] += 11
        assert await store.list_turns(s) == []
        assert await store.list_sessions() == []
        await bridge.close()


def redis_only(stores: Stores) -> None:
    if stores.backend != "redis":
        pytest.skip("Redis-specific")


async def test_redis_ttls_follow_run_retention(stores: Stores) -> None:
    redis_only(stores)
    with anyio.fail_after(TIMEOUT):
        store = stores.open()
        r_ = stores.redis
        s = sid()
        prefix = stores.settings.redis_key_prefix
        keys = session_keys(prefix, s)
        done, parked, running = rid(), rid(), rid()
        for i, r in enumerate((done, parked, running)):
            await store.start_turn(s, r, message(), T0 + i)
        await store.apply_events(s, running, [("token", "x")], T0 + 3)
        await store.end_turn(s, done, "success", T0 + 3)
        await store.apply_events(s, parked, [("state", "input-required")], T0 + 4)
        stream_ms = stores.settings.stream_ttl_seconds * 1000
        ended_ms = stores.settings.ended_ttl_seconds * 1000
        turn = {r: run_keys(prefix, r) for r in (done, parked, running)}
        await store.list_turns(s)  # (a read writes the text a token left in the log)
        assert 0 < await r_.pttl(turn[done].turn) <= max(ended_ms, stream_ms)
        assert ended_ms < await r_.pttl(turn[running].turn) <= stream_ms
        assert ended_ms < await r_.pttl(turn[running].text) <= stream_ms
        assert await r_.pttl(turn[parked].turn) == -1  # parked: never swept
        for key in (keys.meta, keys.order):
            assert await r_.pttl(key) == -1  # the session lives as long as its parked turn
        await store.apply_events(s, parked, [("state", "running")], T0 + 5)
        assert ended_ms < await r_.pttl(turn[parked].turn) <= stream_ms  # unparked: swept
        # a retired session's tombstone never expires
        await store.delete_session(s, retire=True)
        assert await r_.pttl(keys.tomb) == -1
        assert not await r_.exists(turn[running].turn, turn[running].text)  # records gone


async def test_redis_gone_turns_are_dropped_lazily(stores: Stores) -> None:
    redis_only(stores)
    with anyio.fail_after(TIMEOUT):
        store = stores.open()
        r_ = stores.redis
        prefix = stores.settings.redis_key_prefix
        s, gone, kept = sid(), rid(), rid()
        keys = session_keys(prefix, s)
        await store.start_turn(s, gone, message(), T0)
        await store.start_turn(s, kept, message(), T0 + 1)
        await r_.delete(run_keys(prefix, gone).turn)  # what PEXPIRE does when its time comes
        assert [t["run_id"] for t in await store.list_turns(s)] == [kept]
        # (an entry without a record is a claim between its steps while it is young)
        assert await r_.zscore(keys.order, gone) == 1
        await r_.hset(keys.meta, f"c:{gone}", "1")
        assert [t["run_id"] for t in await store.list_turns(s)] == [kept]
        assert await r_.zscore(keys.order, gone) is None  # pruned
        assert (await store.list_sessions())[0]["turn_count"] == 1


async def test_redis_a_claim_between_its_steps_is_waited_for_not_passed(
    stores: Stores,
) -> None:
    """A claim takes its order (session slot), then opens its record (run slot): a
    reader between the two must neither prune the entry nor page past it."""
    redis_only(stores)
    with anyio.fail_after(TIMEOUT):
        store = stores.open()
        r_ = stores.redis
        prefix = stores.settings.redis_key_prefix
        s, first, pending, later = sid(), rid(), rid(), rid()
        keys = session_keys(prefix, s)
        await store.start_turn(s, first, message(), T0)
        await store.start_turn(s, pending, message(), T0 + 1)
        await store.start_turn(s, later, message(), T0 + 2)
        await r_.delete(run_keys(prefix, pending).turn)  # as if its claim.lua had not run
        assert [t["run_id"] for t in await store.turns_after(s, 1, 10)] == []  # waits
        assert [t["run_id"] for t in await store.list_turns(s)] == [first, later]
        assert await r_.zscore(keys.order, pending) == 2  # not pruned
        await store.end_turn(s, first, "success", T0 + 3)
        await store.end_turn(s, later, "success", T0 + 4)
        with pytest.raises(SessionActive):  # a turn being claimed is about to run
            await store.delete_session(s, retire=False)
        await r_.hset(keys.meta, f"c:{pending}", "1")  # claimed long ago: it is gone
        assert [t["run_id"] for t in await store.turns_after(s, 1, 10)] == [later]
        assert await r_.zscore(keys.order, pending) is None


async def test_redis_stale_index_rows_are_never_returned(stores: Stores) -> None:
    """A late index touch after a retire (the writer's index step lost the race)."""
    redis_only(stores)
    with anyio.fail_after(TIMEOUT):
        store = stores.open()
        prefix = stores.settings.redis_key_prefix
        idx = index_keys(prefix)
        live = [sid() for _ in range(3)]
        for i, s in enumerate(live):
            await store.start_turn(s, rid(), message(), T0 + i)
        retired = [sid() for _ in range(8)]
        for s in retired:
            await store.start_turn(s, rid(), message(), T0 + 50)
            await store.delete_session(s, retire=True)
            # a late, stale touch (newer than any real one: the index reads it first)
            await stores.redis.zadd(idx.by_activity, {s: 4e9})
            await stores.redis.zadd(idx.parked, {s: 4e9})
        rows = await stores.open().list_sessions(limit=2)
        assert ids(rows) == [live[2], live[1]]
        assert await stores.open().list_sessions(parked=True) == []
        remaining = {m.decode() for m in await stores.redis.zrange(idx.by_activity, 0, -1)}
        assert remaining == set(live)
        assert await stores.redis.zcard(idx.parked) == 0


async def test_redis_survives_script_flush(stores: Stores) -> None:
    redis_only(stores)
    with anyio.fail_after(TIMEOUT):
        store = stores.open()
        s, r = sid(), rid()
        await store.start_turn(s, r, message(), T0)
        await stores.redis.script_flush()
        await store.apply_events(s, r, [("token", "after flush")], T0 + 1)
        await stores.redis.script_flush()
        assert ids(await store.list_sessions()) == [s]
        await stores.redis.script_flush()
        assert (await store.list_turns(s))[0]["text"] == "after flush"
        await stores.redis.script_flush()
        await store.end_turn(s, r, "success", T0 + 2)
        await stores.redis.script_flush()
        assert await store.delete_session(s, retire=False) == [r]


async def test_session_rows_for_a_scoped_reader(store: Any) -> None:
    with anyio.fail_after(TIMEOUT):
        a, b, c, retired = sid(), sid(), sid(), sid()
        for i, s in enumerate((a, b, c, retired)):
            await store.start_turn(s, rid(), message(), T0 + i)
        await store.apply_events(
            a, (await store.list_turns(a))[0]["run_id"], [("state", "input-required")], T0 + 10
        )
        await store.delete_session(retired, retire=True)
        rows = await store.session_rows([b, a, retired, sid()])
        assert ids(rows) == [a, b]
        assert "last_state" not in rows[0]
        parked = await store.session_rows([a, b, c], parked=True)
        assert ids(parked) == [a] and parked[0]["last_state"] == "input-required"
        assert await store.session_rows([]) == []


@pytest.mark.cluster
async def test_redis_cluster_smoke(redis_cluster: Any, key_prefix: str) -> None:
    """Every session and run script is single-slot (records in their runs' slots, the
    order in the session's); the index reads span nodes."""
    url = redis_cluster.url.replace("redis://", "redis+cluster://", 1)
    settings = Settings(redis_url=url, redis_key_prefix=key_prefix)
    with anyio.fail_after(60):
        async with open_bridge(settings) as bridge:
            store = Writes(bridge, session_store_for(bridge, settings), [T0])
            sessions = [sid() for _ in range(12)]
            for i, s in enumerate(sessions):
                r = rid()
                await store.start_turn(s, r, message(), T0 + i)
                await store.apply_events(s, r, [("state", "input-required")], T0 + i + 0.5)
            assert ids(await store.list_sessions(limit=5)) == sessions[::-1][:5]
            assert len(await store.list_sessions(limit=50, parked=True)) == 12
            assert len(await store.session_rows(sessions[:4])) == 4
            assert len(await store.list_turns(sessions[0])) == 1
            assert len(await store.delete_session(sessions[0], retire=False)) == 1
            assert len(await store.delete_session(sessions[1], retire=True)) == 1
            assert not await store.start_turn(sessions[1], rid(), message(), T0 + 99)
            assert len(await store.list_sessions(limit=50)) == 10


async def test_running_turn_is_the_newest_turn_until_it_ends(store: Any) -> None:
    """What the ui-stream replays: the newest-created turn while it has not ended."""
    with anyio.fail_after(TIMEOUT):
        s = sid()
        assert await store.running_turn(s) is None  # no such session
        first, second = rid(), rid()
        await store.start_turn(s, first, message(), T0)
        assert await store.running_turn(s) == first
        await store.start_turn(s, second, message(), T0 + 1)
        assert await store.running_turn(s) == second
        await store.end_turn(s, first, "success", T0 + 2)  # an older turn ending: no change
        assert await store.running_turn(s) == second
        await store.apply_events(s, second, [("state", "input-required")], T0 + 3)
        assert await store.running_turn(s) == second  # parked: its run is still open
        await store.apply_events(s, second, [("ui", {"type": "text-delta", "delta": "x"})], T0 + 4)
        await store.end_turn(s, second, "error", T0 + 5)
        assert await store.running_turn(s) is None
        (_, turn) = await store.list_turns(s)
        assert turn["text"] == "x"
        await store.delete_session(s, retire=True)
        assert await store.running_turn(s) is None
