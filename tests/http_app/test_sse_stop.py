"""A disconnect always stops an SSE response, even when the first cancellation is lost
inside a library (Python 3.11's `asyncio.wait_for` drops one that arrives as its inner
task finishes), and a cancellation from outside is never swallowed by the response.

The response is driven through its ASGI interface; the subscription is a small async
generator standing in for a bridge call that drops one cancellation, which is exactly
the library behaviour under test.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import pytest

from gateway.http.framings.run import RunFraming
from gateway.http.streaming.observer import StreamObserver
from gateway.http.streaming.sse import SSEResponse
from gateway.http.streaming.subscriptions import SubscriptionRegistry
from gateway.values import StreamEvent, StreamItem

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(20)]

EVENT = StreamEvent("1-0", "token", b'"a"')


async def dropping_one_cancellation() -> AsyncIterator[Sequence[StreamItem]]:
    yield [EVENT]
    # Lost, as asyncio.wait_for loses it when its inner task just finished.
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(30)
    await asyncio.sleep(30)
    yield [EVENT]


async def idle() -> AsyncIterator[Sequence[StreamItem]]:
    yield [EVENT]
    await asyncio.sleep(30)
    yield [EVENT]


class Client:
    """The ASGI side: records what was sent, disconnects when told."""

    def __init__(self) -> None:
        self.event_sent = asyncio.Event()
        self.gone = asyncio.Event()
        self.bodies: list[bytes] = []

    async def receive(self) -> dict[str, Any]:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            self.bodies.append(message["body"])
            if b"id: 1-0" in message["body"]:
                self.event_sent.set()


def response(batches: Any) -> SSEResponse:
    return SSEResponse(
        steps=batches,
        framing=RunFraming("r"),
        observer=StreamObserver(None, run_id="r"),
        registry=SubscriptionRegistry(),
        track="r",
    )


SCOPE: dict[str, Any] = {"type": "http", "method": "GET", "path": "/v1/runs/r/stream"}


async def test_a_disconnect_stops_the_response_even_if_one_cancellation_is_lost() -> None:
    client = Client()
    task = asyncio.ensure_future(
        response(dropping_one_cancellation)(SCOPE, client.receive, client.send)
    )
    with anyio.fail_after(5):
        await client.event_sent.wait()
    client.gone.set()
    with anyio.fail_after(2):  # well under the 30 s the lost cancellation would cost
        await task
    assert task.done() and not task.cancelled()


async def test_an_outside_cancellation_landing_with_our_stop_is_re_raised() -> None:
    client = Client()
    task = asyncio.ensure_future(response(idle)(SCOPE, client.receive, client.send))
    with anyio.fail_after(5):
        await client.event_sent.wait()
    client.gone.set()
    await asyncio.sleep(0)  # the watcher sees the disconnect and stops the task...
    task.cancel()  # ...and the server cancels the request before the task ran again
    with anyio.fail_after(5):
        await asyncio.wait([task])
    assert task.cancelled(), "an outside cancellation was swallowed"
