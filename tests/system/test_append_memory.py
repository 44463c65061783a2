"""256 streamed appends from one key (the default per-key limit), each sending one line
of a 1 MiB payload at once, against a real `gateway serve` process on Redis: the
process's budget of bytes received but not yet appended (`max_inflight_append_bytes`,
default 64 MiB) refuses the streams past it with the error line `overloaded` (a stream
that would start with less than a line's worth left gets 503 `overloaded`), every line
acknowledged is in its run's log, and the process's peak RSS (`VmHWM`) stays well under
the shipped pod limit of 512 MiB. Without the budget it went from 58 to 1,106 MiB."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest

from tests.system.test_hostile_clients import gateway_process

pytestmark = [pytest.mark.anyio, pytest.mark.system, pytest.mark.timeout(300)]

STREAMS = 256
PAYLOAD = 1_048_576 - 64  # a 1 MiB payload (max_event_bytes), as a JSON string
POD_LIMIT = 512 * 1024 * 1024
PIECE = 65_536


def peak_rss(pid: int) -> int:
    for entry in Path(f"/proc/{pid}/status").read_text().splitlines():
        if entry.startswith("VmHWM:"):
            return int(entry.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def chunked(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


def dechunk(raw: bytes) -> bytes:
    body, rest = b"", raw
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        body, rest = body + rest[:size], rest[size + 2 :]
    return body


class Collector(asyncio.Protocol):
    """A raw connection that keeps every byte it receives, whatever ends it (a gateway
    that refused a stream closes with the rest of the body unread: a reset)."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.data += data

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


async def one_stream(
    port: int, run_id: str, token: str, line: bytes, all_sent: asyncio.Event, sent: list[int]
) -> tuple[int, list[dict[str, Any]]]:
    """One streamed append: all of its line but the newline, then (once every stream
    got that far) the newline and the body's end. (status, reply lines); (0, []) when the
    connection was reset before the reply could be read (a refusal with the body still
    arriving: the client retries, and nothing of it was acknowledged)."""
    loop = asyncio.get_running_loop()
    transport, collector = await loop.create_connection(Collector, "127.0.0.1", port)
    # `Expect: 100-continue`: a stream refused before it starts is answered at once, and
    # its body never sent (one that starts answers 200 at once, its acks to follow).
    transport.write(
        (
            f"POST /v1/runs/{run_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n"
            f"X-Producer-Token: {token}\r\nX-Producer-Seq: 1\r\nConnection: close\r\n"
            f"Expect: 100-continue\r\n\r\n"
        ).encode()
    )
    while b"\r\n\r\n" not in collector.data and not collector.closed.done():
        await asyncio.sleep(0.01)
    if collector.data.startswith(b"HTTP/1.1 100"):
        del collector.data[: collector.data.index(b"\r\n\r\n") + 4]
    go_on = not collector.data or collector.data.startswith(b"HTTP/1.1 200")
    if go_on:
        for start in range(0, len(line) - 1, PIECE):
            transport.write(chunked(line[start : min(start + PIECE, len(line) - 1)]))
    sent[0] -= 1
    if sent[0] == 0:
        all_sent.set()
    await all_sent.wait()
    if go_on and not transport.is_closing():
        transport.write(chunked(b"\n") + b"0\r\n\r\n")
    await collector.closed  # the gateway closes after its reply (Connection: close)
    if not collector.data:
        return 0, []
    status_line, _, rest = bytes(collector.data).partition(b"\r\n")
    headers, _, body = rest.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in headers.lower():
        body = dechunk(body)
    return int(status_line.split()[1]), [orjson.loads(p) for p in body.splitlines() if p.strip()]


async def test_256_streams_of_1_mib_lines_stay_under_the_pod_limit(
    tmp_path: Path, redis_url: str, key_prefix: str
) -> None:
    env = {"GATEWAY_REDIS_URL": redis_url, "GATEWAY_REDIS_KEY_PREFIX": key_prefix}
    line = orjson.dumps({"event": "token", "data": "x" * PAYLOAD}) + b"\n"
    with gateway_process(tmp_path, **env) as gateway:
        async with httpx.AsyncClient(base_url=gateway.base, timeout=30) as client:
            claims = []
            for _ in range(STREAMS):
                response = await client.post("/v1/runs", json={})
                assert response.status_code == 201, response.text
                claims.append((response.json()["run_id"], response.json()["producer_token"]))
            before = peak_rss(gateway.proc.pid)
            all_sent, sent = asyncio.Event(), [STREAMS]
            with anyio.fail_after(240):
                results = await asyncio.gather(
                    *(
                        one_stream(gateway.port, run, tok, line, all_sent, sent)
                        for run, tok in claims
                    )
                )
            peak = peak_rss(gateway.proc.pid)
            appended = refused = reset = 0
            for (run_id, _), (status, replies) in zip(claims, results, strict=True):
                acked = [i for reply in replies if "ids" in reply for i in reply["ids"]]
                run = (await client.get(f"/v1/runs/{run_id}")).json()
                if not replies or not ({"done", "error"} & set(replies[-1])):
                    # the reply was cut by a reset: what it acknowledged is in the log
                    reset += 1
                    assert run["retained_events"] <= 1 and len(acked) <= 1, (run, replies)
                    assert not acked or run["last_event_id"] == acked[0]
                    continue
                # every acknowledged line is in the log, and nothing else
                assert run["retained_events"] == len(acked), (run, replies)
                assert not acked or run["last_event_id"] == acked[-1]
                if replies[-1].get("error") == "overloaded":
                    assert status in (200, 503), (status, replies)
                    refused += 1
                else:
                    assert status == 200 and acked, (status, replies)
                    assert replies[-1] == {"done": True, "count": 1, "last_id": acked[0]}
                    appended += 1
    print(
        f"appended {appended}, refused {refused} (+{reset} reset), "
        f"RSS {before >> 20} -> {peak >> 20} MiB"
    )
    assert refused > 0 and appended > 0
    assert peak < POD_LIMIT * 0.8, f"peak RSS {peak >> 20} MiB"
