"""Streamed appends (PROTOCOL 3.3): one `POST …/events` with an ndjson body per turn.

A real uvicorn server on both bridges and on a Redis Cluster (`gateway_server`, this
module's: the streamed append's numbering and overlap rule run in the cluster's scripts
too). Two real clients: httpx with a
streaming request body (it sends the whole body before it reads the reply, as the
Python producer client does), and aiohttp, which reads the reply while its body is still
being sent, for the acknowledgements that arrive while the body is open.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator, Iterable, Iterator
from types import TracebackType
from typing import Any

import aiohttp
import anyio
import httpx
import orjson
import pytest

from tests.support import http_server
from tests.support.http_server import ProducerClient, RunningServer
from tests.support.sse_client import read_stream

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
client = http_server.client


@pytest.fixture(params=["memory", "redis", pytest.param("cluster", marks=pytest.mark.cluster)])
def gateway_server(request: pytest.FixtureRequest, key_prefix: str) -> Iterator[RunningServer]:
    """A running gateway on the memory bridge, on Redis and on a Redis Cluster."""
    backend = str(request.param)
    url: str | None = None
    if backend == "redis":
        url = request.getfixturevalue("redis_url")
    elif backend == "cluster":
        url = request.getfixturevalue("redis_cluster").url.replace(
            "redis://", "redis+cluster://", 1
        )
        backend = "redis"
    overrides: dict[str, Any] = {}
    marker = request.node.get_closest_marker("gateway_settings")
    if marker is not None:
        overrides.update(marker.kwargs)
    settings = http_server.make_settings(backend, url, key_prefix, **overrides)
    with http_server.serve(settings, backend) as srv:
        yield srv


NDJSON = "application/x-ndjson"
TIMEOUT = 10.0


def line(n: int, name: str = "token") -> bytes:
    return orjson.dumps({"event": name, "data": {"n": n}}) + b"\n"


def lines(numbers: Iterable[int]) -> bytes:
    return b"".join(line(n) for n in numbers)


def headers(producer: ProducerClient, seq: int | None = None) -> dict[str, str]:
    out = {"X-Producer-Token": producer.token, "Content-Type": NDJSON}
    if seq is not None:
        out["X-Producer-Seq"] = str(seq)
    return out


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def stream_append(
    client: httpx.AsyncClient, producer: ProducerClient, *parts: bytes, seq: int | None = None
) -> tuple[int, list[dict[str, Any]]]:
    """httpx, streaming request body: (status, reply lines)."""
    response = await client.post(
        f"/v1/runs/{producer.run_id}/events",
        content=chunks(*parts),
        headers=headers(producer, seq),
    )
    if response.headers.get("content-type") != NDJSON:
        return response.status_code, [response.json()]
    return response.status_code, [orjson.loads(raw) for raw in response.content.splitlines()]


async def logged(client: httpx.AsyncClient, run_id: str) -> list[tuple[str, int]]:
    """(id, n) of every event of an ended run, read over SSE."""
    with anyio.fail_after(TIMEOUT):
        result = await read_stream(client, f"/v1/runs/{run_id}/stream")
    assert result.terminal is not None and result.terminal.event == "end"
    return [(f.id or "", f.json()["n"]) for f in result.events]


def acked_ids(replies: list[dict[str, Any]]) -> list[str]:
    return [i for reply in replies if "ids" in reply for i in reply["ids"]]


class Duplex:
    """A streamed append through aiohttp: lines go out while acks come back."""

    def __init__(self, srv: RunningServer, producer: ProducerClient, seq: int | None = None):
        self._url = f"{srv.base_url}/v1/runs/{producer.run_id}/events"
        self._headers = headers(producer, seq)
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._session: aiohttp.ClientSession | None = None
        self.response: aiohttp.ClientResponse | None = None

    async def _body(self) -> AsyncIterator[bytes]:
        while (part := await self._queue.get()) is not None:
            yield part

    async def __aenter__(self) -> Duplex:
        self._session = aiohttp.ClientSession()
        # aiohttp sends the request head with the first body chunk: a blank line (a
        # keep-alive, which the gateway skips) gets the request going.
        self.send(b"\n")
        with anyio.fail_after(TIMEOUT):
            self.response = await self._session.post(
                self._url, data=self._body(), headers=self._headers
            )
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._session is not None
        if self.response is not None:
            self.response.close()
        await self._session.close()

    def send(self, data: bytes) -> None:
        self._queue.put_nowait(data)

    def close_body(self) -> None:
        self._queue.put_nowait(None)

    async def reply(self) -> dict[str, Any]:
        assert self.response is not None
        with anyio.fail_after(TIMEOUT):
            raw = await self.response.content.readline()
        assert raw, "the reply ended"
        value: dict[str, Any] = orjson.loads(raw)
        return value


async def test_acks_arrive_while_the_body_is_open_and_a_lone_line_is_not_held(
    gateway_server: RunningServer, client: httpx.AsyncClient
) -> None:
    producer = await ProducerClient.claim(client)
    async with Duplex(gateway_server, producer, seq=1) as duplex:
        assert duplex.response is not None and duplex.response.status == 200
        assert duplex.response.headers["content-type"] == NDJSON
        # Each lone line is acknowledged before the next one is sent: nothing waits for
        # more lines (no linger timer).
        acks = []
        for n in range(1, 4):
            duplex.send(line(n))
            acks.append(await duplex.reply())
            assert len(acks[-1]["ids"]) == 1
            assert acks[-1]["next_seq"] == n + 1 and acks[-1]["cancel_requested"] is False
        # A cancel requested meanwhile shows in the next ack.
        assert (await client.post(f"/v1/runs/{producer.run_id}/cancel", json={})).status_code == 202
        duplex.send(line(4))
        acks.append(await duplex.reply())
        assert acks[-1]["cancel_requested"] is True
        duplex.close_body()
        done = await duplex.reply()
    ids = acked_ids(acks)
    assert done == {"done": True, "count": 4, "last_id": ids[-1]}
    await producer.end()
    assert await logged(client, producer.run_id) == list(zip(ids, range(1, 5), strict=True))


async def test_lines_sent_together_go_in_one_append(
    gateway_server: RunningServer, client: httpx.AsyncClient
) -> None:
    """Group commit: the lines of one chunk, all there when the appender wakes, cost one
    append (one ack); the ids are those of one batch, in order."""
    producer = await ProducerClient.claim(client)
    async with Duplex(gateway_server, producer) as duplex:
        duplex.send(lines(range(1, 51)))
        ack = await duplex.reply()
        assert len(ack["ids"]) == 50 and "next_seq" not in ack
        duplex.close_body()
        assert (await duplex.reply())["count"] == 50
    await producer.end()
    assert [n for _, n in await logged(client, producer.run_id)] == list(range(1, 51))


async def test_an_httpx_streaming_body_gets_its_acks_and_done(client: httpx.AsyncClient) -> None:
    producer = await ProducerClient.claim(client, session_id="stream-chat")
    texts = ["Hel", "lo", ", wor", "ld"]
    parts = [
        orjson.dumps({"event": "token", "data": {"text": t}}) + (b"\n" if i < 3 else b"")
        for i, t in enumerate(texts)
    ]  # the last line without its newline: the body's end ends it
    status, replies = await stream_append(client, producer, *parts, seq=1)
    assert status == 200
    assert replies[-1]["done"] is True and replies[-1]["count"] == 4
    assert replies[-2]["next_seq"] == 5 and len(acked_ids(replies)) == 4
    await producer.end()
    turns = (await client.get("/v1/sessions/stream-chat/turns")).json()["turns"]
    assert [t["text"] for t in turns] == ["Hello, world"]


@pytest.mark.parametrize(
    ("bad", "code"),
    [
        (b"{not json\n", "invalid_json"),
        (b'["event", "data"]\n', "invalid_input"),
        (b'{"event": "end", "data": 1}\n', "reserved_event_name"),
        (b'{"event": "token", "data": 1, "extra": 2}\n', "invalid_input"),
        (b'{"event": "token", "data": 18446744073709551616}\n', "number_out_of_range"),
    ],
)
async def test_a_bad_line_ends_the_stream_after_appending_every_line_before_it(
    client: httpx.AsyncClient, bad: bytes, code: str
) -> None:
    producer = await ProducerClient.claim(client)
    status, replies = await stream_append(
        client, producer, lines([1, 2]), bad + line(3), line(4), seq=1
    )
    assert status == 200
    error = replies[-1]
    assert error["error"] == code and error["detail"]
    assert error["applied"] == 2 and error["next_seq"] == 3
    assert len(acked_ids(replies)) == 2
    await producer.end()
    assert [n for _, n in await logged(client, producer.run_id)] == [1, 2]


@pytest.mark.gateway_settings(max_event_bytes=64)
async def test_a_line_over_the_limit_is_refused_without_being_buffered(
    gateway_server: RunningServer, client: httpx.AsyncClient
) -> None:
    producer = await ProducerClient.claim(client)
    # Payload over max_event_bytes, line within the line limit: too_large.
    big = orjson.dumps({"event": "token", "data": "x" * 100}) + b"\n"
    status, replies = await stream_append(client, producer, line(1) + big + line(2))
    assert status == 200 and replies[-1]["error"] == "too_large" and replies[-1]["applied"] == 1
    # A line that never ends, past the line limit: refused while the body is still open
    # (the gateway does not wait for its end).
    async with Duplex(gateway_server, producer) as duplex:
        duplex.send(line(2))
        assert len((await duplex.reply())["ids"]) == 1
        duplex.send(b'{"event": "token", "data": "' + b"y" * 8192)
        error = await duplex.reply()
        assert error["error"] == "too_large" and error["applied"] == 1
    await producer.end()
    assert [n for _, n in await logged(client, producer.run_id)] == [1, 2]


async def test_fenced_ended_and_gap_end_the_stream_with_what_was_applied(
    gateway_server: RunningServer, client: httpx.AsyncClient
) -> None:
    # sequence_gap: the first line's number is past the next expected one.
    producer = await ProducerClient.claim(client, lease_seconds=30)
    status, replies = await stream_append(client, producer, lines([5, 6]), seq=5)
    assert status == 200
    assert replies == [
        {
            "error": "sequence_gap",
            "detail": replies[0]["detail"],
            "expected_seq": 1,
            "applied": 0,
            "next_seq": 1,
        }
    ]
    # fenced: a takeover while the stream is open; the lines after it are refused.
    async with Duplex(gateway_server, producer, seq=1) as duplex:
        duplex.send(line(1))
        assert (await duplex.reply())["next_seq"] == 2
        taken = await client.post("/v1/runs", json={"run_id": producer.run_id, "takeover": True})
        assert taken.status_code == 201
        duplex.send(line(2))
        error = await duplex.reply()
        assert error["error"] == "fenced" and error["applied"] == 1 and error["next_seq"] == 2
    # A stream opened with a fenced token is a plain 409, nothing streamed.
    status, replies = await stream_append(client, producer, line(2))
    assert status == 409 and replies[0]["error"] == "fenced"
    # ended: END from elsewhere while the stream is open.
    new = ProducerClient(client, producer.run_id, taken.json()["producer_token"])
    async with Duplex(gateway_server, new) as duplex:
        duplex.send(line(10))
        assert len((await duplex.reply())["ids"]) == 1
        await new.end()
        duplex.send(line(11))
        error = await duplex.reply()
        assert error["error"] == "ended" and error["applied"] == 1 and "next_seq" not in error
    assert [n for _, n in await logged(client, producer.run_id)] == [1, 10]


async def test_a_reconnect_resends_from_the_first_unacknowledged_number(
    gateway_server: RunningServer, client: httpx.AsyncClient
) -> None:
    """The connection breaks after lines 1..5 were applied but only 1..2 acknowledged:
    the producer resends 3.. and the overlap is answered with the first ids; a follower
    sees every event exactly once."""
    producer = await ProducerClient.claim(client)
    follower = asyncio.ensure_future(read_stream(client, f"/v1/runs/{producer.run_id}/stream"))
    async with Duplex(gateway_server, producer, seq=1) as duplex:
        duplex.send(lines([1, 2]))
        first = await duplex.reply()
        duplex.send(lines([3, 4, 5]))
        lost = await duplex.reply()  # applied; the producer never sees this ack
        assert len(lost["ids"]) == 3
    # (the connection is gone; the producer knows only of 1..2)
    status, replies = await stream_append(client, producer, lines(range(3, 9)), seq=3)
    # `count`: the lines this request appended (6..8), not the resent ones applied before
    assert status == 200 and replies[-1]["count"] == 3
    ids = acked_ids(replies)
    assert ids[:3] == lost["ids"] and replies[-2]["next_seq"] == 9
    await producer.end()
    with anyio.fail_after(TIMEOUT):
        seen = await follower
    assert [f.id for f in seen.events] == [*first["ids"], *ids]
    assert [f.json()["n"] for f in seen.events] == list(range(1, 9))


@pytest.mark.gateway_settings(max_append_streams_per_key=1)
async def test_the_stream_limit_per_key_is_a_429(
    gateway_server: RunningServer, client: httpx.AsyncClient
) -> None:
    producer = await ProducerClient.claim(client)
    async with Duplex(gateway_server, producer) as duplex:
        duplex.send(line(1))
        assert len((await duplex.reply())["ids"]) == 1
        status, replies = await stream_append(client, producer, line(2))
        assert status == 429 and replies[0]["error"] == "too_many_streams"
        duplex.close_body()
        assert (await duplex.reply())["done"] is True

    async def released() -> None:
        while gateway_server.state.append_streams:
            await asyncio.sleep(0.01)

    gateway_server.call(released)  # the slot is given back when the stream ends
    status, replies = await stream_append(client, producer, line(3))
    assert status == 200 and replies[-1]["count"] == 1


async def test_an_idle_body_is_ended_after_the_lease(
    gateway_server: RunningServer, client: httpx.AsyncClient
) -> None:
    producer = await ProducerClient.claim(client, lease_seconds=1)
    async with Duplex(gateway_server, producer, seq=1) as duplex:
        duplex.send(line(1))
        assert (await duplex.reply())["next_seq"] == 2
        with anyio.fail_after(5):
            error = await duplex.reply()  # nothing sent for a whole lease
        assert error["error"] == "body_idle" and error["applied"] == 1
        assert error["next_seq"] == 2


async def test_blank_lines_keep_an_idle_stream_and_its_lease_alive(
    gateway_server: RunningServer, client: httpx.AsyncClient
) -> None:
    producer = await ProducerClient.claim(client, lease_seconds=1)
    async with Duplex(gateway_server, producer) as duplex:
        for _ in range(8):  # 2 s of blank lines, twice the lease
            duplex.send(b"\n")
            await anyio.sleep(0.25)  # the subject: time passing with only keep-alives
        duplex.send(line(1))
        ack = await duplex.reply()
        assert len(ack["ids"]) == 1  # not fenced: the lease was renewed meanwhile
        duplex.close_body()
        assert (await duplex.reply())["done"] is True


@pytest.mark.gateway_settings(sse_send_timeout_seconds=1, max_events_per_run=1_000_000)
async def test_a_client_that_stops_reading_acks_is_bounded_and_dropped(
    gateway_server: RunningServer, client: httpx.AsyncClient
) -> None:
    """A producer that sends and never reads: the acks back up, the gateway stops taking
    its lines (nothing is buffered without bound) and drops it after the send timeout.
    The route's bound, the same on both bridges: run on memory, where appends are fast."""
    if gateway_server.backend != "memory":
        pytest.skip("the bound is the route's; memory appends fast enough to reach it")
    producer = await ProducerClient.claim(client)
    total = 400_000
    host, port = gateway_server.base_url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that never reads
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, int(port)))
    head = (
        f"POST /v1/runs/{producer.run_id}/events HTTP/1.1\r\nHost: {host}\r\n"
        f"X-Producer-Token: {producer.token}\r\nContent-Type: {NDJSON}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    )
    streams = gateway_server.state.append_streams

    async def send_all() -> None:
        await loop.sock_sendall(sock, head.encode())
        for start in range(0, total, 1000):
            chunk = lines(range(start, start + 1000))
            await loop.sock_sendall(sock, b"%x\r\n%s\r\n" % (len(chunk), chunk))

    async def stream_ends() -> None:
        while not streams:  # opened
            await asyncio.sleep(0.01)
        while streams:  # and dropped (the client never reads a byte)
            await asyncio.sleep(0.05)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(send_all)  # stalls once the gateway stops reading
            await anyio.to_thread.run_sync(gateway_server.call, stream_ends, 30)
            tg.cancel_scope.cancel()
    except* OSError:  # the gateway reset the connection under the sender
        pass
    finally:
        sock.close()
    run = (await client.get(f"/v1/runs/{producer.run_id}")).json()
    assert 0 < run["retained_events"] < total


async def test_a_draining_gateway_ends_the_stream_with_what_it_applied(
    gateway_server: RunningServer, client: httpx.AsyncClient
) -> None:
    """On shutdown an open stream is not held until the grace period runs out: it ends
    with `bridge_closed` after appending what it read, and the producer goes on elsewhere
    from `next_seq`."""
    producer = await ProducerClient.claim(client)
    async with Duplex(gateway_server, producer, seq=1) as duplex:
        duplex.send(lines([1, 2]))
        assert (await duplex.reply())["next_seq"] == 3

        async def drain() -> None:
            gateway_server.state.subscriptions.drain()

        gateway_server.call(drain)
        error = await duplex.reply()
    assert error["error"] == "bridge_closed" and error["applied"] == 2
    assert error["next_seq"] == 3
    run = (await client.get(f"/v1/runs/{producer.run_id}")).json()
    assert run["retained_events"] == 2


async def test_a_drain_during_an_append_acknowledges_it_and_appends_no_more(
    gateway_server: RunningServer, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append in flight when the gateway starts draining is not interrupted: it is
    finished and acknowledged, then the stream ends with `bridge_closed`, and a line that
    came meanwhile is not appended (the producer sends it elsewhere from `next_seq`)."""
    producer = await ProducerClient.claim(client)
    bridge = gateway_server.state.bridge
    publish_many = bridge.publish_many
    entered = threading.Event()
    gates: list[asyncio.Event] = []

    async def make_gate() -> None:
        gates.append(asyncio.Event())  # on the server's loop

    gateway_server.call(make_gate)

    async def held(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        await gates[0].wait()
        return await publish_many(*args, **kwargs)

    monkeypatch.setattr(bridge, "publish_many", held)
    async with Duplex(gateway_server, producer, seq=1) as duplex:
        duplex.send(lines([1, 2]))
        assert await anyio.to_thread.run_sync(entered.wait, TIMEOUT)
        duplex.send(lines([3]))

        async def drain_then_release() -> None:
            gateway_server.state.subscriptions.drain()
            gates[0].set()

        gateway_server.call(drain_then_release)
        ack = await duplex.reply()
        error = await duplex.reply()
    assert len(ack["ids"]) == 2 and ack["next_seq"] == 3
    assert error["error"] == "bridge_closed" and error["applied"] == 2
    assert error["next_seq"] == 3
    run = (await client.get(f"/v1/runs/{producer.run_id}")).json()
    assert run["retained_events"] == 2


async def test_two_streams_with_one_token_append_each_line_once(
    gateway_server: RunningServer, client: httpx.AsyncClient
) -> None:
    """A producer that opened a second stream before the first one died (or two copies
    of it): both send the same numbered lines; each line is appended once, in order."""
    producer = await ProducerClient.claim(client)
    total = 60

    async def body() -> AsyncIterator[bytes]:
        for start in range(1, total + 1, 5):
            yield lines(range(start, start + 5))
            await anyio.sleep(0.005)  # interleave the two bodies

    replies: list[list[dict[str, Any]]] = []

    async def one() -> None:
        response = await client.post(
            f"/v1/runs/{producer.run_id}/events", content=body(), headers=headers(producer, 1)
        )
        assert response.status_code == 200
        replies.append([orjson.loads(raw) for raw in response.content.splitlines()])

    async with anyio.create_task_group() as tg:
        tg.start_soon(one)
        tg.start_soon(one)
    # Every line acknowledged to both; each appended by one of them (`count`: the lines
    # a request appended itself).
    assert all(reply[-1]["done"] is True for reply in replies)
    assert sum(reply[-1]["count"] for reply in replies) == total
    # Both were told the same id for each line.
    assert acked_ids(replies[0]) == acked_ids(replies[1])
    await producer.end()
    log = await logged(client, producer.run_id)
    assert [n for _, n in log] == list(range(1, total + 1))
    assert [i for i, _ in log] == acked_ids(replies[0])


@pytest.mark.gateway_settings(max_append_streams_per_key=1, api_keys=("k" * 40,))
async def test_the_per_key_limit_counts_the_key_however_it_is_presented(
    gateway_server: RunningServer,
) -> None:
    key = "k" * 40
    async with httpx.AsyncClient(
        base_url=gateway_server.base_url, timeout=TIMEOUT, headers={"X-Api-Key": key}
    ) as keyed:
        producer = await ProducerClient.claim(keyed)
        duplex = Duplex(gateway_server, producer)
        duplex._headers["Authorization"] = f"Bearer {key}"
        async with duplex:
            duplex.send(line(1))
            assert len((await duplex.reply())["ids"]) == 1
            # the same key in X-Api-Key is the same holder: its one stream is taken
            status, replies = await stream_append(keyed, producer, line(2))
            assert status == 429 and replies[0]["error"] == "too_many_streams"
            duplex.close_body()
            assert (await duplex.reply())["done"] is True
