"""A Redis that lost writes it had acknowledged: the run's ids never repeat, and every
reader whose position was lost is told with a gap.

The server restarts from a snapshot taken before the last two appends: what a failover
to a replica that had not received them, or a restart that lost them, leaves behind
(the log's newest entry is older than ids readers hold). Run with the restarted server's
clock in step, and a minute behind the run's ids, as a promoted replica's may be: with
Redis' own ids the next event would then take the first lost event's very id, and with
its clock in step a reader at a lost id would be handed the next event as if it followed.

(A clock behind is made by moving the log's last id a minute ahead before the events
that follow, with XSETID on the real server: the ids then run ahead of the server's clock
exactly as they would on a server whose clock is behind the one that issued them.
`faketime` cannot run Debian's redis-server: libfaketime 0.9.10 recurses in
clock_gettime during jemalloc's start-up.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from gateway.bridge.provider import open_bridge
from gateway.bridge.rules import READ_BATCH
from gateway.cursor import EPOCH_SPAN, parse_cursor
from gateway.errors import BackendUnavailable
from gateway.redis import fanout
from gateway.redis.keys import run_keys
from gateway.settings import Settings
from gateway.values import End, Heartbeat, StreamEvent, StreamGap, StreamItem
from tests.support.redis_servers import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


async def items_until_terminal(it: AsyncIterator[StreamItem]) -> list[StreamItem]:
    out: list[StreamItem] = []
    async for item in it:
        if isinstance(item, Heartbeat):
            continue
        out.append(item)
        if isinstance(item, End | StreamGap):
            break
    return out


async def publish_retrying(bridge: Any, run_id: str, token: str, value: int) -> str:
    """One append once the gateway's connections reach the restarted server."""
    with anyio.fail_after(20):
        while True:
            try:
                result = await bridge.publish(run_id, "t", value, producer_token=token)
                return str(result.ids[0])
            except BackendUnavailable:
                await anyio.sleep(0.05)  # reconnecting: the server is starting


@pytest.mark.parametrize("clock", ["in_step", "behind"])
async def test_lost_writes_reuse_no_id_and_every_reader_learns_of_them(
    clock: str, key_prefix: str
) -> None:
    server = RedisServer("--appendonly", "no", "--save", "")
    server.start()
    raw = server.client()
    settings = Settings(
        redis_url=server.url,
        redis_key_prefix=key_prefix,
        heartbeat_interval_seconds=0.5,
        lease_seconds=120,
        redis_command_timeout_seconds=2,
    )
    try:
        async with open_bridge(settings) as bridge:
            claim = await bridge.claim("rw")
            kept = list(
                (
                    await bridge.publish_many(
                        "rw", [("t", i) for i in range(2)], producer_token=claim.token
                    )
                ).ids
            )
            if clock == "behind":  # the ids from here on run a minute ahead of its clock
                ahead = parse_cursor(kept[-1])[0] + 60_000
                raw.execute_command("XSETID", f"{key_prefix}{{rw}}:log", f"{ahead}-0")
            kept += (await bridge.publish("rw", "t", 2, producer_token=claim.token)).ids
            raw.save()  # the snapshot the server comes back with
            lost = [
                (await bridge.publish("rw", "t", i, producer_token=claim.token)).ids[0]
                for i in (3, 4)
            ]
            # A live reader that was handed every event, lost ones included.
            live = bridge.subscribe("rw", None, heartbeat_interval=0.5)
            with anyio.fail_after(10):
                seen = [item async for item in _events(live, 5)]
            assert [item.id for item in seen] == kept + lost

            server.restart(kill=True)  # back from the snapshot: the last two are gone
            after = await publish_retrying(bridge, "rw", claim.token, 5)
            handed_out = set(kept + lost)
            assert after not in handed_out  # an id is never reused for the run
            # A new epoch: no id of the first can be handed out again (with Redis' own ids,
            # a clock behind would have given this event the first lost one's id).
            assert parse_cursor(after)[1] >= EPOCH_SPAN

            # The live reader gets a gap within a heartbeat or two, never heartbeats forever
            # and never the new event as if it followed the lost ones. (If its backend read
            # failed meanwhile, it resumes from its position, as a client does.)
            with anyio.fail_after(10):
                try:
                    rest = await items_until_terminal(live)
                except BackendUnavailable:
                    rest = await items_until_terminal(bridge.subscribe("rw", lost[-1]))
            assert [type(item) for item in rest] == [StreamGap], rest
            gap = rest[0]
            assert isinstance(gap, StreamGap) and gap.reason == "unknown_position"
            assert gap.requested_event_id == lost[-1]

            # Resuming readers: a lost position is a gap; a kept one goes on exactly.
            await bridge.publish_end("rw", "success", producer_token=claim.token)
            with anyio.fail_after(10):
                for cursor in lost:
                    got = await items_until_terminal(bridge.subscribe("rw", cursor))
                    assert [(type(i), getattr(i, "reason", None)) for i in got] == [
                        (StreamGap, "unknown_position")
                    ]
                got = await items_until_terminal(bridge.subscribe("rw", kept[-1]))
            assert [item.id for item in got if isinstance(item, StreamEvent)] == [after]
            assert isinstance(got[-1], End) and got[-1].id not in handed_out
    finally:
        raw.close()
        server.close()


async def _events(it: AsyncIterator[StreamItem], count: int) -> AsyncIterator[StreamEvent]:
    taken = 0
    async for item in it:
        if isinstance(item, StreamEvent):
            yield item
            taken += 1
            if taken == count:
                return


async def _until_heartbeat(it: AsyncIterator[StreamItem]) -> list[StreamItem]:
    """Items up to the first heartbeat (a reader with nothing to deliver) or the end."""
    out: list[StreamItem] = []
    async for item in it:
        out.append(item)
        if isinstance(item, Heartbeat | End | StreamGap):
            break
    return out


async def _one_by_one(bridge: Any, run_id: str, cursor: str) -> AsyncIterator[StreamItem]:
    """`open_stream`'s reader (its first read prefetched), item by item."""
    _, follow = await bridge.open_stream(run_id, cursor)
    async for batch in follow():
        for item in batch:
            yield item


@pytest.mark.parametrize("opened", ["subscribe", "open_stream"])
async def test_a_window_the_log_lost_is_not_served_after_a_kept_position(
    opened: str, key_prefix: str
) -> None:
    """The log goes back under a live feed whose listener heard nothing (a failover the
    pub/sub connection has not noticed yet): a reader resuming at a kept id must not be
    handed the lost entries from the window. The log is put back with DUMP/RESTORE,
    which publishes nothing, as a promoted replica announces nothing."""
    server = RedisServer("--appendonly", "no", "--save", "")
    server.start()
    raw = server.client()
    keys = run_keys(key_prefix, "ra")
    settings = Settings(
        redis_url=server.url,
        redis_key_prefix=key_prefix,
        lease_seconds=120,
        heartbeat_interval_seconds=0.3,  # (`open_stream`'s readers')
    )
    try:
        async with open_bridge(settings) as bridge:
            claim = await bridge.claim("ra")
            kept = list(
                (
                    await bridge.publish_many(
                        "ra", [("t", i) for i in range(3)], producer_token=claim.token
                    )
                ).ids
            )
            snapshot = {key: raw.dump(key) for key in (keys.log, keys.meta)}
            live = bridge.subscribe("ra", None, heartbeat_interval=5)
            with anyio.fail_after(10):
                assert [e.id async for e in _events(live, 3)] == kept
                # Published while the live reader follows: the feed's window takes them.
                lost = [
                    (await bridge.publish("ra", "t", i, producer_token=claim.token)).ids[0]
                    for i in (3, 4)
                ]
                assert [e.id async for e in _events(live, 2)] == lost
            for key, value in snapshot.items():
                raw.restore(key, 0, value, replace=True)

            if opened == "subscribe":
                resumed = bridge.subscribe("ra", kept[-1], heartbeat_interval=0.3)
            else:
                resumed = _one_by_one(bridge, "ra", kept[-1])
            with anyio.fail_after(10):
                got = await _until_heartbeat(resumed)
            assert [type(item) for item in got] == [Heartbeat], got
            # The live reader, at a lost id, learns it within its heartbeat interval.
            with anyio.fail_after(10):
                rest = await items_until_terminal(live)
            assert [(type(i), getattr(i, "reason", None)) for i in rest] == [
                (StreamGap, "unknown_position")
            ]
    finally:
        raw.close()
        server.close()


async def test_a_read_stopped_at_the_batch_inside_the_window_does_not_go_on_from_it(
    key_prefix: str,
) -> None:
    """As above, with the log's newest id above the window's (an event appended after
    the log went back) and a reader more than a read's batch behind: its read stops at a
    kept id inside the window, and the window's entries after it include the lost ones."""
    server = RedisServer("--appendonly", "no", "--save", "")
    server.start()
    raw = server.client()
    keys = run_keys(key_prefix, "rc")
    settings = Settings(redis_url=server.url, redis_key_prefix=key_prefix, lease_seconds=120)
    kept_count = READ_BATCH + 88
    try:
        async with open_bridge(settings) as bridge:
            claim = await bridge.claim("rc")
            first = (await bridge.publish("rc", "t", -1, producer_token=claim.token)).ids[0]
            live = bridge.subscribe("rc", None, heartbeat_interval=5)
            with anyio.fail_after(20):
                assert [e.id async for e in _events(live, 1)] == [first]
                # Published while the live reader follows: the feed's window takes them.
                kept = list(
                    (
                        await bridge.publish_many(
                            "rc", [("t", i) for i in range(kept_count)], producer_token=claim.token
                        )
                    ).ids
                )
                snapshot = {key: raw.dump(key) for key in (keys.log, keys.meta)}
                lost = list(
                    (
                        await bridge.publish_many(
                            "rc", [("t", i) for i in range(5)], producer_token=claim.token
                        )
                    ).ids
                )
                assert [e.id async for e in _events(live, kept_count + 5)] == kept + lost
            for key, value in snapshot.items():
                raw.restore(key, 0, value, replace=True)
            # An entry appended after the log went back, above the window's newest id
            # (written raw: the gateway's append would notify the feed).
            ms, seq = parse_cursor(lost[-1])
            later = f"{ms + 1}-{seq}"
            raw.xadd(keys.log, {"e": "t", "d": "99"}, id=later)

            resumed = bridge.subscribe("rc", first, heartbeat_interval=0.3)
            with anyio.fail_after(10):
                got = await _until_heartbeat(resumed)
            assert [i.id for i in got if isinstance(i, StreamEvent)] == [*kept, later]
            assert isinstance(got[-1], Heartbeat)
    finally:
        raw.close()
        server.close()


async def test_a_stop_checked_before_a_rewind_is_checked_again(
    key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader whose read stops at S checks the window even though an earlier reader,
    before the log went backwards, stopped at S too (once per stop position was a skip
    for ever)."""
    # B reads for itself, sharing nothing with the earlier reader's reads
    monkeypatch.setattr(fanout, "SHARED_READ_SECONDS", 0.0)
    server = RedisServer("--appendonly", "no", "--save", "")
    server.start()
    raw = server.client()
    keys = run_keys(key_prefix, "rc")
    settings = Settings(redis_url=server.url, redis_key_prefix=key_prefix, lease_seconds=120)
    kept_count = READ_BATCH + 88
    try:
        async with open_bridge(settings) as bridge:
            claim = await bridge.claim("rc")
            first = (await bridge.publish("rc", "t", -1, producer_token=claim.token)).ids[0]
            live = bridge.subscribe("rc", None, heartbeat_interval=5)
            with anyio.fail_after(20):
                assert [e.id async for e in _events(live, 1)] == [first]
                kept = list(
                    (
                        await bridge.publish_many(
                            "rc", [("t", i) for i in range(kept_count)], producer_token=claim.token
                        )
                    ).ids
                )
                snapshot = {key: raw.dump(key) for key in (keys.log, keys.meta)}
                lost = list(
                    (
                        await bridge.publish_many(
                            "rc", [("t", i) for i in range(5)], producer_token=claim.token
                        )
                    ).ids
                )
                assert [e.id async for e in _events(live, kept_count + 5)] == kept + lost
                # An earlier reader from the same cursor, before the failover: its read
                # stops at the same id S, and the refresh records S as checked.
                before = bridge.subscribe("rc", first, heartbeat_interval=0.3)
                got = [e.id async for e in _events(before, kept_count + 5)]
                assert got == kept + lost  # (closed before its heartbeat: no idle mark)
                await before.aclose()
            for key, value in snapshot.items():
                raw.restore(key, 0, value, replace=True)
            ms, seq = parse_cursor(lost[-1])
            later = f"{ms + 1}-{seq}"
            raw.xadd(keys.log, {"e": "t", "d": "99"}, id=later)

            resumed = bridge.subscribe("rc", first, heartbeat_interval=0.3)
            with anyio.fail_after(10):
                got = await _until_heartbeat(resumed)
            ids = [i.id for i in got if isinstance(i, StreamEvent)]
            assert not set(ids) & set(lost), f"served lost ids: {[i for i in ids if i in lost]}"
            assert ids == [*kept, later]
    finally:
        raw.close()
        server.close()


async def test_entries_the_window_took_during_a_read_are_checked(key_prefix: str) -> None:
    """Entries the window took while a reader's read was in flight (a read queued at
    the pool, or retried on the promoted server, across the failover) are checked
    against the log before the reader goes on from the window."""
    server = RedisServer("--appendonly", "no", "--save", "")
    server.start()
    raw = server.client()
    keys = run_keys(key_prefix, "ra")
    settings = Settings(redis_url=server.url, redis_key_prefix=key_prefix, lease_seconds=120)
    try:
        async with open_bridge(settings) as bridge:
            claim = await bridge.claim("ra")
            kept = list(
                (
                    await bridge.publish_many(
                        "ra", [("t", i) for i in range(3)], producer_token=claim.token
                    )
                ).ids
            )
            snapshot = {key: raw.dump(key) for key in (keys.log, keys.meta)}
            live = bridge.subscribe("ra", None, heartbeat_interval=5)
            with anyio.fail_after(10):
                assert [e.id async for e in _events(live, 3)] == kept

            reads = bridge._reads
            real_read = reads.read
            entered, release = asyncio.Event(), asyncio.Event()

            async def gated(k: Any, after: str) -> Any:
                if asyncio.current_task() is holder[0] and not release.is_set():
                    entered.set()
                    await release.wait()  # the read in flight across the failover
                return await real_read(k, after)

            reads.read = gated
            holder: list[Any] = [None]
            resumed = bridge.subscribe("ra", kept[-1], heartbeat_interval=0.3)
            task = asyncio.ensure_future(_until_heartbeat(resumed))
            holder[0] = task
            with anyio.fail_after(10):
                await entered.wait()  # newest noted: kept[-1]
                lost = [
                    (await bridge.publish("ra", "t", i, producer_token=claim.token)).ids[0]
                    for i in (3, 4)
                ]
                assert [e.id async for e in _events(live, 2)] == lost  # the window has them
            for key, value in snapshot.items():
                raw.restore(key, 0, value, replace=True)
            release.set()  # the read now finds the log at kept[-1]
            with anyio.fail_after(10):
                got = await task
            assert [type(i) for i in got] == [Heartbeat], got
    finally:
        raw.close()
        server.close()


async def test_a_rewind_found_by_a_refresh_drops_shared_reads(key_prefix: str) -> None:
    """A refresh that finds the window's head gone restarts the window and drops the
    shared reads: a reader at a kept position within SHARED_READ_SECONDS of an earlier
    read there is not handed the lost entries."""
    server = RedisServer("--appendonly", "no", "--save", "")
    server.start()
    raw = server.client()
    keys = run_keys(key_prefix, "rd")
    settings = Settings(redis_url=server.url, redis_key_prefix=key_prefix, lease_seconds=120)
    kept_count = READ_BATCH + 88
    try:
        async with open_bridge(settings) as bridge:
            claim = await bridge.claim("rd")
            first = (await bridge.publish("rd", "t", -1, producer_token=claim.token)).ids[0]
            live = bridge.subscribe("rd", None, heartbeat_interval=5)
            with anyio.fail_after(20):
                assert [e.id async for e in _events(live, 1)] == [first]
                kept = list(
                    (
                        await bridge.publish_many(
                            "rd", [("t", i) for i in range(kept_count)], producer_token=claim.token
                        )
                    ).ids
                )
                snapshot = {key: raw.dump(key) for key in (keys.log, keys.meta)}
                lost = list(
                    (
                        await bridge.publish_many(
                            "rd", [("t", i) for i in range(5)], producer_token=claim.token
                        )
                    ).ids
                )
                assert [e.id async for e in _events(live, kept_count + 5)] == kept + lost
                x = bridge.subscribe("rd", kept[-1], heartbeat_interval=5)
                assert [e.id async for e in _events(x, 5)] == lost  # its read is shared
                await x.aclose()
            for key, value in snapshot.items():
                raw.restore(key, 0, value, replace=True)
            ms, seq = parse_cursor(lost[-1])
            later = f"{ms + 1}-{seq}"
            raw.xadd(keys.log, {"e": "t", "d": "99"}, id=later)
            b = bridge.subscribe("rd", first, heartbeat_interval=0.3)
            with anyio.fail_after(10):
                got = [e.id async for e in _events(b, kept_count + 1)]
            assert got == [*kept, later]  # the stop check found the rewind
            await b.aclose()  # (before its heartbeat: no idle mark)
            c = bridge.subscribe("rd", kept[-1], heartbeat_interval=0.3)
            with anyio.fail_after(10):
                got = await _until_heartbeat(c)
            ids = [i.id for i in got if isinstance(i, StreamEvent)]
            assert ids == [later], got
    finally:
        raw.close()
        server.close()
