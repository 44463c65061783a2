"""Helpers for the fault and scale-out tests: a producer with idempotent accounting and a
reconnecting SSE follower that records exactly what it saw (gateway processes and load
balancers come from tests/support/proxies.py).

    producer = await HttpProducer.claim(client, lease_seconds=60)
    await producer.publish_seq(7)            # exactly once, even across 503s
    follower = Follower(lambda: client, run_id); tg.start_soon(follower.run)

Every wait polls a condition with a deadline.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

from tests.support.sse_client import Frame, iter_frames


async def poll(
    what: str, check: Callable[[], Awaitable[bool]], timeout: float, interval: float = 0.02
) -> None:
    """Await `check()` until it is true, or fail after `timeout` seconds."""
    with anyio.fail_after(timeout):
        while not await check():
            await anyio.sleep(interval)


async def metric(client: httpx.AsyncClient, name: str) -> float:
    text = (await client.get("/metrics")).text
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# --------------------------------------------------------------------------- producer


# 503 from the gateway; 502/504 from a load balancer whose backend died mid-request.
MAYBE_APPLIED = frozenset({502, 503, 504})


@dataclass
class HttpProducer:
    """A producer that publishes `{"seq": n}` events exactly once across 503s.

    A publish answered 503 may or may not have been applied. Before re-sending, the
    producer reads the run record back (`last_event_id`): if the newest event is newer
    than the last id it knows, that event is its write (it is the only writer).
    """

    client: httpx.AsyncClient
    run_id: str
    token: str
    epoch: int = 1
    tag: str = ""
    ids: list[str] = field(default_factory=list)
    unavailable: list[httpx.Response] = field(default_factory=list)
    fenced: list[httpx.Response] = field(default_factory=list)
    applied_after_503: int = 0

    @classmethod
    async def claim(cls, client: httpx.AsyncClient, tag: str = "", **body: Any) -> HttpProducer:
        response = await client.post("/v1/runs", json=body)
        assert response.status_code == 201, response.text
        claim = response.json()
        return cls(client, claim["run_id"], claim["producer_token"], claim["epoch"], tag)

    @property
    def headers(self) -> dict[str, str]:
        return {"X-Producer-Token": self.token}

    async def post_event(self, seq: int) -> httpx.Response:
        return await self.client.post(
            f"/v1/runs/{self.run_id}/events",
            json={"event": "token", "data": {"seq": seq, "by": self.tag}},
            headers=self.headers,
        )

    async def _last_event_id(self, deadline: float) -> str | None:
        while True:
            try:
                response = await self.client.get(f"/v1/runs/{self.run_id}")
                if response.status_code == 200:
                    last: str | None = response.json()["last_event_id"]
                    return last
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {self.run_id} unreadable")
            await anyio.sleep(0.1)

    async def publish_seq(self, seq: int, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        backoff = 0.05
        while True:
            try:
                response = await self.post_event(seq)
            except httpx.TransportError:
                response = None  # the gateway went away mid-request: same as a 503
            if response is not None and response.status_code == 200:
                entry_id: str = response.json()["ids"][0]
                self.ids.append(entry_id)
                return entry_id
            if response is not None and response.status_code not in MAYBE_APPLIED:
                raise AssertionError(f"publish {seq}: {response.status_code} {response.text}")
            if response is not None:
                self.unavailable.append(response)
            if time.monotonic() > deadline:
                raise TimeoutError(f"publish {seq} kept failing")
            await anyio.sleep(backoff)
            backoff = min(backoff * 2, 0.5)
            last = await self._last_event_id(deadline)
            known = self.ids[-1] if self.ids else None
            if last is not None and last != known:
                self.ids.append(last)  # the failed request had been applied
                self.applied_after_503 += 1
                return last

    async def end(self, status: str = "success", timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:  # END is idempotent: re-sending it is safe
            with contextlib.suppress(httpx.TransportError):
                response = await self.client.post(
                    f"/v1/runs/{self.run_id}/end", json={"status": status}, headers=self.headers
                )
                if response.status_code == 200:
                    result: dict[str, Any] = response.json()
                    return result
                assert response.status_code in MAYBE_APPLIED, response.text
            if time.monotonic() > deadline:
                raise TimeoutError("end kept failing")
            await anyio.sleep(0.1)


# --------------------------------------------------------------------------- follower


@dataclass
class Follower:
    """Follows a run's SSE stream to its end, reconnecting with `Last-Event-ID`.

    Reconnects after: a clean end without `end`/`gap` (graceful drain), an
    `unavailable` frame, a dropped connection, a 5xx (backend down). Stops at `end`,
    `gap`, a 404, or `stop()`.
    """

    client_factory: Callable[[], httpx.AsyncClient]
    run_id: str
    path: str = ""
    events: list[Frame] = field(default_factory=list)
    terminal: Frame | None = None
    status: int | None = None  # set when the follower stopped on an HTTP error (404)
    connections: int = 0
    retries: list[int] = field(default_factory=list)  # the `retry:` hint of each response
    shutdown_comments: int = 0
    unavailable_frames: int = 0
    drops: int = 0
    refused: int = 0
    arrivals: dict[str, float] = field(default_factory=dict)  # id -> monotonic time
    done: anyio.Event = field(default_factory=anyio.Event)
    done_at: float = 0.0  # monotonic time it stopped

    @property
    def ids(self) -> list[str]:
        return [f.data_id for f in self.events if f.data_id is not None]

    @property
    def seqs(self) -> list[int]:
        return [f.json()["seq"] for f in self.events]

    def cursor(self) -> str | None:
        return self.events[-1].id if self.events else None

    async def run(self, timeout: float = 120.0) -> None:
        try:
            with anyio.fail_after(timeout):
                await self._run()
        finally:
            self.done_at = time.monotonic()
            self.done.set()

    async def _run(self) -> None:
        path = self.path or f"/v1/runs/{self.run_id}/stream"
        while True:
            headers = {}
            if (cursor := self.cursor()) is not None:
                headers["Last-Event-ID"] = cursor
            retry_ms = 100
            try:
                async with self.client_factory().stream("GET", path, headers=headers) as r:
                    if r.status_code == 404:
                        self.status = 404
                        return
                    if r.status_code >= 500:
                        self.refused += 1
                        await r.aread()
                    else:
                        assert r.status_code == 200, r.status_code
                        self.connections += 1
                        async for frame in iter_frames(r):
                            if frame.retry is not None:
                                self.retries.append(frame.retry)
                                retry_ms = frame.retry
                            if frame.data_id is not None:
                                self.arrivals[frame.id] = time.monotonic()
                                self.events.append(frame)
                            elif frame.event in ("end", "gap"):
                                self.terminal = frame
                                return
                            elif frame.event == "unavailable":
                                self.unavailable_frames += 1
                            elif any(c.startswith(b"shutdown") for c in frame.comments):
                                self.shutdown_comments += 1
            except httpx.TransportError:
                self.drops += 1
            # Honour the server's hint, scaled down: tests need not wait whole seconds.
            await anyio.sleep(min(retry_ms, 3000) / 10_000)
