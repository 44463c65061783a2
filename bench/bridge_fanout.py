"""The in-process memory bridge alone (no HTTP): fan-out cost and resume storm.

1. 1 run x 100 subscribers x 5,000 events of ~200 B: events/s delivered (target
   >= 25,000) and Python CPU per delivered event (process CPU time / deliveries,
   target <= 40 us). The producer publishes one event per `publish` and yields to the
   loop after each (`await asyncio.sleep(0)`), as a streaming producer task would.
2. The producer's publish rate (same loop: it yields after every publish) with 1 and
   with 400 subscribers; target: the 400-subscriber rate >= half the 1-subscriber rate.
   Also the cost of the `publish` call itself at both counts.
3. Resume storm: 100 subscribers resume at once with a cursor 200 events behind the
   tail of an ended 10,000-event log; time until every one has its END (target <= 100 ms).

Reference (a per-subscriber polling design measured earlier on this machine):
~2,600 events/s at ~380 us per event, producer ~5 events/s at 400 subscribers, resume
storm ~640 ms.

Run: .venv/bin/python bench/bridge_fanout.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import uvloop
from _common import ROOT  # noqa: F401  (puts the repository on sys.path)

from gateway import MemoryStreamBridge, Settings
from gateway.values import End, RawJSON, StreamEvent

PAYLOAD = RawJSON(b'{"t":0.0,"p":"' + b"x" * 180 + b'"}')  # ~200 B


async def fanout(subscribers: int, events: int) -> dict[str, float]:
    bridge = MemoryStreamBridge(Settings(max_events_per_run=max(10_000, events)))
    claim = await bridge.claim("fan", lease_seconds=3600)
    counts = [0] * subscribers
    ready = asyncio.Event()
    attached = 0

    async def reader(i: int) -> None:
        # Reads as the SSE response does: every ready item in one batch per step.
        nonlocal attached
        batches = bridge.subscribe_batches("fan", heartbeat_interval=60)
        attached += 1
        if attached == subscribers:
            ready.set()
        n = 0
        async for batch in batches:
            n += sum(1 for item in batch if isinstance(item, StreamEvent))
            if isinstance(batch[-1], End):
                break
        counts[i] = n

    tasks = [asyncio.create_task(reader(i)) for i in range(subscribers)]
    await ready.wait()
    await asyncio.sleep(0.01)  # every reader is parked at the tail
    in_publish = 0.0
    cpu0, start = time.process_time(), time.perf_counter()
    for _ in range(events):
        t = time.perf_counter()
        await bridge.publish("fan", "token", PAYLOAD, producer_token=claim.token)
        in_publish += time.perf_counter() - t
        await asyncio.sleep(0)
    produced = time.perf_counter() - start
    await bridge.publish_end("fan", "success", producer_token=claim.token)
    await asyncio.gather(*tasks)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    await bridge.close()
    delivered = sum(counts)
    assert delivered == subscribers * events, (delivered, subscribers * events)
    return {
        "rate": delivered / wall,
        "cpu_us": cpu / delivered * 1e6,
        "publish_rate": events / produced,
        "publish_us": in_publish / events * 1e6,
    }


async def resume_storm(subscribers: int, missed: int, log: int) -> tuple[float, bool]:
    bridge = MemoryStreamBridge(Settings(max_events_per_run=log))
    claim = await bridge.claim("storm", lease_seconds=3600)
    ids: list[str] = []
    for _ in range(log // 500):
        result = await bridge.publish_many(
            "storm", [("token", PAYLOAD)] * 500, producer_token=claim.token
        )
        ids += result.ids
    await bridge.publish_end("storm", "success", producer_token=claim.token)
    cursor = ids[-missed - 1]
    expected = ids[-missed:]

    async def resume() -> bool:
        got = []
        async for item in bridge.subscribe("storm", cursor):
            if isinstance(item, StreamEvent):
                got.append(item.id)
            elif isinstance(item, End):
                return got == expected
            else:
                return False
        return False

    start = time.perf_counter()
    exact = await asyncio.gather(*(resume() for _ in range(subscribers)))
    seconds = time.perf_counter() - start
    await bridge.close()
    return seconds, all(exact)


async def main(quick: bool) -> None:
    await fanout(10, 500)  # warm-up
    one = await fanout(100, 5_000)
    print("1. 1 run x 100 subscribers x 5,000 events of ~200 B (in process, uvloop)")
    print(
        f"  delivered: {one['rate']:>10,.0f} events/s   (target >= 25,000; polling design ~2,600)"
    )
    print(f"  Python CPU: {one['cpu_us']:9.2f} us per delivered event (target <= 40; polling ~380)")

    events = 1_000 if quick else 2_000
    single = await fanout(1, events)
    many = await fanout(400, events)
    print(f"2. producer publish rate, {events:,} events, yielding to the loop after each")
    print(
        f"  1 subscriber:    {single['publish_rate']:>9,.0f} events/s"
        f"   publish call {single['publish_us']:5.2f} us"
    )
    print(
        f"  400 subscribers: {many['publish_rate']:>9,.0f} events/s"
        f"   publish call {many['publish_us']:5.2f} us"
    )
    ratio = many["publish_rate"] / single["publish_rate"]
    call_ratio = single["publish_us"] / many["publish_us"]
    print(
        f"  ratio 400/1: wall rate {ratio:.2f} (the loop is shared with 400 readers that keep"
        f" up);\n  publish call alone {call_ratio:.2f}  (target >= 0.5; polling ~5 events/s at 400)"
    )

    seconds, exact = await resume_storm(100, 200, 10_000)
    print("3. resume storm: 100 subscribers x 200 missed events from a 10,000-event log")
    print(
        f"  all END after {seconds * 1e3:6.1f} ms, exact: {exact}"
        "  (target <= 100 ms; per-subscriber design ~640 ms)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer events for figure 2")
    uvloop.run(main(parser.parse_args().quick))
