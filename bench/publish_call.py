"""One publish at a time on the Redis bridge: CPU per `bridge.publish` call (one event,
~200-byte payload, awaited before the next), beside the floor measured in the same run:
one asyncio round trip of `PING` on a bare protocol (write, wait, read), which every
awaited command pays whatever client sends it.

Rounds alternate the two; the figures are the median and the lowest round.

Run: .venv/bin/python bench/publish_call.py [--quick]
(A/B: `PYTHONPATH=<checkout>` runs another commit's bridge.)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from _common import RedisServer

from gateway import RedisStreamBridge, Settings


class _Ping(asyncio.Protocol):
    def __init__(self) -> None:
        self.reply: asyncio.Future[bytes] | None = None

    def data_received(self, data: bytes) -> None:
        if self.reply is not None and not self.reply.done():
            self.reply.set_result(data)


async def bare_pings(port: int, calls: int) -> float:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_connection(_Ping, "127.0.0.1", port)
    started = time.process_time()
    for _ in range(calls):
        protocol.reply = loop.create_future()
        transport.write(b"PING\r\n")
        await protocol.reply
    spent = time.process_time() - started
    transport.close()
    return spent / calls * 1e6


async def publishes(bridge: RedisStreamBridge, token: str, calls: int) -> float:
    data = {"type": "messages", "i": 1, "text": "x" * 160}
    started = time.process_time()
    for _ in range(calls):
        await bridge.publish("publish-call", "messages", data, producer_token=token)
    return (time.process_time() - started) / calls * 1e6


async def main(rounds: int, calls: int) -> None:
    with RedisServer() as server:
        settings = Settings(redis_url=server.url, max_events_per_run=10_000)
        async with RedisStreamBridge.connect(settings) as bridge:
            token = (await bridge.claim("publish-call", lease_seconds=3600)).token
            await publishes(bridge, token, 500)  # warm up: scripts loaded, connection kept
            floor, publish = [], []
            for _ in range(rounds):
                floor.append(await bare_pings(server.port, calls))
                publish.append(await publishes(bridge, token, calls))
    print(f"CPU per awaited call, µs ({rounds} rounds of {calls} calls, median / lowest round)")
    for name, values in (("bridge.publish", publish), ("bare PING round trip", floor)):
        print(f"  {name:22} {statistics.median(values):7.1f} / {min(values):7.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="3 rounds of 2,000 calls")
    args = parser.parse_args()
    asyncio.run(main(3, 2_000) if args.quick else main(5, 5_000))
