"""Numbered appends (`publish_many(..., seq=N)`), a contract of both bridges.

A producer that numbers its batches can re-send any of them blindly: events applied
before are answered with the ids first assigned and not appended again (a batch that
reaches past them appends only its new tail), a batch past the next expected number is
refused as a gap, and a takeover starts a new numbering. Run on
memory and Redis (the `bridge`/`make_bridge` fixtures of tests/conftest.py); on Redis the
lost reply is lost on the wire, by a TCP relay that cuts the connection after Redis ran
the script.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from uuid import uuid4

import anyio
import pytest

from gateway.bridge.base import StreamBridge
from gateway.errors import (
    BackendUnavailable,
    InvalidInput,
    ProducerFenced,
    SequenceConflict,
    SequenceGap,
    StreamEnded,
)
from gateway.sequence import MAX_LOOKBACK, MAX_SEQ
from gateway.values import End, PublishResult, StreamEvent
from tests.conftest import BridgeFactory
from tests.support.fault_relay import FaultRelay

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

TIMEOUT = 15.0


def new_run_id() -> str:
    return f"seq-{uuid4().hex[:12]}"


def batch(*numbers: int) -> list[tuple[str, Any]]:
    return [("tok", {"n": n}) for n in numbers]


async def logged(bridge: StreamBridge, run_id: str) -> list[tuple[str, int]]:
    """(id, n) of every event in the log, read through END."""
    await_end: list[tuple[str, int]] = []
    with anyio.fail_after(TIMEOUT):
        async for item in bridge.subscribe(run_id, heartbeat_interval=0.2):
            if isinstance(item, StreamEvent):
                await_end.append((item.id, item.value()["n"]))
            elif isinstance(item, End):
                return await_end
    raise AssertionError("subscription ended without END")


LoseReply = Callable[[Awaitable[PublishResult]], Awaitable[None]]


@contextlib.asynccontextmanager
async def lossy_bridge(make_bridge: BridgeFactory) -> AsyncIterator[tuple[StreamBridge, LoseReply]]:
    """A bridge and `lose(call)`: run a publish whose reply never reaches the caller.

    Redis: through a relay that forwards the script and cuts the connection before the
    reply (the bridge reports BackendUnavailable, as it must not re-send a write). Memory
    has no wire: the call runs and its result is thrown away, which is the same thing
    from the producer's side.
    """
    if make_bridge.backend == "memory":
        async with make_bridge() as bridge:

            async def lose_memory(call: Awaitable[PublishResult]) -> None:
                await call

            yield bridge, lose_memory
        return
    assert make_bridge.redis_url is not None
    host_port = make_bridge.redis_url.split("://", 1)[1].rsplit("/", 1)[0]
    host, port = host_port.rsplit(":", 1)
    relay = FaultRelay((host, int(port)))
    async with anyio.create_task_group() as tg:
        await tg.start(relay.serve)
        async with make_bridge(redis_url=f"redis://127.0.0.1:{relay.port}") as bridge:

            async def lose_redis(call: Awaitable[PublishResult]) -> None:
                relay.armed = True
                cut = relay.cut
                with pytest.raises(BackendUnavailable):
                    await call
                assert relay.cut == cut + 1, "the relay did not drop the reply"

            yield bridge, lose_redis
        tg.cancel_scope.cancel()


async def test_retry_after_a_lost_reply_returns_the_first_ids_and_appends_nothing(
    make_bridge: BridgeFactory,
) -> None:
    async with lossy_bridge(make_bridge) as (bridge, lose):
        run_id = new_run_id()
        claim = await bridge.claim(run_id, lease_seconds=30)
        tok = claim.token
        first = await bridge.publish_many(run_id, batch(1, 2), producer_token=tok, seq=1)
        await lose(bridge.publish_many(run_id, batch(3, 4, 5), producer_token=tok, seq=3))
        # The producer cannot know whether 3..5 were applied: it re-sends them as they were.
        retry = await bridge.publish_many(run_id, batch(3, 4, 5), producer_token=tok, seq=3)
        assert retry.duplicate and len(retry.ids) == 3
        after = await bridge.publish_many(run_id, batch(6), producer_token=tok, seq=6)
        assert not after.duplicate
        await bridge.publish_end(run_id, "success", producer_token=tok)
        log = await logged(bridge, run_id)
    assert [n for _, n in log] == [1, 2, 3, 4, 5, 6]
    # The retry was told the ids the lost reply carried, i.e. where 3..5 really are.
    assert [i for i, _ in log] == [*first.ids, *retry.ids, *after.ids]


async def test_duplicate_batch_returns_its_ids_and_appends_nothing(bridge: StreamBridge) -> None:
    run_id = new_run_id()
    tok = (await bridge.claim(run_id, lease_seconds=30)).token
    one = await bridge.publish_many(run_id, batch(1), producer_token=tok, seq=1)
    again = await bridge.publish_many(run_id, batch(1), producer_token=tok, seq=1)
    assert not one.duplicate and again.duplicate and again.ids == one.ids
    two = await bridge.publish_many(run_id, batch(2, 3), producer_token=tok, seq=2)
    for _ in range(3):
        dup = await bridge.publish_many(run_id, batch(2, 3), producer_token=tok, seq=2)
        assert dup.duplicate and dup.ids == two.ids
        assert dup.cancel_requested is False
    info = await bridge.get_run(run_id)
    assert info is not None and info.retained_events == 3 and info.last_event_id == two.ids[-1]
    # A duplicate still reports the cancel flag (a retrying producer must learn of it).
    assert await bridge.request_cancel(run_id)
    dup = await bridge.publish_many(run_id, batch(2, 3), producer_token=tok, seq=2)
    assert dup.duplicate and dup.cancel_requested
    await bridge.publish_end(run_id, "success", producer_token=tok)
    assert [n for _, n in await logged(bridge, run_id)] == [1, 2, 3]


async def test_an_int_subclass_is_numbered_by_its_value(bridge: StreamBridge) -> None:
    # An IntEnum (any int subclass) is taken as the int it is, on both bridges: on Redis
    # it once reached the wire packer, which refuses int subclasses (a 500).
    class Number(enum.IntEnum):
        FIRST = 1
        SECOND = 2

    run_id = new_run_id()
    tok = (await bridge.claim(run_id, lease_seconds=30)).token
    one = await bridge.publish_many(run_id, batch(1), producer_token=tok, seq=Number.FIRST)
    two = await bridge.publish_many(run_id, batch(2), producer_token=tok, seq=Number.SECOND)
    again = await bridge.publish_many(run_id, batch(2), producer_token=tok, seq=2)
    assert not one.duplicate and not two.duplicate
    assert again.duplicate and again.ids == two.ids
    await bridge.publish_end(run_id, "success", producer_token=tok)
    assert [n for _, n in await logged(bridge, run_id)] == [1, 2]


async def test_a_retry_renews_the_lease_like_any_publish(bridge: StreamBridge) -> None:
    run_id = new_run_id()
    tok = (await bridge.claim(run_id, lease_seconds=5)).token
    await bridge.publish_many(run_id, batch(1), producer_token=tok, seq=1)
    info = await bridge.get_run(run_id)
    assert info is not None
    await anyio.sleep(0.05)  # the subject: time passes between the write and its retry
    assert (await bridge.publish_many(run_id, batch(1), producer_token=tok, seq=1)).duplicate
    again = await bridge.get_run(run_id)
    assert again is not None and again.lease_expires_at > info.lease_expires_at
    assert again.retained_events == 1


async def test_a_batch_past_the_next_number_is_a_gap_with_the_expected_number(
    bridge: StreamBridge,
) -> None:
    run_id = new_run_id()
    tok = (await bridge.claim(run_id, lease_seconds=30)).token
    with pytest.raises(SequenceGap) as first:
        await bridge.publish_many(run_id, batch(2), producer_token=tok, seq=2)
    assert first.value.expected == 1 and first.value.code == "sequence_gap"
    await bridge.publish_many(run_id, batch(1, 2, 3), producer_token=tok, seq=1)
    with pytest.raises(SequenceGap) as later:
        await bridge.publish_many(run_id, batch(5, 6), producer_token=tok, seq=5)
    assert later.value.expected == 4
    info = await bridge.get_run(run_id)
    assert info is not None and info.retained_events == 3  # the refused batches wrote nothing
    await bridge.publish_many(run_id, batch(4), producer_token=tok, seq=4)
    await bridge.publish_end(run_id, "success", producer_token=tok)
    assert [n for _, n in await logged(bridge, run_id)] == [1, 2, 3, 4]


async def test_an_overlapping_batch_appends_only_its_new_tail(bridge: StreamBridge) -> None:
    """PROTOCOL 3.1: a batch starting below the next expected number but reaching past
    it appends only its events from that number on; its reply lists every event's id,
    the first-assigned ones for those applied before."""
    run_id = new_run_id()
    tok = (await bridge.claim(run_id, lease_seconds=30)).token
    one = await bridge.publish_many(run_id, batch(1, 2), producer_token=tok, seq=1)
    two = await bridge.publish_many(run_id, batch(3, 4), producer_token=tok, seq=3)
    over = await bridge.publish_many(run_id, batch(2, 3, 4, 5, 6), producer_token=tok, seq=2)
    assert over.already_applied == 3 and over.appended == 2 and not over.duplicate
    assert over.ids[:3] == (one.ids[1], *two.ids)
    # Any earlier batch, not only the last one, is answered with its first ids.
    for seq, numbers, ids in ((1, (1, 2), one.ids), (3, (3,), two.ids[:1]), (2, (2, 3), None)):
        again = await bridge.publish_many(run_id, batch(*numbers), producer_token=tok, seq=seq)
        assert again.duplicate and again.already_applied == len(numbers)
        if ids is not None:
            assert again.ids == ids
    tail = await bridge.publish_many(run_id, batch(6, 7), producer_token=tok, seq=6)
    assert tail.ids[0] == over.ids[-1] and tail.already_applied == 1
    await bridge.publish_end(run_id, "success", producer_token=tok)
    log = await logged(bridge, run_id)
    assert [n for _, n in log] == [1, 2, 3, 4, 5, 6, 7]
    assert [i for i, _ in log] == [*one.ids, *two.ids, *over.ids[3:], tail.ids[1]]


async def test_an_overlap_is_answered_up_to_the_look_back_limit(bridge: StreamBridge) -> None:
    run_id = new_run_id()
    tok = (await bridge.claim(run_id, lease_seconds=30)).token
    total = MAX_LOOKBACK + 1
    first = await bridge.publish_many(run_id, batch(1), producer_token=tok, seq=1)
    rest = await bridge.publish_many(run_id, batch(*range(2, total + 1)), producer_token=tok, seq=2)
    # Event 2 is MAX_LOOKBACK events back: still answered.
    again = await bridge.publish_many(run_id, batch(2), producer_token=tok, seq=2)
    assert again.duplicate and again.ids == rest.ids[:1]
    # Event 1 is one further: refused with the next expected number, nothing appended.
    with pytest.raises(SequenceConflict) as refused:
        await bridge.publish_many(run_id, batch(1, 2), producer_token=tok, seq=1)
    assert refused.value.expected == total + 1 and refused.value.code == "sequence_conflict"
    assert first.ids
    info = await bridge.get_run(run_id)
    assert info is not None and info.retained_events == total


async def test_every_overlap_within_the_look_back_gets_the_first_ids(
    bridge: StreamBridge,
) -> None:
    """Batches of every size, more events than the look-back: a retry from any number
    within it, of any length, is answered with exactly the ids first assigned (on Redis
    from the record of recent ids, across its buckets and its ring)."""
    run_id = new_run_id()
    tok = (await bridge.claim(run_id, lease_seconds=60)).token
    ids: list[str] = []
    seq = 1
    while seq <= MAX_LOOKBACK + 300:
        size = 1 + (seq * 7919) % 9
        ids += (
            await bridge.publish_many(
                run_id, batch(*range(seq, seq + size)), producer_token=tok, seq=seq
            )
        ).ids
        seq += size
    expected = seq
    for start in (*range(expected - MAX_LOOKBACK, expected, 37), expected - 1, expected - 32):
        length = 1 + start % 5
        again = await bridge.publish_many(
            run_id, batch(*range(start, start + length)), producer_token=tok, seq=start
        )
        applied = min(length, expected - start)
        assert again.ids[:applied] == tuple(ids[start - 1 : start - 1 + applied]), start
        if applied < length:  # reached past the next number: its tail was appended
            ids += again.ids[applied:]
            expected += length - applied
    with pytest.raises(SequenceConflict):
        await bridge.publish_many(
            run_id, batch(1), producer_token=tok, seq=expected - MAX_LOOKBACK - 1
        )


async def test_an_overlap_across_an_unnumbered_write_is_a_conflict(bridge: StreamBridge) -> None:
    """The ids of numbered events are read back from the log; an unnumbered write between
    them ends the run of numbered entries that can be counted back."""
    run_id = new_run_id()
    tok = (await bridge.claim(run_id, lease_seconds=30)).token
    await bridge.publish_many(run_id, batch(1), producer_token=tok, seq=1)
    await bridge.publish(run_id, "tok", {"n": 100}, producer_token=tok)
    two = await bridge.publish_many(run_id, batch(2, 3), producer_token=tok, seq=2)
    assert (
        await bridge.publish_many(run_id, batch(2, 3), producer_token=tok, seq=2)
    ).ids == two.ids
    for seq, numbers in ((1, (1,)), (1, (1, 2, 3, 4))):
        with pytest.raises(SequenceConflict) as refused:
            await bridge.publish_many(run_id, batch(*numbers), producer_token=tok, seq=seq)
        assert refused.value.expected == 4
    await bridge.publish_end(run_id, "success", producer_token=tok)
    assert [n for _, n in await logged(bridge, run_id)] == [1, 100, 2, 3]


async def test_an_overlap_into_trimmed_events_is_a_conflict(make_bridge: BridgeFactory) -> None:
    async with make_bridge(max_events_per_run=3) as bridge:
        run_id = new_run_id()
        tok = (await bridge.claim(run_id, lease_seconds=30)).token
        for n in range(1, 6):
            await bridge.publish_many(run_id, batch(n), producer_token=tok, seq=n)
        retained = await bridge.publish_many(run_id, batch(3, 4, 5), producer_token=tok, seq=3)
        assert retained.duplicate
        with pytest.raises(SequenceConflict) as refused:
            await bridge.publish_many(run_id, batch(2, 3, 4, 5, 6), producer_token=tok, seq=2)
        assert refused.value.expected == 6
        await bridge.publish_many(run_id, batch(6), producer_token=tok, seq=6)
        await bridge.publish_end(run_id, "success", producer_token=tok)
        assert [n for _, n in await logged(bridge, run_id)] == [4, 5, 6]


async def test_takeover_starts_a_new_numbering(bridge: StreamBridge) -> None:
    run_id = new_run_id()
    old = await bridge.claim(run_id, lease_seconds=30)
    await bridge.publish_many(run_id, batch(1, 2), producer_token=old.token, seq=1)
    new = await bridge.claim(run_id, lease_seconds=30, takeover=True)
    assert new.epoch == old.epoch + 1
    # The old owner's retry is fenced, numbered or not: the token check comes first.
    with pytest.raises(ProducerFenced):
        await bridge.publish_many(run_id, batch(1, 2), producer_token=old.token, seq=1)
    # The new epoch counts from 1 again; what the old one numbered does not carry over.
    with pytest.raises(SequenceGap) as gap:
        await bridge.publish_many(run_id, batch(3), producer_token=new.token, seq=3)
    assert gap.value.expected == 1
    fresh = await bridge.publish_many(run_id, batch(3), producer_token=new.token, seq=1)
    assert not fresh.duplicate
    dup = await bridge.publish_many(run_id, batch(3), producer_token=new.token, seq=1)
    assert dup.duplicate and dup.ids == fresh.ids
    await bridge.publish_end(run_id, "success", producer_token=new.token)
    assert [n for _, n in await logged(bridge, run_id)] == [1, 2, 3]


async def test_unnumbered_writes_leave_the_numbering_alone(bridge: StreamBridge) -> None:
    run_id = new_run_id()
    tok = (await bridge.claim(run_id, lease_seconds=30)).token
    await bridge.publish_many(run_id, batch(1), producer_token=tok, seq=1)
    await bridge.publish(run_id, "tok", {"n": 100}, producer_token=tok)
    await bridge.publish_many(run_id, batch(101, 102), producer_token=tok)
    with pytest.raises(SequenceGap) as gap:
        await bridge.publish_many(run_id, batch(3), producer_token=tok, seq=3)
    assert gap.value.expected == 2
    await bridge.publish_many(run_id, batch(2), producer_token=tok, seq=2)
    await bridge.publish_end(run_id, "success", producer_token=tok)
    assert [n for _, n in await logged(bridge, run_id)] == [1, 100, 101, 102, 2]


async def test_numbered_writes_after_end_are_ended_and_bad_numbers_are_invalid(
    bridge: StreamBridge,
) -> None:
    run_id = new_run_id()
    tok = (await bridge.claim(run_id, lease_seconds=30)).token
    for seq in (0, -1, True, MAX_SEQ):
        with pytest.raises(InvalidInput):
            await bridge.publish_many(run_id, batch(1, 2), producer_token=tok, seq=seq)
    with pytest.raises(InvalidInput):
        await bridge.publish_many(run_id, [], producer_token=tok, seq=1)
    await bridge.publish_many(run_id, batch(1), producer_token=tok, seq=1)
    await bridge.publish_end(run_id, "success", producer_token=tok)
    with pytest.raises(StreamEnded):
        await bridge.publish_many(run_id, batch(2), producer_token=tok, seq=2)


async def test_redis_numbering_state_is_bounded_in_the_run_hash(
    make_bridge: BridgeFactory, redis_url: str
) -> None:
    """No key per event or per batch: after many numbered batches (more than the
    look-back) the run still has its two keys, and the hash holds the four numbering
    fields and the record of recent ids, a bounded number of small fields."""
    if make_bridge.backend != "redis":
        pytest.skip("Redis layout")
    from redis.asyncio import Redis

    from gateway.redis.scripts import CONSTANTS

    async with make_bridge() as bridge:
        run_id = new_run_id()
        tok = (await bridge.claim(run_id, lease_seconds=30)).token
        seq = 1
        for size in (3, 1, 4, 1, 5) * 100:
            last = await bridge.publish_many(
                run_id, batch(*range(seq, seq + size)), producer_token=tok, seq=seq
            )
            seq += size
        assert seq > MAX_LOOKBACK
        again = await bridge.publish_many(run_id, batch(0), producer_token=tok, seq=seq - 1)
        assert again.ids == last.ids[-1:]
    client = Redis.from_url(redis_url)
    try:
        keys = sorted(k.decode() for k in await client.keys(f"{make_bridge.key_prefix}*"))
        tag = f"{make_bridge.key_prefix}{{{run_id}}}"
        assert keys == [f"{tag}:log", f"{tag}:meta"]
        names = ["seq_tok", "seq_next", "seq_last", "seq_base"]
        fields = await client.hmget(f"{tag}:meta", names)
        assert fields[0] == tok.encode() and int(fields[1]) == seq
        assert fields[2].decode() == last.ids[-1] and int(fields[3]) == 1
        record = {
            k: v
            for k, v in (await client.hgetall(f"{tag}:meta")).items()
            if k.startswith(b"sq") or k in (b"seq_cur", b"seq_n")
        }
        assert len(record) <= CONSTANTS["SEQ_BUCKETS"] + 2
        assert sum(len(v) for v in record.values()) < 16 * 1024
    finally:
        await client.aclose()


async def test_redis_numbering_fields_follow_each_change_though_rewritten_only_then(
    make_bridge: BridgeFactory, redis_url: str
) -> None:
    """An append writes `seq_tok`, `seq_base`, `seq_n` and `ttl_at` only when they
    change (lua/publish.lua): a numbering that goes on keeps them, an unnumbered write
    in between restarts the numbering's base, a takeover restarts all of it, a bucket
    that closes moves `seq_n`, and the TTL's time moves only when it is refreshed."""
    if make_bridge.backend != "redis":
        pytest.skip("Redis layout")
    from redis.asyncio import Redis

    from gateway.redis.scripts import CONSTANTS

    bucket = CONSTANTS["SEQ_BUCKET"]
    client = Redis.from_url(redis_url, decode_responses=True)
    names = ["seq_tok", "seq_base", "seq_next", "seq_n", "ttl_at", "last", "seq_last"]

    async def fields(meta: str) -> dict[str, str | None]:
        return dict(zip(names, await client.hmget(meta, names), strict=True))

    try:
        async with make_bridge() as bridge:
            run_id = new_run_id()
            meta = f"{make_bridge.key_prefix}{{{run_id}}}:meta"
            old = (await bridge.claim(run_id, lease_seconds=30)).token
            for seq in range(1, bucket + 9):  # one bucket closes, the next holds 8
                await bridge.publish_many(run_id, batch(seq), producer_token=old, seq=seq)
            first = await fields(meta)
            assert first["seq_tok"] == old and first["seq_base"] == "1"
            assert first["seq_next"] == str(bucket + 9) and first["seq_n"] == "1"
            assert first["seq_last"] == first["last"] and first["ttl_at"] is not None

            await bridge.publish(run_id, "tok", {"n": 0}, producer_token=old)
            between = await fields(meta)
            assert {k: between[k] for k in names[:5]} == {k: first[k] for k in names[:5]}
            assert between["last"] != between["seq_last"]

            await bridge.publish_many(run_id, batch(bucket + 9), producer_token=old, seq=bucket + 9)
            restarted = await fields(meta)
            assert restarted["seq_tok"] == old and restarted["seq_base"] == str(bucket + 9)
            assert restarted["seq_n"] == "1" and restarted["seq_last"] == restarted["last"]

            new = (await bridge.claim(run_id, lease_seconds=30, takeover=True)).token
            await bridge.publish_many(run_id, batch(1), producer_token=new, seq=1)
            taken = await fields(meta)
            assert taken["seq_tok"] == new and taken["seq_base"] == "1"
            assert taken["seq_next"] == "2" and taken["seq_n"] == "0"
            # Within a sixteenth of the TTL of the first append: never refreshed since.
            assert taken["ttl_at"] == first["ttl_at"]
    finally:
        await client.aclose()


@pytest.mark.cluster
async def test_the_overlap_rule_holds_on_a_cluster(redis_cluster: Any, key_prefix: str) -> None:
    """The look-back reads the log in the run's slot, like every other step of the
    script: an overlap appends its tail and is answered with the first ids."""
    from gateway.bridge.provider import open_bridge
    from gateway.settings import Settings

    url = redis_cluster.url.replace("redis://", "redis+cluster://", 1)
    settings = Settings(redis_url=url, redis_key_prefix=key_prefix)
    async with open_bridge(settings) as bridge:
        run_id = new_run_id()
        tok = (await bridge.claim(run_id, lease_seconds=30)).token
        one = await bridge.publish_many(run_id, batch(1, 2, 3), producer_token=tok, seq=1)
        over = await bridge.publish_many(run_id, batch(2, 3, 4), producer_token=tok, seq=2)
        assert over.ids[:2] == one.ids[1:] and over.already_applied == 2
        await bridge.publish_end(run_id, "success", producer_token=tok)
        assert [n for _, n in await logged(bridge, run_id)] == [1, 2, 3, 4]
