"""RSS of one real `gateway serve` (memory bridge, open mode) under hostile clients
(figures in docs/operations.md, "Memory under hostile clients").

1. trailers: N connections send a chunked request and then trailer lines without end
   for S seconds, each reconnecting as soon as the server closes it.
2. stuck: N SSE readers send their request and never read while a producer appends
   EVENTS events of SIZE bytes to their run.

Run: .venv/bin/python bench/hostile_memory.py trailers --connections 2 --seconds 9
     .venv/bin/python bench/hostile_memory.py stuck --readers 1000 --events 2000 --size 1024
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import tempfile
import threading
import time
from pathlib import Path

import _common  # noqa: F401  (puts the repository on sys.path)
import httpx

from tests.system.test_hostile_clients import (
    CHUNKED_CLAIM,
    CHUNKED_PROBE,
    MB,
    GatewayProcess,
    gateway_process,
)

TRAILER = b"X-Trailer: " + b"t" * 40 + b"\r\n"


def _flood(port: int, head: bytes, stop: threading.Event, reconnects: list[int]) -> None:
    block = TRAILER * (65536 // len(TRAILER))
    while not stop.is_set():
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", port), timeout=5) as sock,
        ):
            sock.sendall(head)
            while not stop.is_set():
                sock.sendall(block)
        reconnects[0] += 1


def _peak_during(gateway: GatewayProcess, seconds: float, peak: int) -> int:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        peak = max(peak, gateway.rss_bytes())
        time.sleep(0.05)
    return peak


def trailers(connections: int, seconds: float, route: str) -> None:
    head = CHUNKED_PROBE if route == "probe" else CHUNKED_CLAIM
    with gateway_process(Path(tempfile.mkdtemp())) as gateway:
        before = gateway.rss_bytes()
        stop, reconnects = threading.Event(), [0]
        threads = [
            threading.Thread(target=_flood, args=(gateway.port, head, stop, reconnects))
            for _ in range(connections)
        ]
        for thread in threads:
            thread.start()
        peak = _peak_during(gateway, seconds, before)
        stop.set()
        for thread in threads:
            thread.join()
        print(
            f"trailers: {connections} connections x {seconds:g} s ({route}), "
            f"{reconnects[0]} refused and reconnected; RSS {before / MB:.1f} MB before, "
            f"{peak / MB:.1f} MB peak, {gateway.rss_bytes() / MB:.1f} MB after"
        )


def stuck(readers: int, events: int, size: int) -> None:
    env = {"GATEWAY_SSE_SEND_TIMEOUT_SECONDS": "300"}  # keep them for the measurement
    with (
        gateway_process(Path(tempfile.mkdtemp()), **env) as gateway,
        httpx.Client(base_url=gateway.base, timeout=30) as client,
    ):
        claim = client.post("/v1/runs", json={}).json()
        run_id, token = claim["run_id"], claim["producer_token"]
        before = gateway.rss_bytes()
        sockets = []
        try:
            for _ in range(readers):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.connect(("127.0.0.1", gateway.port))
                request = f"GET /v1/runs/{run_id}/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                sock.sendall(request.encode())
                sockets.append(sock)
            opened = _peak_during(gateway, 2, 0)
            batch = [{"event": "token", "data": "x" * size}] * 50
            peak = opened
            for _ in range(0, events, len(batch)):
                client.post(
                    f"/v1/runs/{run_id}/events",
                    json={"events": batch},
                    headers={"X-Producer-Token": token},
                )
                peak = max(peak, gateway.rss_bytes())
            peak = _peak_during(gateway, 10, peak)
        finally:
            for sock in sockets:
                sock.close()
        print(
            f"stuck: {readers} readers, {events} x {size} B appended; RSS {before / MB:.1f} MB "
            f"before, {opened / MB:.1f} MB with them open, {peak / MB:.1f} MB peak "
            f"({(peak - before) / readers / 1024:.0f} KiB a reader)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    flood = sub.add_parser("trailers")
    flood.add_argument("--connections", type=int, default=2)
    flood.add_argument("--seconds", type=float, default=9.0)
    flood.add_argument("--route", choices=["probe", "claim"], default="probe")
    readers = sub.add_parser("stuck")
    readers.add_argument("--readers", type=int, default=1000)
    readers.add_argument("--events", type=int, default=2000)
    readers.add_argument("--size", type=int, default=1024)
    args = parser.parse_args()
    if args.what == "trailers":
        trailers(args.connections, args.seconds, args.route)
    else:
        stuck(args.readers, args.events, args.size)


if __name__ == "__main__":
    main()
