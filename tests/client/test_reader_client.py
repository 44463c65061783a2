"""gateway.client.reader.follow: the Python reader client, against a real server on both bridges.

Every case checks the exact sequence of values: the log's events once each, in order,
then one `Ended` or one `Gap`; drops (a cut TCP connection, an expiring token) in the
middle change nothing the app sees.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import aclosing

import anyio
import httpx
import pytest

from gateway.client.reader import Ended, Event, Gap, follow
from gateway.errors import RunNotFound, TokenExpired
from gateway.http.edge.auth import mint_subscriber_token
from tests.http_app.test_http_langgraph import CuttableProxy, proxy
from tests.support import http_server
from tests.support.http_server import ProducerClient, RunningServer, make_settings, serve
from tests.support.redis_servers import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(40)]
gateway_server = http_server.gateway_server
client = http_server.client
__all__ = ["proxy"]  # the cuttable proxy fixture, shared with the LangGraph SDK's tests

KEY = "k" * 40
SECRET = "s" * 64


async def collect(base_url: str, run_id: str, **kwargs: object) -> list[object]:
    with anyio.fail_after(20):
        return [item async for item in follow(base_url, run_id, **kwargs)]  # type: ignore[arg-type]


async def test_follows_a_run_to_its_end(
    client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    producer = await ProducerClient.claim(client)
    ids = await producer.publish(("token", {"t": "a"}), ("token", {"t": "b"}))
    await producer.end("error", {"message": "boom"})
    items = await collect(gateway_server.base_url, producer.run_id)
    assert items == [
        Event(ids[0], "token", {"t": "a"}),
        Event(ids[1], "token", {"t": "b"}),
        Ended("error", {"message": "boom"}),
    ]
    # resuming after the first event yields only what came after it
    assert await collect(gateway_server.base_url, producer.run_id, cursor=ids[0]) == items[1:]


@pytest.mark.gateway_settings(max_events_per_run=3)
async def test_a_trimmed_cursor_is_a_gap_value(
    client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    producer = await ProducerClient.claim(client)
    ids = await producer.publish(*[("token", i) for i in range(8)])
    await producer.end()
    items = await collect(gateway_server.base_url, producer.run_id, cursor=ids[0])
    assert len(items) == 1 and isinstance(items[0], Gap)
    gap = items[0]
    assert gap.reason == "trimmed" and gap.requested_event_id == ids[0]
    assert gap.latest_available_event_id == ids[-1]


async def test_unknown_run_raises(gateway_server: RunningServer) -> None:
    with pytest.raises(RunNotFound):
        await collect(gateway_server.base_url, "no-such-run")


async def test_a_cut_connection_is_resumed_exactly(
    client: httpx.AsyncClient, proxy: CuttableProxy
) -> None:
    producer = await ProducerClient.claim(client)
    first = await producer.publish(*[("token", i) for i in range(3)])
    seen: list[object] = []
    later: list[str] = []
    with anyio.fail_after(20):
        async with aclosing(follow(f"http://127.0.0.1:{proxy.port}", producer.run_id)) as items:
            async for item in items:
                seen.append(item)
                if len(seen) == 3:
                    proxy.cut()  # server side: the reader's connection is gone
                    later = await producer.publish(*[("token", i) for i in range(3, 6)])
                    await producer.end()
    assert proxy.connections >= 2  # it really reconnected
    assert seen == [
        *(Event(id_, "token", i) for i, id_ in enumerate(first + later)),
        Ended("success"),
    ]


@pytest.mark.gateway_settings(jwt_secret=SECRET, api_keys=(KEY,))
async def test_an_expiring_token_is_refreshed_and_the_stream_resumed(
    gateway_server: RunningServer,
) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(
        base_url=gateway_server.base_url, timeout=15, headers=auth
    ) as http:
        producer = await ProducerClient.claim(http)
        await producer.publish(("token", "a"))
        issued: list[str] = []
        reconnected = anyio.Event()

        def fresh_token() -> str:
            issued.append(mint_subscriber_token(SECRET, runs=[producer.run_id], ttl_seconds=1))
            if len(issued) == 2:  # the first token's stream ended: this is the reconnect
                reconnected.set()
            return issued[-1]

        async def produce_after_the_reconnect() -> None:
            await reconnected.wait()
            await producer.publish(("token", "b"))
            await producer.end()

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(produce_after_the_reconnect)
                seen = [
                    item
                    async for item in follow(
                        gateway_server.base_url, producer.run_id, token=fresh_token
                    )
                ]
            # a fixed token that expired is an error a retry cannot fix
            stale = mint_subscriber_token(SECRET, runs=[producer.run_id], ttl_seconds=-5)
            with pytest.raises(TokenExpired):
                await collect(gateway_server.base_url, producer.run_id, token=stale)
    assert len(issued) >= 2
    assert [type(i) for i in seen] == [Event, Event, Ended]
    assert [i.data for i in seen if isinstance(i, Event)] == ["a", "b"]


async def test_a_run_quiet_longer_than_retry_timeout_is_resumed_after_a_cut(
    client: httpx.AsyncClient, proxy: CuttableProxy
) -> None:
    """The outage clock starts when the stream breaks: a run that said nothing for longer
    than `retry_timeout` before its gateway connection dropped is still resumed."""
    producer = await ProducerClient.claim(client)
    first = await producer.publish(("token", 0))
    seen: list[object] = []
    base = f"http://127.0.0.1:{proxy.port}"
    with anyio.fail_after(20):
        async with aclosing(follow(base, producer.run_id, retry_timeout=0.5)) as items:
            async for item in items:
                seen.append(item)
                if len(seen) == 1:
                    await anyio.sleep(1.0)  # the scenario itself: a run quiet for 2 x 0.5 s
                    proxy.cut()
                    later = await producer.publish(("token", 1))
                    await producer.end()
    assert proxy.connections >= 2
    assert seen == [Event(first[0], "token", 0), Event(later[0], "token", 1), Ended("success")]


async def test_the_unavailable_frame_is_a_reconnect_never_an_event(
    redis_server_factory: Callable[..., RedisServer], key_prefix: str
) -> None:
    """The gateway's `unavailable` frame (its Redis went away) carries no id; httpx-sse
    gives it the previous event's. The reader reconnects instead of handing it to the app
    as that event again, and resumes exactly once Redis is back."""
    redis = redis_server_factory("--appendonly", "yes", "--appendfsync", "always")
    settings = make_settings("redis", redis.url, key_prefix)
    with serve(settings, "redis") as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as http:
            producer = await ProducerClient.claim(http, lease_seconds=120)
            first = await producer.publish(("token", 0))
            seen: list[object] = []
            with anyio.fail_after(30):
                async with aclosing(follow(srv.base_url, producer.run_id)) as items:
                    async for item in items:
                        seen.append(item)
                        if len(seen) == 1:
                            redis.kill()
                            srv.wait_open_sse(0)  # the gateway ended the stream (unavailable)
                            redis.restart()
                            later = await producer.publish(("token", 1))
                            await producer.end()
    assert seen == [Event(first[0], "token", 0), Event(later[0], "token", 1), Ended("success")]
