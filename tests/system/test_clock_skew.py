"""One clock per lease decision: a gateway whose clock is a minute ahead of its Redis's
(as a Redis a minute behind would be) still reports a lease that has not run out, and
its streamed appends are not cut as idle at once; one whose clock is a minute behind (a
Redis a minute ahead) ends a run whose producer vanished when its lease ends, not a
minute later.

The lease's expiry is reported in the gateway's own clock, from the lease's length as
Redis counted it, never by comparing Redis' `lease_until` with the gateway's time.
The skew comes from libfaketime preloaded into the real gateway process (Debian's
`faketime`; it cannot run Debian's redis-server, whose jemalloc it recurses into, so the
gateway is the one moved).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import httpx
import orjson
import pytest

from tests.support.proxies import GatewayProcess
from tests.support.redis_servers import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.system, pytest.mark.timeout(60)]

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
SKEW = 60  # seconds the gateway's clock runs ahead of Redis'


def _skewed(key_prefix: str, skew: str) -> Iterator[GatewayProcess]:
    if not LIBFAKETIME.exists():
        pytest.skip("libfaketime is not installed (scripts/bootstrap installs faketime)")
    with (
        RedisServer() as redis,
        GatewayProcess(
            redis.url,
            key_prefix=key_prefix,
            heartbeat=0.5,  # the liveness monitor's interval
            env={"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": skew},
        ) as gateway,
    ):
        yield gateway


@pytest.fixture
def skewed_gateway(key_prefix: str) -> Iterator[GatewayProcess]:
    yield from _skewed(key_prefix, f"+{SKEW}s")


@pytest.fixture
def lagging_gateway(key_prefix: str) -> Iterator[GatewayProcess]:
    yield from _skewed(key_prefix, f"-{SKEW}s")


async def test_a_vanished_producer_s_run_ends_when_its_lease_does(
    lagging_gateway: GatewayProcess,
) -> None:
    """The liveness check compares the lease's end with this process's clock: the end
    must be in it (what Redis says is left, from now), not Redis' `lease_until`, which
    here lies a minute in the gateway's future."""
    async with httpx.AsyncClient(base_url=lagging_gateway.url, timeout=10) as client:
        claimed = (await client.post("/v1/runs", json={"lease_seconds": 1})).json()
        run_id = claimed["run_id"]
        append = await client.post(
            f"/v1/runs/{run_id}/events",
            headers={"X-Producer-Token": claimed["producer_token"]},
            json={"event": "t", "data": 1},
        )
        assert append.status_code in (200, 201), append.text
        # A reader, so that this gateway watches the run; the producer is never heard again.
        with anyio.fail_after(15):  # the lease (1 s) and a few checks, far under SKEW
            async with client.stream("GET", f"/v1/runs/{run_id}/stream") as stream:
                async for line in stream.aiter_lines():
                    if line.startswith("event: end"):
                        break
        info = (await client.get(f"/v1/runs/{run_id}")).json()
    assert info["status"] == "producer_lost", info


async def test_a_claim_reports_a_lease_in_the_gateways_clock(
    skewed_gateway: GatewayProcess,
) -> None:
    async with httpx.AsyncClient(base_url=skewed_gateway.url, timeout=10) as client:
        reply = await client.post("/v1/runs", json={"lease_seconds": 30})
        assert reply.status_code == 201
        expires = reply.json()["lease_expires_at"]
        # The gateway's clock is SKEW ahead of ours: its lease ends 30 s after its now.
        assert expires > time.time() + SKEW + 20
        run_id, token = reply.json()["run_id"], reply.json()["producer_token"]
        lease = await client.post(
            f"/v1/runs/{run_id}/lease", headers={"X-Producer-Token": token}, json={}
        )
        assert lease.status_code == 200, lease.text
        assert lease.json()["lease_expires_at"] > time.time() + SKEW + 20


async def test_a_streamed_append_is_not_cut_as_idle(skewed_gateway: GatewayProcess) -> None:
    async with httpx.AsyncClient(base_url=skewed_gateway.url, timeout=10) as client:
        claimed = (await client.post("/v1/runs", json={"lease_seconds": 30})).json()
        sent = anyio.Event()

        async def body() -> AsyncIterator[bytes]:
            yield b'{"event": "t", "data": 1}\n'
            await anyio.sleep(1.0)  # the scenario: a body quiet for a second, within its lease
            yield b'{"event": "t", "data": 2}\n'
            sent.set()

        with anyio.fail_after(20):
            response = await client.post(
                f"/v1/runs/{claimed['run_id']}/events",
                content=body(),
                headers={
                    "X-Producer-Token": claimed["producer_token"],
                    "Content-Type": "application/x-ndjson",
                },
            )
        replies = [orjson.loads(line) for line in response.content.splitlines()]
    assert sent.is_set()
    assert [r.get("error") for r in replies] == [None, None, None], replies
    assert replies[-1]["done"] is True and replies[-1]["count"] == 2
