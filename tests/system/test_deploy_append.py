"""Streamed appends through the shipped nginx and haproxy configs (real proxies, two real
`gateway serve` processes on one Redis; the fixtures of tests/system/test_deploy.py).

The proxy must pass a streamed request body on as it arrives and each ack back as it is
written, over HTTP/1.1 (aiohttp, which reads the reply while it still sends the body)
and HTTP/2 on the TLS listener (curl with nghttp2, fed line by line). Behind an nginx
that buffers request bodies (its default, i.e. the shipped file without the append
route), the Python producer client notices and falls back to batches, losing nothing.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import httpx
import orjson
import pytest

from gateway.client.producer import Producer
from tests.support.http_server import ProducerClient
from tests.support.proxies import DEPLOY, NGINX_BIN, GatewayProcess, Proxy
from tests.support.sse_client import read_stream
from tests.system import test_deploy

pytestmark = [pytest.mark.timeout(90), pytest.mark.anyio]
gateways = test_deploy.gateways
proxy = test_deploy.proxy
client = test_deploy.client
proxy_kinds = test_deploy.proxy_kinds
API_KEY = test_deploy.API_KEY
ACK_TIMEOUT = 5.0
CURL = shutil.which("curl")


def line(n: int) -> bytes:
    return orjson.dumps({"event": "token", "data": {"n": n}}) + b"\n"


def append_headers(producer: ProducerClient, seq: int) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {API_KEY}",
        "X-Producer-Token": producer.token,
        "X-Producer-Seq": str(seq),
        "Content-Type": "application/x-ndjson",
    }


async def events_of(client: httpx.AsyncClient, run_id: str) -> list[tuple[str, int]]:
    with anyio.fail_after(20):
        result = await read_stream(client, f"/v1/runs/{run_id}/stream")
    assert result.terminal is not None and result.terminal.event == "end"
    return [(f.id or "", f.json()["n"]) for f in result.events]


@proxy_kinds
async def test_acks_come_back_through_the_proxy_while_the_body_is_open(
    proxy: Proxy, client: httpx.AsyncClient
) -> None:
    """HTTP/1.1: each line is acknowledged before the next is sent. A proxy that held
    the body until its end would never deliver the first ack (timeout)."""
    producer = await ProducerClient.claim(client)
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def body() -> AsyncIterator[bytes]:
        while (part := await queue.get()) is not None:
            yield part

    ids: list[str] = []
    queue.put_nowait(b"\n")  # aiohttp sends the head with the first body chunk
    async with aiohttp.ClientSession() as session:
        url = f"{proxy.url}/v1/runs/{producer.run_id}/events"
        with anyio.fail_after(ACK_TIMEOUT):
            response = await session.post(url, data=body(), headers=append_headers(producer, 1))
        async with response:
            assert response.status == 200
            for n in range(1, 4):
                queue.put_nowait(line(n))
                with anyio.fail_after(ACK_TIMEOUT):
                    ack = orjson.loads(await response.content.readline())
                assert ack["next_seq"] == n + 1
                ids += ack["ids"]
            queue.put_nowait(None)
            with anyio.fail_after(ACK_TIMEOUT):
                done = orjson.loads(await response.content.readline())
    assert done == {"done": True, "count": 3, "last_id": ids[-1]}
    await producer.end()
    assert await events_of(client, producer.run_id) == list(zip(ids, [1, 2, 3], strict=True))


@pytest.mark.skipif(CURL is None, reason="curl not installed")
@pytest.mark.parametrize(
    "kind", [pytest.param(k, marks=test_deploy.needs[k]) for k in test_deploy.KINDS]
)
async def test_a_streamed_append_over_http2_is_acknowledged_line_by_line(
    kind: str, gateways: list[GatewayProcess]
) -> None:
    """HTTP/2 on the TLS listener: curl (nghttp2) sends each line as it reads it from a
    pipe; its ack comes back before the next line is written."""
    with Proxy(kind, backends=[g.url for g in gateways], tls=True) as tls_proxy:  # type: ignore[arg-type]
        assert tls_proxy.certificate is not None
        async with httpx.AsyncClient(
            base_url=tls_proxy.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10
        ) as plain:
            producer = await ProducerClient.claim(plain)
            headers = [f"-H{k}: {v}" for k, v in append_headers(producer, 1).items()]
            curl = await asyncio.create_subprocess_exec(
                str(CURL), "-sS", "-N", "--http2", "--cacert", str(tls_proxy.certificate.cert),
                "-X", "POST", "-T", ".", *headers, "-w", "%{http_version}\n",
                f"{tls_proxy.tls_url}/v1/runs/{producer.run_id}/events",
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )  # fmt: skip
            assert curl.stdin is not None and curl.stdout is not None
            acks: list[dict[str, Any]] = []
            try:
                for n in range(1, 4):
                    curl.stdin.write(line(n))
                    await curl.stdin.drain()
                    with anyio.fail_after(ACK_TIMEOUT):
                        acks.append(orjson.loads(await curl.stdout.readline()))
                    assert acks[-1]["next_seq"] == n + 1
                curl.stdin.close()
                with anyio.fail_after(ACK_TIMEOUT):
                    rest = (await curl.stdout.read()).decode().splitlines()
                    await curl.wait()
            finally:
                if curl.returncode is None:
                    curl.kill()
                    await curl.wait()
            assert orjson.loads(rest[0])["count"] == 3
            assert rest[1] == "2", "curl did not speak HTTP/2 to the proxy"
            await producer.end()
            ids = [i for ack in acks for i in ack["ids"]]
            assert await events_of(plain, producer.run_id) == list(zip(ids, [1, 2, 3], strict=True))


@proxy_kinds
async def test_the_producer_client_streams_through_the_proxy(
    proxy: Proxy, client: httpx.AsyncClient
) -> None:
    async with Producer(proxy.url, api_key=API_KEY, stream_seconds=30) as run:
        for n in range(60):
            await run.send("token", {"n": n})
            if n % 10 == 0:
                await anyio.sleep(0.05)  # the subject: tokens spread over 0.3 s
    assert run.fell_back is None and run.streams_sent == 1 and run.events_sent == 60
    assert [n for _, n in await events_of(client, run.run_id)] == list(range(60))


def buffering_nginx(tmp_path: Path) -> Path:
    """The shipped nginx template without its append route: nginx's default request
    buffering applies to POST …/events."""
    shipped = (DEPLOY / "nginx.conf.template").read_text()
    variant, removed = re.subn(
        r"\n        location ~ \^/v1/runs/\[\^/\]\+/events\$ \{.*?\n        \}\n",
        "\n",
        shipped,
        flags=re.S,
    )
    assert removed == 1
    path = tmp_path / "nginx-buffering.conf.template"
    path.write_text(variant)
    return path


@pytest.mark.skipif(not os.access(NGINX_BIN, os.X_OK), reason="nginx not installed")
async def test_the_producer_client_falls_back_behind_a_buffering_nginx(
    gateways: list[GatewayProcess], tmp_path: Path
) -> None:
    with Proxy("nginx", backends=[g.url for g in gateways], config=buffering_nginx(tmp_path)) as p:
        async with httpx.AsyncClient(
            base_url=p.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10
        ) as plain:
            async with Producer(p.url, api_key=API_KEY, stream_seconds=30) as run:
                for n in range(40):
                    await run.send("token", {"n": n})
                    if n % 10 == 0:
                        await anyio.sleep(0.2)  # spread over the buffered stream
                await run.flush()
                for n in range(40, 50):  # in batches once the stream's reply was read
                    await run.send("token", {"n": n})
            assert run.fell_back is not None and not run.streaming
            assert run.streams_sent == 1 and run.batches_sent >= 2
            assert run.events_sent == 50
            assert [n for _, n in await events_of(plain, run.run_id)] == list(range(50))


@pytest.mark.skipif(not os.access(NGINX_BIN, os.X_OK), reason="nginx not installed")
async def test_the_ack_check_catches_an_nginx_that_buffers_request_bodies(
    gateways: list[GatewayProcess], tmp_path: Path
) -> None:
    """Negative control for the ack test above: without the append route's settings no
    ack comes back while the body is open."""
    with Proxy("nginx", backends=[g.url for g in gateways], config=buffering_nginx(tmp_path)) as p:
        async with httpx.AsyncClient(
            base_url=p.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10
        ) as plain:
            producer = await ProducerClient.claim(plain)
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()

        async def body() -> AsyncIterator[bytes]:
            while (part := await queue.get()) is not None:
                yield part

        queue.put_nowait(line(1))
        async with aiohttp.ClientSession() as session:
            url = f"{p.url}/v1/runs/{producer.run_id}/events"
            with pytest.raises(TimeoutError), anyio.fail_after(1.0):
                # nginx answers only once it has the whole body
                await session.post(url, data=body(), headers=append_headers(producer, 1))
            queue.put_nowait(None)
