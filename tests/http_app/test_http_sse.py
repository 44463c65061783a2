"""SSE through a real uvicorn server, on the memory and the Redis bridge (docs/protocol.md §4)."""

from __future__ import annotations

import contextlib
import gc
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
import orjson
import pytest

from gateway.values import StreamEvent
from tests.support import http_server
from tests.support.http_server import ProducerClient, RunningServer
from tests.support.sse_client import Frame, iter_frames, read_stream

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]
gateway_server = http_server.gateway_server
client = http_server.client


async def _ended_run(
    client: httpx.AsyncClient, n: int = 5, **claim: Any
) -> tuple[ProducerClient, list[str]]:
    producer = await ProducerClient.claim(client, **claim)
    ids = await producer.publish(*[("token", {"i": i}) for i in range(n)]) if n else []
    await producer.end()
    return producer, ids


async def test_headers_retry_first_ids_and_end_frame(client: httpx.AsyncClient) -> None:
    producer, ids = await _ended_run(client, 3)
    result = await read_stream(client, f"/v1/runs/{producer.run_id}/stream")
    assert result.status == 200
    assert result.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert result.headers["cache-control"] == "no-cache, no-transform"
    assert result.headers["x-accel-buffering"] == "no"
    assert "connection" not in result.headers
    first = result.frames[0]
    assert first.retry is not None and 1000 <= first.retry <= 3000 and not first.is_event
    assert [f.id for f in result.events] == ids
    assert [f.json() for f in result.events] == [{"i": i} for i in range(3)]
    end = result.frames[-1]
    assert end.event == "end" and end.id == "end" and end.json() == {"status": "success"}


async def test_retry_and_heartbeats_are_lone_lines_no_parser_dispatches(
    client: httpx.AsyncClient,
) -> None:
    """`retry:` and comments are never followed by a blank line of their own: parsers
    that dispatch an event for any blank line (httpx-sse, fetch-event-source) see none."""
    producer = await ProducerClient.claim(client)
    await producer.publish(("token", 0))
    url = f"/v1/runs/{producer.run_id}/stream"
    raw = b""
    async with client.stream("GET", url) as response:
        async for chunk in response.aiter_raw():
            raw += chunk
            if raw.count(b": heartbeat\n") >= 1:
                break
    first_line, _, rest = raw.partition(b"\n")
    assert first_line.startswith(b"retry: ") and rest.startswith(b"id: ")
    assert b"\n\n: heartbeat\n" in raw
    assert b": heartbeat\n\n" not in raw and b"retry: " not in rest


@pytest.mark.parametrize("marker", ["end", "gap"])
async def test_reconnect_after_a_terminal_frame_is_204(
    client: httpx.AsyncClient, marker: str
) -> None:
    """The id of `end`/`gap` sent back (what EventSource does on its own) gets 204, the
    answer that stops an EventSource; as the query parameter too. Auth and 404 first."""
    producer, _ = await _ended_run(client, 2)
    url = f"/v1/runs/{producer.run_id}/stream"
    assert (await client.get(url, headers={"Last-Event-ID": marker})).status_code == 204
    assert (await client.get(url, params={"last_event_id": marker})).status_code == 204
    unknown = await client.get("/v1/runs/nope/stream", headers={"Last-Event-ID": marker})
    assert unknown.status_code == 404


async def test_retry_is_jittered_per_connection(client: httpx.AsyncClient) -> None:
    producer, _ = await _ended_run(client, 0)
    retries = set()
    for _ in range(8):
        result = await read_stream(client, f"/v1/runs/{producer.run_id}/stream")
        retries.add(result.frames[0].retry)
    assert len(retries) > 1


async def test_payload_bytes_are_the_producers_compact_encoding(client: httpx.AsyncClient) -> None:
    data = {"text": "héllo wörld ✓ 日本 \U0001f600", "nested": {"a": [1, 2.5, None, True]}, "e": ""}
    producer = await ProducerClient.claim(client)
    # Sent with whitespace and escapes: the stream carries orjson's compact bytes.
    body = b'{"event": "msg",  "data": {"text": "h\\u00e9llo w\\u00f6rld \\u2713 \\u65e5\\u672c '
    body += b'\\ud83d\\ude00", "nested": {"a": [1, 2.5, null, true]}, "e": ""}}'
    response = await client.post(
        f"/v1/runs/{producer.run_id}/events",
        content=body,
        headers={"X-Producer-Token": producer.token, "Content-Type": "application/json"},
    )
    assert response.status_code == 200, response.text
    await producer.end()
    result = await read_stream(client, f"/v1/runs/{producer.run_id}/stream")
    assert result.events[0].data == orjson.dumps(data)


async def test_end_frame_carries_error_object(client: httpx.AsyncClient) -> None:
    producer = await ProducerClient.claim(client)
    await producer.end("error", {"message": "boom"})
    result = await read_stream(client, f"/v1/runs/{producer.run_id}/stream")
    assert result.frames[-1].json() == {"status": "error", "error": {"message": "boom"}}


async def test_heartbeat_comment_while_idle(client: httpx.AsyncClient) -> None:
    producer = await ProducerClient.claim(client)
    await producer.publish(("token", 1))

    def is_heartbeat(frame: Frame) -> bool:
        return b"heartbeat" in frame.comments

    result = await read_stream(client, f"/v1/runs/{producer.run_id}/stream", stop=is_heartbeat)
    heartbeat = result.frames[-1]
    assert heartbeat.comments == [b"heartbeat"] and heartbeat.id is None and not heartbeat.is_event


async def test_an_idle_stream_holds_none_of_the_events_it_replayed(
    gateway_server: RunningServer, redis_url: str, key_prefix: str
) -> None:
    """A stream that replayed a run and now waits for more holds none of the replayed
    events beyond what the backend holds itself (the memory log; nothing on Redis, where
    they were decoded for this stream alone). Before, the reader's last read and the
    resume's first read stayed referenced for as long as the stream was open, and the
    write loop's last batch until the next one came: for an idle stream, its next
    heartbeat (30 s here)."""
    settings = http_server.make_settings(
        gateway_server.backend, redis_url, key_prefix + "idle:", heartbeat_interval_seconds=30
    )
    with http_server.serve(settings, gateway_server.backend) as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as client:
            producer = await ProducerClient.claim(client)
            marker = producer.run_id.encode()

            def held() -> int:
                gc.collect()
                return sum(
                    1 for o in gc.get_objects() if type(o) is StreamEvent and marker in o.data
                )

            await producer.publish(
                *[("token", {"run": producer.run_id, "i": i}) for i in range(30)]
            )
            backend_holds = held()
            with anyio.fail_after(15):
                async with client.stream("GET", f"/v1/runs/{producer.run_id}/stream") as response:
                    # (the frames' iterator stays referenced: a collected one would close
                    # the response, and the server would let go of everything anyway)
                    frames = iter_frames(response)
                    events = 0
                    while events < 30:
                        events += (await anext(frames)).is_event
                    # Polled: the server thread may still be finishing the step that
                    # wrote the last event.
                    with anyio.move_on_after(5):
                        while held() > backend_holds:
                            await anyio.sleep(0.02)
                    assert held() <= backend_holds
                    assert not response.is_closed
                    await frames.aclose()


async def test_unknown_run_is_404_before_streaming(client: httpx.AsyncClient) -> None:
    result = await read_stream(client, "/v1/runs/nope/stream")
    assert result.status == 404
    assert orjson.loads(result.body)["error"] == "run_not_found"
    result = await read_stream(client, "/v1/runs/-bad/stream")
    assert result.status == 422


async def test_ended_run_with_removed_log_gets_immediate_end(client: httpx.AsyncClient) -> None:
    producer, _ = await _ended_run(client, 2)
    assert (await client.delete(f"/v1/runs/{producer.run_id}")).status_code == 204
    with anyio.fail_after(5):
        result = await read_stream(client, f"/v1/runs/{producer.run_id}/stream")
    assert [f.event for f in result.frames if f.is_event] == ["end"]
    assert result.frames[-1].json() == {"status": "success"}


@pytest.mark.parametrize("how", ["header", "query"])
async def test_reattach_exact_replay_no_duplicate_no_loss(
    client: httpx.AsyncClient, how: str
) -> None:
    producer = await ProducerClient.claim(client)
    first = await producer.publish(*[("token", i) for i in range(4)])
    url = f"/v1/runs/{producer.run_id}/stream"
    seen: list[str] = []
    # Read two events live, then drop the connection.
    async with client.stream("GET", url) as response:
        async for frame in iter_frames(response):
            if frame.data_id is not None:
                seen.append(frame.id)
            if len(seen) == 2:
                break
    later = await producer.publish(*[("token", i) for i in range(4, 7)])
    await producer.end()
    cursor = seen[-1]
    if how == "header":
        result = await read_stream(client, url, headers={"Last-Event-ID": cursor})
    else:
        result = await read_stream(client, url, params={"last_event_id": cursor})
    resumed = [f.id for f in result.events]
    assert seen + resumed == first + later
    assert result.frames[-1].event == "end"


async def test_header_cursor_wins_over_query(client: httpx.AsyncClient) -> None:
    producer, ids = await _ended_run(client, 4)
    result = await read_stream(
        client,
        f"/v1/runs/{producer.run_id}/stream",
        headers={"Last-Event-ID": ids[2]},
        params={"last_event_id": ids[0]},
    )
    assert [f.id for f in result.events] == ids[3:]


async def test_live_follow_then_end(client: httpx.AsyncClient) -> None:
    producer = await ProducerClient.claim(client)
    url = f"/v1/runs/{producer.run_id}/stream"
    published: list[str] = []
    received: list[str] = []
    async with client.stream("GET", url) as response:
        frames = iter_frames(response)
        assert (await anext(frames)).retry is not None  # subscribed: headers + retry hint
        for i in range(5):
            published += await producer.publish(("token", i))
        await producer.end()
        async for frame in frames:
            if frame.data_id is not None:
                received.append(frame.id)
    assert received == published


# ------------------------------------------------------------------------ cursor rules


async def test_cursor_none_and_zero_replay_everything(client: httpx.AsyncClient) -> None:
    producer, ids = await _ended_run(client, 3)
    url = f"/v1/runs/{producer.run_id}/stream"
    assert [f.id for f in (await read_stream(client, url)).events] == ids
    zero = await read_stream(client, url, headers={"Last-Event-ID": "0-0"})
    assert [f.id for f in zero.events] == ids and zero.frames[-1].event == "end"


async def test_cursor_newer_than_newest_of_an_ended_run_is_a_gap(
    client: httpx.AsyncClient,
) -> None:
    producer, _ = await _ended_run(client, 2)
    result = await read_stream(
        client, f"/v1/runs/{producer.run_id}/stream", headers={"Last-Event-ID": "99999999999999-0"}
    )
    assert result.events == [] and result.frames[-1].event == "gap"
    gap = result.frames[-1].json()
    assert gap["reason"] == "unknown_position" and gap["requested_event_id"] == "99999999999999-0"


async def test_cursor_newer_than_newest_is_a_gap_not_a_wait(client: httpx.AsyncClient) -> None:
    producer = await ProducerClient.claim(client)
    ids = await producer.publish(("token", 0))
    url = f"/v1/runs/{producer.run_id}/stream"
    result = await read_stream(client, url, headers={"Last-Event-ID": "99999999999999-0"})
    assert result.events == [] and result.frames[-1].event == "gap"
    gap = result.frames[-1].json()
    assert (gap["reason"], gap["earliest_available_event_id"]) == ("unknown_position", ids[0])
    await producer.end()


@pytest.mark.gateway_settings(max_events_per_run=3)
async def test_trimmed_cursor_gap_and_exact_predecessor(
    client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    producer = await ProducerClient.claim(client)
    ids: list[str] = []
    for i in range(10):  # one by one, so Redis approximate trimming has to act
        ids += await producer.publish(("token", i))
    end_id = (await producer.end())["id"]
    run = (await client.get(f"/v1/runs/{producer.run_id}")).json()
    first = run["first_event_id"]
    retained = ids[ids.index(first) :]
    url = f"/v1/runs/{producer.run_id}/stream"
    # The exact predecessor of the first retained id: all successors + END, no gap.
    predecessor = ids[ids.index(first) - 1]
    result = await read_stream(client, url, headers={"Last-Event-ID": predecessor})
    assert [f.id for f in result.events] == retained
    assert result.frames[-1].event == "end"
    # Older than that: an explicit gap frame (its id is the terminal `gap`, never a
    # position), then the response ends.
    result = await read_stream(client, url, headers={"Last-Event-ID": ids[0]})
    gap = result.frames[-1]
    assert gap.event == "gap" and gap.id == "gap" and result.events == []
    body = gap.json()
    # Bridge detail: Redis counts its END entry as retained, memory reports the last event.
    assert body.pop("latest_available_event_id") in (ids[-1], end_id)
    assert body == {
        "code": "stream_replay_gap",
        "run_id": producer.run_id,
        "requested_event_id": ids[0],
        "earliest_available_event_id": first,
        "reason": "trimmed",
        "recovery": "reload_durable_state",
    }


@pytest.mark.parametrize(
    "cursor", ["garbage", "", "1-", "-1", "\u0661-\u0662", "1-99999999999999999999"]
)
async def test_malformed_cursor_policy(
    client: httpx.AsyncClient, gateway_server: RunningServer, cursor: str
) -> None:
    producer, ids = await _ended_run(client, 3)
    url = f"/v1/runs/{producer.run_id}/stream"
    # Ended stream: both backends replay through END.
    result = await read_stream(client, url, params={"last_event_id": cursor})
    assert result.status == 200
    assert [f.id for f in result.events] == ids and result.frames[-1].event == "end"
    # Active stream: memory replays retained events; Redis tails live only.
    live = await ProducerClient.claim(client)
    before = await live.publish(("token", "a"), ("token", "b"))
    async with client.stream(
        "GET", f"/v1/runs/{live.run_id}/stream", params={"last_event_id": cursor}
    ) as response:
        assert response.status_code == 200
        frames = iter_frames(response)
        assert (await anext(frames)).retry is not None
        after = await live.publish(("token", "c"))
        await live.end()
        got = [f.data_id async for f in frames if f.data_id is not None]
    expected = before + after if gateway_server.backend == "memory" else after
    if gateway_server.backend == "redis":
        # The subscription may start tailing a moment after the retry frame; never a replay.
        assert set(got) <= set(after)
    else:
        assert got == expected


# --------------------------------------------------------------- disconnect & liveness


async def test_disconnect_frees_subscription_and_producer_continues(
    client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    producer = await ProducerClient.claim(client)
    await producer.publish(("token", 0))
    async with client.stream("GET", f"/v1/runs/{producer.run_id}/stream") as response:
        frames = iter_frames(response)
        while (await anext(frames)).data_id is None:
            pass
        assert gateway_server.open_sse() == 1
    # Closed by the client; no publish or heartbeat is needed for the server to notice.
    gateway_server.wait_open_sse(0, timeout=2)
    ids = await producer.publish(("token", 1), ("token", 2))
    assert len(ids) == 2
    run = (await client.get(f"/v1/runs/{producer.run_id}")).json()
    assert run["status"] == "running" and run["cancel_requested"] is False


# A client that stops reading: far more bytes than the kernel buffers between the server
# and a receiver with a 4 KiB receive buffer (the server's send buffer tops out at 4 MiB).
BIG = "x" * 16_000
BATCHES, PER_BATCH = 24, 32  # ~12 MB


@contextlib.contextmanager
def _stuck_client(server: RunningServer, run_id: str) -> Iterator[socket.socket]:
    """A raw connection that asks for the stream and never reads a byte (once the server
    holds its response open)."""
    url = urlsplit(server.base_url)
    sock = socket.socket()
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((url.hostname, url.port))
        sock.sendall(f"GET /v1/runs/{run_id}/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        server.wait_open_sse(1)
        yield sock
    finally:
        sock.close()


async def _publish_big(producer: ProducerClient) -> list[str]:
    ids: list[str] = []
    for _ in range(BATCHES):
        ids += await producer.publish(*[("token", {"p": BIG})] * PER_BATCH)
    return ids


@pytest.mark.gateway_settings(sse_send_timeout_seconds=120)
async def test_a_client_that_stops_reading_stalls_neither_producer_nor_other_readers(
    client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    producer = await ProducerClient.claim(client)
    with _stuck_client(gateway_server, producer.run_id):
        result: list[Any] = []

        async def follow() -> None:
            result.append(await read_stream(client, f"/v1/runs/{producer.run_id}/stream"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            ids = await _publish_big(producer)  # every write accepted, none held back
            await producer.end()
        frames = result[0].frames
        assert [f.data_id for f in frames if f.data_id is not None] == ids
        assert frames[-1].event == "end"
        # The stuck client is still there, behind (the follower's response may still be
        # cleaning up when its client has read the END: wait for it, not a count now).
        gateway_server.wait_open_sse(1)
    gateway_server.wait_open_sse(0)


@pytest.mark.gateway_settings(sse_send_timeout_seconds=0.5)
async def test_a_client_that_stops_reading_is_dropped_after_the_send_timeout(
    client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    producer = await ProducerClient.claim(client)
    with _stuck_client(gateway_server, producer.run_id) as stuck:
        await _publish_big(producer)
        gateway_server.wait_open_sse(0, timeout=20)  # dropped: the client never left
        stuck.settimeout(20)
        received = b""
        while chunk := stuck.recv(1 << 20):  # what the kernel buffered, then EOF
            received += chunk
    assert received.startswith(b"HTTP/1.1 200")
    assert b"event: end" not in received  # cut off mid-stream, not ended
    run = (await client.get(f"/v1/runs/{producer.run_id}")).json()
    assert run["status"] == "running" and run["cancel_requested"] is False


@pytest.mark.gateway_settings(heartbeat_interval_seconds=0.2)
async def test_expired_lease_gets_producer_lost_end(client: httpx.AsyncClient) -> None:
    producer = await ProducerClient.claim(client, lease_seconds=0.8)
    await producer.publish(("token", 0))
    with anyio.fail_after(10):
        result = await read_stream(client, f"/v1/runs/{producer.run_id}/stream")
    assert result.frames[-1].event == "end"
    assert result.frames[-1].json()["status"] == "producer_lost"
