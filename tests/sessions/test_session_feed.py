"""The session feed (`GET /v1/sessions/{id}/stream`) on a real server, memory and Redis:
turns in order with `turn` / events / `turn_end`, session cursors that resume exactly,
turns started while the reader was away, retirement, a gap inside a turn, scoped tokens,
and (Redis) a thousand feeds on one process within a bounded number of connections."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import anyio
import httpx
import pytest

from gateway.bridge.memory import MemoryStreamBridge
from gateway.bridge.provider import open_bridge
from gateway.http.edge.auth import mint_subscriber_token
from gateway.sessions.feed import TurnOpened, follow_session
from gateway.sessions.memory import MemorySessionStore
from gateway.settings import Settings
from gateway.values import StreamEvent
from tests.support import http_server
from tests.support.http_server import ProducerClient, RunningServer, make_settings, serve
from tests.support.redis_servers import RedisServer
from tests.support.sse_client import Frame, iter_frames

gateway_server = http_server.gateway_server
client = http_server.client

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

TIMEOUT = 20.0
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
MESSAGE = {"messageId": "m-1", "role": "user", "parts": [{"kind": "text", "text": "hi"}]}


class Feed:
    """One open session feed, read by a task into a queue of frames."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.frames: asyncio.Queue[Frame | None] = asyncio.Queue()
        self.seen: list[Frame] = []

    async def pump(self) -> None:
        try:
            async for frame in iter_frames(self.response):
                await self.frames.put(frame)
        except (httpx.HTTPError, anyio.ClosedResourceError):
            pass
        finally:
            await self.frames.put(None)

    async def next(self) -> Frame | None:
        """The next frame that is an event (comments and the retry hint skipped);
        None when the response ended."""
        while True:
            frame = await self.frames.get()
            if frame is None:
                return None
            self.seen.append(frame)
            if frame.is_event:
                return frame

    async def events(self, count: int) -> list[Frame]:
        out = []
        for _ in range(count):
            frame = await self.next()
            assert frame is not None, [f.event for f in out]
            out.append(frame)
        return out

    async def heartbeat(self) -> None:
        while True:
            frame = await self.frames.get()
            assert frame is not None and not frame.is_event, frame
            if b"heartbeat" in frame.comments:
                return


@contextlib.asynccontextmanager
async def open_feed(
    client: httpx.AsyncClient,
    session_id: str,
    cursor: str | None = None,
    **params: str,
) -> AsyncIterator[Feed]:
    headers = {"Last-Event-ID": cursor} if cursor is not None else {}
    async with client.stream(
        "GET", f"/v1/sessions/{session_id}/stream", headers=headers, params=params
    ) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        feed = Feed(response)
        async with anyio.create_task_group() as tg:
            tg.start_soon(feed.pump)
            yield feed
            tg.cancel_scope.cancel()


async def turn(
    client: httpx.AsyncClient,
    session_id: str,
    run_id: str,
    texts: list[str],
    *,
    end: bool = True,
) -> tuple[ProducerClient, list[str]]:
    producer = await ProducerClient.claim(
        client, run_id=run_id, session_id=session_id, input_message=MESSAGE
    )
    ids = []
    for text in texts:
        ids += await producer.publish(("token", {"text": text}))
    if end:
        await producer.end()
    return producer, ids


def assert_turn(frame: Frame, run_id: str) -> None:
    assert (frame.event, frame.id) == ("turn", f"{run_id}/0-0")
    data = frame.json()
    assert data["run_id"] == run_id
    assert data["input_message"]["messageId"] == "m-1"
    assert data["input_message"]["role"] == "user"


def assert_events(frames: list[Frame], run_id: str, ids: list[str], texts: list[str]) -> None:
    assert [f.event for f in frames] == ["token"] * len(ids)
    assert [f.id for f in frames] == [f"{run_id}/{i}" for i in ids]
    assert [f.json() for f in frames] == [{"text": t} for t in texts]


def assert_turn_end(frame: Frame, run_id: str, status: str = "success") -> None:
    assert (frame.event, frame.id) == ("turn_end", f"{run_id}/end")
    assert frame.json() == {"run_id": run_id, "status": status}


async def test_two_turns_in_sequence(
    client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    with anyio.fail_after(TIMEOUT):
        async with open_feed(client, "s2") as feed:
            await feed.heartbeat()  # no turn yet: the feed waits, heartbeating
            _, ids1 = await turn(client, "s2", "s2-r1", ["a", "b"])
            first = await feed.events(4)
            assert_turn(first[0], "s2-r1")
            assert_events(first[1:3], "s2-r1", ids1, ["a", "b"])
            assert_turn_end(first[3], "s2-r1")
            await feed.heartbeat()  # between turns: still open, heartbeating
            # a new turn while the feed waits: the session's change signal wakes it
            producer, ids2 = await turn(client, "s2", "s2-r2", ["c"], end=False)
            second = await feed.events(2)
            assert_turn(second[0], "s2-r2")
            assert_events(second[1:], "s2-r2", ids2, ["c"])
            ids2 += await producer.publish(("token", {"text": "d"}))
            await producer.end("error", {"message": "boom"})
            tail = await feed.events(2)
            assert_events(tail[:1], "s2-r2", ids2[1:], ["d"])
            assert (tail[1].event, tail[1].id) == ("turn_end", "s2-r2/end")
            assert tail[1].json() == {
                "run_id": "s2-r2",
                "status": "error",
                "error": {"message": "boom"},
            }
        gateway_server.wait_open_sse(0)


async def test_no_cursor_starts_at_the_running_turn_from_its_first_event(
    client: httpx.AsyncClient,
) -> None:
    with anyio.fail_after(TIMEOUT):
        await turn(client, "s1", "s1-old", ["old"])
        producer, ids = await turn(client, "s1", "s1-live", ["x", "y"], end=False)
        async with open_feed(client, "s1") as feed:
            frames = await feed.events(3)
            assert_turn(frames[0], "s1-live")
            assert_events(frames[1:], "s1-live", ids, ["x", "y"])
            await producer.end()
            assert_turn_end((await feed.events(1))[0], "s1-live")


async def test_reconnect_mid_turn_resumes_exactly(client: httpx.AsyncClient) -> None:
    with anyio.fail_after(TIMEOUT):
        producer, ids = await turn(client, "s3", "s3-r1", ["a", "b"], end=False)
        async with open_feed(client, "s3") as feed:
            frames = await feed.events(3)
        cursor = frames[-1].id
        assert cursor == f"s3-r1/{ids[1]}"
        ids += await producer.publish(("token", {"text": "c"}))
        ids += await producer.publish(("token", {"text": "d"}))
        await producer.end()
        # the header, and the query parameter an EventSource-less client may use
        for how in ("header", "query"):
            if how == "header":
                ctx = open_feed(client, "s3", cursor)
            else:
                ctx = open_feed(client, "s3", last_event_id=cursor or "")
            async with ctx as feed:
                rest = await feed.events(3)
                assert_events(rest[:2], "s3-r1", ids[2:], ["c", "d"])
                assert_turn_end(rest[2], "s3-r1")
        # resuming right after the `turn` frame replays the run from its first event
        async with open_feed(client, "s3", "s3-r1/0-0") as feed:
            again = await feed.events(5)
            assert_events(again[:4], "s3-r1", ids, ["a", "b", "c", "d"])
            assert_turn_end(again[4], "s3-r1")


async def test_a_turn_that_starts_while_the_reader_is_away(
    client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    with anyio.fail_after(TIMEOUT):
        async with open_feed(client, "s4") as feed:
            await feed.heartbeat()
            await turn(client, "s4", "s4-r1", ["a"])
            frames = await feed.events(3)
        assert frames[-1].id == "s4-r1/end"
        gateway_server.wait_open_sse(0)
        _, ids = await turn(client, "s4", "s4-r2", ["b", "c"])
        _, ids3 = await turn(client, "s4", "s4-r3", ["d"])
        async with open_feed(client, "s4", "s4-r1/end") as feed:
            got = await feed.events(7)
        assert_turn(got[0], "s4-r2")
        assert_events(got[1:3], "s4-r2", ids, ["b", "c"])
        assert_turn_end(got[3], "s4-r2")
        assert_turn(got[4], "s4-r3")
        assert_events(got[5:6], "s4-r3", ids3, ["d"])
        assert_turn_end(got[6], "s4-r3")


async def test_retirement_ends_the_feed_and_a_reconnect_stops(
    client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    with anyio.fail_after(TIMEOUT):
        await turn(client, "s5", "s5-r1", ["a"])
        producer, _ = await turn(client, "s5", "s5-r2", ["b"], end=False)
        async with open_feed(client, "s5") as inside, open_feed(client, "s5", "s5-r2/end") as idle:
            assert [f.event for f in await inside.events(2)] == ["turn", "token"]
            await idle.heartbeat()  # waiting for a turn after s5-r2
            res = await client.delete("/v1/sessions/s5")
            assert res.status_code == 200
            for feed in (inside, idle):
                (end,) = await feed.events(1)
                assert (end.event, end.id) == ("end", "retired")
                assert end.json() == {"status": "retired", "session_id": "s5"}
                assert await feed.next() is None  # the response ended
        gateway_server.wait_open_sse(0)
        # an EventSource reconnects with the `end` frame's id: told to stop (204)
        res = await client.get("/v1/sessions/s5/stream", headers={"Last-Event-ID": "retired"})
        assert res.status_code == 204
        # a fresh reader of a retired session gets the `end` at once
        async with open_feed(client, "s5") as feed:
            (end,) = await feed.events(1)
            assert (end.event, end.id) == ("end", "retired")
        # a late save of the retired session's producer never becomes a turn
        res = await client.post(
            f"/v1/runs/{producer.run_id}/events",
            json={"event": "token", "data": "late"},
            headers={"X-Producer-Token": producer.token},
        )
        assert res.status_code in (200, 409)


@pytest.mark.gateway_settings(max_events_per_run=3)
async def test_a_gap_inside_a_turn_ends_the_feed(
    client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    with anyio.fail_after(TIMEOUT):
        producer, ids = await turn(client, "s6", "s6-r1", ["a"], end=False)
        async with open_feed(client, "s6") as feed:
            frames = await feed.events(2)
        cursor = frames[-1].id
        assert cursor == f"s6-r1/{ids[0]}"
        for i in range(10):
            ids += await producer.publish(("token", {"text": str(i)}))
        async with open_feed(client, "s6", cursor) as feed:
            (gap,) = await feed.events(1)
            assert await feed.next() is None  # the feed ends after the gap
        assert (gap.event, gap.id) == ("gap", "s6-r1/gap")
        data = gap.json()
        assert data["code"] == "stream_replay_gap"
        assert data["run_id"] == "s6-r1" and data["session_id"] == "s6"
        assert data["requested_event_id"] == ids[0]
        assert data["reason"] == "trimmed"
        assert data["latest_available_event_id"] == ids[-1]
        assert data["recovery"] == "reload_durable_state"
        # the client's automatic reconnect with the gap's id is told to stop
        res = await client.get("/v1/sessions/s6/stream", headers={"Last-Event-ID": "s6-r1/gap"})
        assert res.status_code == 204
        # rejoining after reloading the turns: the rest of the turn from the newest event
        await producer.end()
        async with open_feed(client, "s6", f"s6-r1/{data['latest_available_event_id']}") as feed:
            assert_turn_end((await feed.events(1))[0], "s6-r1")
        gateway_server.wait_open_sse(0)


async def test_resuming_inside_a_turn_whose_log_is_gone_is_a_gap(
    client: httpx.AsyncClient,
) -> None:
    """PROTOCOL §7: the same answer as the run stream with the same cursor (its bounds and
    `stream_removed`), never a bare `turn_end` that reads as "nothing was missed"."""
    with anyio.fail_after(TIMEOUT):
        _, ids = await turn(client, "s8", "s8-r1", ["a", "b"])
        assert (await client.delete("/v1/runs/s8-r1")).status_code == 204
        for position in ("0-0", ids[0]):
            async with open_feed(client, "s8", f"s8-r1/{position}") as feed:
                (frame,) = await feed.events(1)
                assert (frame.event, frame.id) == ("gap", "s8-r1/gap")
                data = frame.json()
                assert data["reason"] == "stream_removed" and data["run_id"] == "s8-r1"
                assert data["requested_event_id"] == position
                assert await feed.next() is None  # the feed ends at the gap
            run = await client.get("/v1/runs/s8-r1/stream", headers={"Last-Event-ID": position})
            assert "stream_removed" in run.text


async def test_a_turn_whose_producer_died_is_ended_by_the_liveness_monitor(
    client: httpx.AsyncClient,
) -> None:
    """The feed's current run is watched like a run with a reader: its lapsed lease gets
    the recovery END, so the feed is never stuck on a dead producer's turn."""
    with anyio.fail_after(TIMEOUT):
        producer = await ProducerClient.claim(
            client, run_id="s9-r1", session_id="s9", input_message=MESSAGE, lease_seconds=0.5
        )
        await producer.publish(("token", {"text": "a"}))
        async with open_feed(client, "s9") as feed:
            frames = await feed.events(3)  # the producer is gone: no END from it
        assert [f.event for f in frames] == ["turn", "token", "turn_end"]
        assert frames[2].json() == {"run_id": "s9-r1", "status": "producer_lost"}


@pytest.mark.gateway_settings(max_events_per_run=3)
async def test_a_running_turn_whose_start_was_trimmed_is_a_gap_not_a_partial_turn(
    client: httpx.AsyncClient,
) -> None:
    with anyio.fail_after(TIMEOUT):
        _, ids = await turn(client, "s10", "s10-r1", [str(i) for i in range(10)], end=False)
        async with open_feed(client, "s10") as feed:
            opened, gap = await feed.events(2)
            assert await feed.next() is None
        assert_turn(opened, "s10-r1")
        assert (gap.event, gap.id) == ("gap", "s10-r1/gap")
        assert gap.json()["reason"] == "trimmed"
        assert gap.json()["requested_event_id"] == "0-0"
        assert gap.json()["latest_available_event_id"] == ids[-1]


async def test_cursor_errors_and_foreign_runs(client: httpx.AsyncClient) -> None:
    with anyio.fail_after(TIMEOUT):
        await turn(client, "other", "o-r1", ["secret"])
        for bad in ("1764470000000-0", "r1/", "/1-0", "r 1/1-0", "r1/1-x", "r1/-1-0", "x" * 300):
            res = await client.get("/v1/sessions/s7/stream", headers={"Last-Event-ID": bad})
            assert res.status_code == 422, bad
            assert res.json()["error"] == "malformed_cursor"
        # a run of another session reads as a run that is gone: a gap, nothing of it
        async with open_feed(client, "s7", "o-r1/0-0") as feed:
            (gap,) = await feed.events(1)
            assert gap.event == "gap" and gap.json()["reason"] == "stream_removed"
            assert gap.json()["latest_available_event_id"] is None


async def test_tokens_scoped_to_the_session_read_it_run_tokens_do_not(
    key_prefix: str,
) -> None:
    settings = make_settings("memory", None, key_prefix, api_keys=("k",), jwt_secret="j" * 32)
    with serve(settings) as srv, anyio.fail_after(TIMEOUT):
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as c:
            producer = await ProducerClient.claim(
                httpx.AsyncClient(
                    base_url=srv.base_url, headers={"Authorization": "Bearer k"}, timeout=10
                ),
                run_id="t-r1",
                session_id="st",
            )
            await producer.publish(("token", {"text": "x"}))
            session_token = mint_subscriber_token("j" * 32, sessions=["st"])
            run_token = mint_subscriber_token("j" * 32, runs=["t-r1"])
            other = mint_subscriber_token("j" * 32, sessions=["elsewhere"])
            async with open_feed(c, "st", access_token=session_token) as feed:
                assert [f.event for f in await feed.events(2)] == ["turn", "token"]
            for token in (run_token, other):
                res = await c.get("/v1/sessions/st/stream", params={"access_token": token})
                assert res.status_code == 403
                assert res.json()["error"] == "forbidden"
            res = await c.get("/v1/sessions/st/stream")
            assert res.status_code == 401
            await producer.client.aclose()


# ------------------------------------------------------------------- 1,000 feeds, Redis


async def _raw_feed(port: int, session_id: str) -> tuple[asyncio.StreamReader, Any]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = f"GET /v1/sessions/{session_id}/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    writer.write(request.encode())
    await writer.drain()
    head = await reader.readuntil(b"retry: ")
    assert head.startswith(b"HTTP/1.1 200"), head[:80]
    return reader, writer


async def _until(reader: asyncio.StreamReader, marker: bytes) -> None:
    await reader.readuntil(marker)


def _gateway_clients(server: RedisServer) -> int:
    with server.client() as admin:
        me = admin.client_id()
        return sum(1 for c in admin.client_list() if int(c["id"]) != me)


@pytest.mark.timeout(180)
async def test_a_thousand_feeds_hold_a_bounded_number_of_redis_connections(
    fresh_redis: RedisServer, key_prefix: str
) -> None:
    feeds, sessions = 1000, 20
    settings = make_settings(
        "redis", fresh_redis.url, key_prefix, redis_max_connections=8, heartbeat_interval_seconds=5
    )
    with serve(settings, "redis") as srv:
        port = int(srv.base_url.rsplit(":", 1)[1])
        opened: list[tuple[asyncio.StreamReader, Any]] = []
        try:
            with anyio.fail_after(120):
                for start in range(0, feeds, 100):
                    opened += await asyncio.gather(
                        *(
                            _raw_feed(port, f"many-{i % sessions}")
                            for i in range(start, start + 100)
                        )
                    )
                srv.wait_open_sse(feeds, timeout=30)
                idle = _gateway_clients(fresh_redis)
                # the command pool, plus the one pub/sub connection; not one per feed
                assert idle <= settings.redis_max_connections + 1, idle
                # one turn in every session reaches every feed of it (through the
                # session channels on that one pub/sub connection)
                async with httpx.AsyncClient(base_url=srv.base_url, timeout=20) as c:
                    for s in range(sessions):
                        await turn(c, f"many-{s}", f"many-{s}-r1", ["hello"])
                await asyncio.gather(*(_until(r, b"event: turn_end") for r, _ in opened))
                busy = _gateway_clients(fresh_redis)
                assert busy <= settings.redis_max_connections + 1, busy
                ARTIFACTS.mkdir(exist_ok=True)
                (ARTIFACTS / "session_feed_redis.json").write_text(
                    json.dumps(
                        {
                            "feeds": feeds,
                            "sessions": sessions,
                            "redis_max_connections": settings.redis_max_connections,
                            "redis_clients_idle": idle,
                            "redis_clients_after_a_turn_each": busy,
                        }
                    )
                )
        finally:
            for _, writer in opened:
                writer.close()
            # (the sockets close on this loop: wait for the server from a thread)
            await anyio.to_thread.run_sync(lambda: srv.wait_open_sse(0, timeout=30))


@pytest.mark.cluster
@pytest.mark.timeout(180)
async def test_on_a_redis_cluster_turns_and_retirement_reach_the_feed(
    redis_cluster: Any, key_prefix: str
) -> None:
    """Session channels are shard channels, published from scripts on the session's
    shard and heard by the notifier's connection to that shard's node."""
    url = redis_cluster.url.replace("redis://", "redis+cluster://", 1)
    with serve(make_settings("redis", url, key_prefix), "redis") as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as c:
            with anyio.fail_after(60):
                async with open_feed(c, "cs") as feed:
                    await feed.heartbeat()
                    _, ids1 = await turn(c, "cs", "cs-r1", ["a"])
                    got = await feed.events(3)
                    assert_turn(got[0], "cs-r1")
                    assert_events(got[1:2], "cs-r1", ids1, ["a"])
                    assert_turn_end(got[2], "cs-r1")
                    await feed.heartbeat()
                    _, ids2 = await turn(c, "cs", "cs-r2", ["b"])
                    got = await feed.events(3)
                    assert_turn(got[0], "cs-r2")
                    assert_events(got[1:2], "cs-r2", ids2, ["b"])
                    assert_turn_end(got[2], "cs-r2")
                    await feed.heartbeat()
                    assert (await c.delete("/v1/sessions/cs")).status_code == 200
                    (end,) = await feed.events(1)
                    assert (end.event, end.id) == ("end", "retired")


class CountingStore(MemorySessionStore):
    """The memory store, counting the reads of "the next turn" the feeds make."""

    reads = 0

    async def turns_after(
        self, session_id: str, after: int, limit: int = 50
    ) -> list[dict[str, Any]]:
        self.reads += 1
        return await super().turns_after(session_id, after, limit)


async def test_feeds_of_one_session_share_the_turn_reads_a_new_turn_causes() -> None:
    settings = Settings(heartbeat_interval_seconds=5)
    async with open_bridge(settings) as bridge:
        assert isinstance(bridge, MemoryStreamBridge)
        store = bridge.sessions = CountingStore(settings)  # the store the bridge writes
        feeds = [follow_session(bridge, store, "shared", None, 5.0) for _ in range(50)]
        with anyio.fail_after(TIMEOUT):
            firsts = [asyncio.ensure_future(anext(feed)) for feed in feeds]
            await wait_all_idle(lambda: store.reads == 1)  # one "next turn?" read for all
            await bridge.claim("shared-r1", session_id="shared", input_message=MESSAGE)
            steps = await asyncio.gather(*firsts)
        assert all(isinstance(items[0], TurnOpened) for _, items in steps)
        assert store.reads == 2, store.reads  # one read for all 50, not one each
        for feed in feeds:
            await feed.aclose()


async def wait_all_idle(done: Any) -> None:
    while not done():
        await asyncio.sleep(0.01)


@pytest.mark.timeout(60)
async def test_a_turn_announced_while_the_notifier_reconnects_still_reaches_the_feed(
    fresh_redis: RedisServer, key_prefix: str
) -> None:
    """The notifier's reconnect counts as a change (notifications may have been lost
    meanwhile): a waiting feed re-reads its session's turns then."""
    settings = make_settings("redis", fresh_redis.url, key_prefix, heartbeat_interval_seconds=5)
    with serve(settings, "redis") as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as c:
            with anyio.fail_after(30):
                async with open_feed(c, "nr") as feed:
                    await turn(c, "nr", "nr-r1", ["a"])
                    assert (await feed.events(3))[-1].id == "nr-r1/end"
                    with fresh_redis.client() as admin:
                        admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
                        # announced while the notifier has no connection: lost
                        await turn(c, "nr", "nr-r2", ["b"])
                    got = await feed.events(3)
                    assert_turn(got[0], "nr-r2")
                    assert_turn_end(got[2], "nr-r2")


FEED_SECRET = "feed-expiry-secret-with-enough-bytes-for-hs256"


@pytest.mark.gateway_settings(jwt_secret=FEED_SECRET, api_keys=("expiry-key",))
async def test_the_feed_ends_when_its_token_expires(gateway_server: RunningServer) -> None:
    """Issue #25 item 5: the feed stops at the token's expiry (a `token expired` comment,
    a clean end), and follows no later turn on the expired token."""
    secret = FEED_SECRET
    auth = {"Authorization": "Bearer expiry-key"}
    async with (
        httpx.AsyncClient(base_url=gateway_server.base_url, timeout=15, headers=auth) as p,
        httpx.AsyncClient(base_url=gateway_server.base_url, timeout=15) as c,
    ):
        _, ids = await turn(p, "sx", "sx-r1", ["a"], end=False)
        token = mint_subscriber_token(secret, sessions=["sx"], ttl_seconds=1.5)
        frames = []
        with anyio.fail_after(15):
            async with c.stream(
                "GET", "/v1/sessions/sx/stream", params={"access_token": token}
            ) as response:
                assert response.status_code == 200
                async for frame in iter_frames(response):
                    frames.append(frame)
        assert [f.id for f in frames if f.id] == ["sx-r1/0-0", f"sx-r1/{ids[0]}"]
        assert any(b"token expired" in comment for f in frames for comment in f.comments)
        again = await c.get("/v1/sessions/sx/stream", params={"access_token": token})
        assert again.status_code == 401 and again.json()["error"] == "token_expired"


def _held(session_id: str) -> int:
    """Events and turn records of `session_id` referenced anywhere in this process
    (the server runs in a thread of it): payloads and records that name the session."""
    gc.collect()
    marker = session_id.encode()
    return sum(
        1
        for o in gc.get_objects()
        if (type(o) is StreamEvent and marker in o.data)
        or (type(o) is dict and o.get("session_id") == session_id)
    )


async def test_a_feed_waiting_for_the_next_turn_holds_nothing_of_the_turns_before(
    client: httpx.AsyncClient,
) -> None:
    """A feed that waits for the next turn (it heartbeats) holds no event and no turn
    record beyond what the backend holds itself (the memory log and store; nothing on
    Redis). Before, it kept the last turn's final batch (the whole replay of a resume
    into an ended turn, decoded for it alone on Redis) and, opened without a cursor,
    every turn record it listed, answer text included, for as long as it stayed open."""
    sid = f"held-{uuid4().hex[:8]}"
    with anyio.fail_after(TIMEOUT):
        ids: list[str] = []
        for k in range(3):
            texts = [f"{sid} {k} {i}" for i in range(20)]
            _, ids = await turn(client, sid, f"{sid}-r{k}", texts)
        backend_holds = _held(sid)
        for cursor in (f"{sid}-r2/{ids[0]}", None):
            async with open_feed(client, sid, cursor) as feed:
                if cursor is not None:
                    assert [f.event for f in await feed.events(20)] == ["token"] * 19 + ["turn_end"]
                await feed.heartbeat()  # waiting for the next turn
                # (polled: the server thread may still finish the step that wrote it)
                with anyio.move_on_after(3):
                    while _held(sid) > backend_holds:
                        await anyio.sleep(0.02)
                assert _held(sid) <= backend_holds, cursor


async def test_turn_frames_go_through_the_one_encoder(client: httpx.AsyncClient) -> None:
    """Issue #25 item 7: the `turn` and `turn_end` frames carry what was stored, and no
    frame carries a raw U+2028, U+2029 or U+0085 (a line splitter would forge lines)."""
    text = "one\u2028two\u2029three\u0085four"
    message = {"messageId": "m-1", "role": "user", "parts": [{"kind": "text", "text": text}]}
    producer = await ProducerClient.claim(
        client, run_id="sep-r1", session_id="sep", input_message=message
    )
    body = b""
    with anyio.fail_after(TIMEOUT):
        async with client.stream("GET", "/v1/sessions/sep/stream") as response:
            ended = False
            async for chunk in response.aiter_raw():
                body += chunk
                if not ended and b"event: turn\n" in body and body.endswith(b"\n\n"):
                    ended = True
                    await producer.end("error", {"message": text})
                if b"event: turn_end" in body and body.endswith(b"\n\n"):
                    break
    for separator in ("\u2028", "\u2029", "\u0085"):
        assert separator.encode() not in body
    data = {
        frame.split(b"event: ", 1)[1].split(b"\n", 1)[0]: json.loads(frame.split(b"data: ", 1)[1])
        for frame in body.split(b"\n\n")
        if b"event: " in frame
    }
    assert data[b"turn"]["input_message"]["parts"][0]["text"] == text
    assert data[b"turn_end"]["error"] == {"message": text}


def test_no_frame_is_built_with_a_bare_json_dump() -> None:
    """Issue #25 item 7, made mechanical: the streaming modules of `gateway/http` encode
    every frame through `values.encode_json` (the U+2028 rule), never a bare dump."""
    http = Path(__file__).resolve().parents[2] / "gateway" / "http"
    offenders = []
    for module in sorted(http.rglob("*.py")):
        source = module.read_text(encoding="utf-8")
        streaming = "SSEResponse" in source or "Framing" in source or module.name == "frames.py"
        if streaming and ("orjson.dumps(" in source or "json.dumps(" in source):
            offenders.append(module.name)
    assert offenders == []
