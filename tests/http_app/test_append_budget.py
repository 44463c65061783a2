"""The process-wide budget of streamed-append bytes (`max_inflight_append_bytes`): bytes
received but not yet appended, counted across every streamed append of the process.
A stream that needs more ends with the error line `overloaded` (every line before it
appended, acknowledged and kept); a stream that would start with none left is 503
`overloaded` with `Retry-After`. Through a real server on both bridges (the fixture of
test_http_append_stream); the 256 x 1 MiB case, with the process's peak RSS, is
tests/system/test_append_memory.py."""

from __future__ import annotations

import asyncio
import contextlib

import anyio
import httpx
import pytest

from tests.http_app import test_http_append_stream as appends
from tests.http_app.test_http_append_stream import Duplex, acked_ids, line, logged, stream_append
from tests.support import http_server
from tests.support.http_server import ProducerClient, RunningServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
client = http_server.client
gateway_server = appends.gateway_server  # memory, Redis (and a Redis Cluster, marked)

PART = 16_384  # the first bytes of a large line
BUDGET = 4 * PART + 64  # four of them, and room for their ends


def big_line_start(n: int) -> bytes:
    """The first PART bytes of a line whose payload is under max_event_bytes."""
    head = b'{"event": "token", "data": {"n": %d, "p": "' % n
    return head + b"x" * (PART - len(head))


def big_line_end() -> bytes:
    return b'"}}\n'


async def held(srv: RunningServer, want: int) -> None:
    """Until the server's streamed appends hold `want` bytes of the budget (read from
    this thread: this loop must keep running, it sends the clients' bodies)."""
    with anyio.fail_after(10):
        while srv.state.append_bytes != want:
            await asyncio.sleep(0.005)


@pytest.mark.gateway_settings(max_event_bytes=PART, max_inflight_append_bytes=BUDGET)
async def test_streams_past_the_budget_are_refused_and_lose_nothing_acknowledged(
    gateway_server: RunningServer, client: httpx.AsyncClient
) -> None:
    producers = [await ProducerClient.claim(client) for _ in range(6)]
    acked: dict[str, list[str]] = {p.run_id: [] for p in producers}
    async with contextlib.AsyncExitStack() as stack:
        duplexes = [
            await stack.enter_async_context(Duplex(gateway_server, p, 1)) for p in producers
        ]
        for duplex, producer in zip(duplexes, producers, strict=True):
            duplex.send(line(1))
            reply = await duplex.reply()
            acked[producer.run_id] += reply["ids"]
        await held(gateway_server, 0)  # each holds nothing once its line is appended
        # Each sends most of a large line: the first four take the budget, and the next
        # ones are refused, with what they applied and where to go on from.
        for index, duplex in enumerate(duplexes):
            duplex.send(big_line_start(2))
            if index < 4:
                await held(gateway_server, PART * (index + 1))
            else:
                refused = await duplex.reply()
                assert refused["error"] == "overloaded", refused
                assert refused["applied"] == 1 and refused["next_seq"] == 2, refused
        # With less than a line's worth left, a new streamed append does not start.
        status, replies = await stream_append(client, producers[5], line(2), seq=2)
        assert status == 503 and replies[0]["error"] == "overloaded", replies
        # The held lines complete and are appended; the budget is given back.
        for duplex, producer in zip(duplexes[:4], producers[:4], strict=True):
            duplex.send(big_line_end())
            reply = await duplex.reply()
            assert reply["next_seq"] == 3, reply
            acked[producer.run_id] += reply["ids"]
            duplex.close_body()
            assert (await duplex.reply())["done"] is True
    await held(gateway_server, 0)
    # The refused producers send their line again, now that the budget is free.
    for producer in producers[4:]:
        status, replies = await stream_append(
            client, producer, big_line_start(2), big_line_end(), seq=2
        )
        assert status == 200 and replies[-1]["done"] is True, replies
        acked[producer.run_id] += acked_ids(replies)
    for producer in producers:
        await producer.end()
        log = await logged(client, producer.run_id)
        assert [n for _, n in log] == [1, 2]
        assert [i for i, _ in log] == acked[producer.run_id]


async def test_the_budget_is_given_back_whatever_ends_the_stream(
    gateway_server: RunningServer, client: httpx.AsyncClient
) -> None:
    """A bad line, a client that leaves mid-line, a body that ends: nothing stays held."""
    producer = await ProducerClient.claim(client)
    status, replies = await stream_append(client, producer, line(1), b"not json\n", line(2))
    assert status == 200 and replies[-1]["error"] == "invalid_json"
    async with Duplex(gateway_server, producer) as duplex:
        duplex.send(b'{"event": "token", "data": "' + b"y" * 1000)
        await held(gateway_server, 1000 + 28)
    await held(gateway_server, 0)  # the client left mid-line
    status, replies = await stream_append(client, producer, line(3), line(4))
    assert status == 200 and replies[-1]["count"] == 2
    await held(gateway_server, 0)


def test_the_budget_must_hold_a_line() -> None:
    from gateway.settings import Settings

    with pytest.raises(ValueError, match="max_inflight_append_bytes"):
        Settings(max_event_bytes=1_048_576, max_inflight_append_bytes=1_048_576)
    Settings(max_event_bytes=1_048_576, max_inflight_append_bytes=1_048_576 + 4096)
