"""Failover with lost writes, end to end: real `redis-sentinel` processes (Debian's) over a
master and two replicas, and a Redis Cluster's `CLUSTER FAILOVER FORCE`; two real gateway
processes, a producer over HTTP, live followers and resuming readers over SSE.

The gateway has no Sentinel URL: it takes one `redis://` address. Here that address is a
TCP forwarder (tests/support/tcp_forwarder.py) that the test points at whichever server
the sentinels name master after the promotion, as a managed endpoint or a DNS name that
follows the primary does; the move cuts the connections through it.

Each case loses writes in the promotion window: the replicas are detached (`REPLICAOF` a
closed port; on the cluster, the replica's writes are paused with `CLIENT PAUSE WRITE`,
which holds back the master's replication stream) so they miss the last appends, the
live followers are given those appends, then the master is killed (on the cluster, the
replica takes over with `CLUSTER FAILOVER FORCE`). Then the producer goes on and ends
the run. What must hold (docs/protocol.md §2.4):

- every reader (the live followers, readers started after the failover, and a resumer
  at every id the gateway handed out: to the producer or to any reader, before and
  after) gets a contiguous run of the log it followed (the log as it was, or as it is
  now) followed by END, or by a gap with reason `unknown_position` at a position the log
  no longer holds: never events that follow a lost id, never endless heartbeats;
- no id is ever given to two different events of the run (every id the producer was
  acknowledged and every id any reader saw keeps one payload);
- the turn record equals the final log;
- without `--min-replicas-acked`, acknowledged events were lost (the case is real);
  with `--min-replicas-acked 1` none is.

Sentinel runs with the clocks in step, with the promoted server's clock behind, and with
`--min-replicas-acked 1`; the cluster (where the gateway refuses that setting) the first
two.

The promoted server's clock behind: `faketime` cannot run Debian's redis-server
(libfaketime 0.9.10 recurses in clock_gettime during jemalloc's start-up; tried
libfaketime and libfaketimeMT, `FAKETIME_DONT_FAKE_MONOTONIC=1`,
`FAKETIME_DISABLE_SHM=1`, `FAKETIME_NO_CACHE=1`: the server hangs before it listens), so
it is emulated as in tests/redis_backend/test_rewind.py: `XSETID` moves the log's last
id a minute ahead on the master before the last kept event, so the ids run a minute
ahead of every server's clock, exactly as a promoted server whose clock is a minute
behind sees them. With Redis' own ids the first event after the failover would then
take the first lost event's very id.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import anyio
import httpx
import orjson
import pytest

from gateway.cursor import parse_cursor
from tests.support.fault_tools import Follower, poll
from tests.support.proxies import GatewayProcess
from tests.support.redis_servers import HOST, RedisCluster, RedisServer
from tests.support.replication import detach, start_replica, wait_in_sync
from tests.support.sentinel import SentinelGroup
from tests.support.sse_client import Frame, iter_frames
from tests.support.tcp_forwarder import TcpForwarder
from tests.system.test_cluster_failover import cluster_url, owner_of

pytestmark = [pytest.mark.anyio, pytest.mark.system]

KEPT, LOST, AFTER = range(0, 8), range(8, 12), range(12, 20)
MAYBE_APPLIED = {502, 503, 504}
ACK_TIMEOUT = "0.5"  # --replica-ack-timeout-seconds: a write the replicas miss is refused fast
HEARTBEAT = 0.5
# A live follower learns of its lost position this soon after the first event that
# follows the failover (ten heartbeats: the reconnect and a loaded 2-core machine).
NOTICE = 10 * HEARTBEAT


# ------------------------------------------------------------------------------ readers


@dataclass
class Reader:
    """Reads a run's SSE stream from `start` to END or a gap, reconnecting (with its
    position as `Last-Event-ID`) after a drop, a 5xx or an `unavailable` frame, as an
    `EventSource` does."""

    client: httpx.AsyncClient
    run_id: str
    start: str | None
    events: list[Frame] = field(default_factory=list)
    terminal: Frame | None = None
    done: anyio.Event = field(default_factory=anyio.Event)

    @property
    def ids(self) -> list[str]:
        return [f.id for f in self.events if f.id is not None]

    async def run(self, timeout: float = 60.0) -> None:
        try:
            with anyio.fail_after(timeout):
                while self.terminal is None:
                    await self._connect()
        finally:
            self.done.set()

    async def _connect(self) -> None:
        position = self.ids[-1] if self.events else self.start
        headers = {"Last-Event-ID": position} if position is not None else {}
        try:
            async with self.client.stream(
                "GET", f"/v1/runs/{self.run_id}/stream", headers=headers
            ) as response:
                if response.status_code >= 500:
                    await response.aread()
                else:
                    assert response.status_code == 200, response.status_code
                    async for frame in iter_frames(response):
                        if frame.event in ("end", "gap"):
                            self.terminal = frame
                            return
                        if frame.data_id is not None:
                            self.events.append(frame)
        except httpx.TransportError:
            pass
        await anyio.sleep(0.05)  # a client's retry delay, scaled down


# ------------------------------------------------------------------------------ producer


@dataclass
class Producer:
    """Appends `{"text": "<seq> ", "seq": seq}` token events; records what was
    acknowledged (200) and what was refused (a 5xx: maybe applied, never acknowledged)."""

    client: httpx.AsyncClient
    run_id: str
    token: str
    acked: dict[str, int] = field(default_factory=dict)  # id -> seq, in reply order
    refused: list[int] = field(default_factory=list)

    async def send(self, seq: int) -> list[str] | None:
        try:
            response = await self.client.post(
                f"/v1/runs/{self.run_id}/events",
                json={"event": "token", "data": {"text": f"{seq} ", "seq": seq}},
                headers={"X-Producer-Token": self.token},
            )
        except httpx.TransportError:
            self.refused.append(seq)
            return None
        if response.status_code in MAYBE_APPLIED:
            self.refused.append(seq)
            return None
        assert response.status_code == 200, response.text
        ids: list[str] = response.json()["ids"]
        for entry_id in ids:
            assert entry_id not in self.acked, f"id {entry_id} acknowledged twice"
            self.acked[entry_id] = seq
        return ids

    async def publish(self, seq: int, timeout: float = 40.0) -> list[str]:
        """Until acknowledged: a refused try is sent again (a duplicate event is allowed,
        a reused id is not)."""
        with anyio.fail_after(timeout):
            while (ids := await self.send(seq)) is None:
                await anyio.sleep(0.1)
        return ids

    async def end(self, timeout: float = 40.0) -> None:
        with anyio.fail_after(timeout):
            while True:
                try:
                    response = await self.client.post(
                        f"/v1/runs/{self.run_id}/end",
                        json={"status": "success"},
                        headers={"X-Producer-Token": self.token},
                    )
                    if response.status_code == 200:
                        return
                    assert response.status_code in MAYBE_APPLIED, response.text
                except httpx.TransportError:
                    pass
                await anyio.sleep(0.1)


# ------------------------------------------------------------------------------ the log


@dataclass
class Log:
    """A run's log as read from a server: event ids in order, their seqs, the END."""

    ids: list[str]
    seqs: dict[str, int]
    end: str | None

    @classmethod
    def read(cls, server: RedisServer, key: str) -> Log:
        with server.client() as c:
            entries = [(i.decode(), f) for i, f in c.xrange(key)]
        ids = [i for i, f in entries if b"e" in f]
        seqs = {i: int(orjson.loads(f[b"d"])["seq"]) for i, f in entries if b"e" in f}
        ends = [f[b"end"].decode() for _, f in entries if b"end" in f]
        return cls(ids, seqs, ends[-1] if ends else None)

    def after(self, start: str | None) -> list[str]:
        if start is None:
            return self.ids
        return self.ids[self.ids.index(start) + 1 :] if start in self.ids else []


def check_reader(
    name: str, reader: Reader | Follower, start: str | None, before: Log, final: Log
) -> None:
    """A contiguous run of one of the two logs from `start`, then END after the final
    log's last event, or a gap at a position the final log does not hold."""
    ids, terminal = reader.ids, reader.terminal
    assert terminal is not None, f"{name}: no END and no gap"
    if terminal.event == "end":
        assert start is None or start in final.ids, f"{name}: END after a lost position"
        assert ids == final.after(start), f"{name}: {ids} then END, log {final.after(start)}"
        assert terminal.json()["status"] == final.end
        return
    gap = terminal.json()
    position = ids[-1] if ids else start
    assert gap["reason"] == "unknown_position", f"{name}: {gap}"
    assert gap["requested_event_id"] == position, f"{name}: {gap} at {position}"
    assert position not in final.ids, f"{name}: a gap at {position}, which the log holds"
    assert ids in (before.after(start)[: len(ids)], final.after(start)[: len(ids)]), (
        f"{name}: {ids} is a run of neither log: {before.ids} / {final.ids}"
    )


# ------------------------------------------------------------------------------ scenario


def always(client: httpx.AsyncClient) -> Callable[[], httpx.AsyncClient]:
    return lambda: client


@dataclass
class Failover:
    """How a case loses writes and fails over: `hold_back()` before the lost appends,
    `fail_over()` after them; `server()` reads the current master of `key`."""

    hold_back: Callable[[], Awaitable[None]]
    fail_over: Callable[[], Awaitable[None]]
    server: Callable[[], RedisServer]
    clock_behind: bool = False  # XSETID the log a minute ahead before the last kept event


async def lose_writes_in_a_failover(
    gateways: list[GatewayProcess],
    failover: Failover,
    log_key: Callable[[str], str],
    *,
    replicated: bool,
) -> tuple[Log, Log, Producer]:
    async with (
        httpx.AsyncClient(base_url=gateways[0].url, timeout=10) as ca,
        httpx.AsyncClient(base_url=gateways[1].url, timeout=10) as cb,
    ):
        claim = await ca.post("/v1/runs", json={"session_id": "chat", "lease_seconds": 120})
        assert claim.status_code == 201, claim.text
        run_id = claim.json()["run_id"]
        producer = Producer(ca, run_id, claim.json()["producer_token"])
        key = log_key(run_id)
        followers = [Follower(always(c), run_id) for c in (ca, cb) for _ in range(2)]
        readers: list[Reader] = []
        everyone: list[Reader | Follower] = []
        async with anyio.create_task_group() as tasks:
            for follower in followers:
                tasks.start_soon(follower.run, 90.0)
            for seq in KEPT:
                if seq == KEPT[-1] and failover.clock_behind:
                    last = parse_cursor(list(producer.acked)[-1])[0]
                    with failover.server().client() as raw:
                        raw.execute_command("XSETID", key, f"{last + 60_000}-0")
                await producer.publish(seq)
            await failover.hold_back()
            for seq in LOST:  # the live followers are given these; the replicas never are
                await producer.send(seq)
            before = Log.read(failover.server(), key)

            async def caught_up() -> bool:
                return all(f.ids[-1:] == before.ids[-1:] for f in followers)

            await poll("the followers at the newest event", caught_up, 20)
            await failover.fail_over()
            for index, seq in enumerate(AFTER):
                await producer.publish(seq)
                if index == 0:
                    resumed_at = (
                        time.monotonic()
                    )  # readers that join after the failover, at every position
                    cursors: list[str | None] = [None, *before.ids]
                    for n, cursor in enumerate(cursors):
                        readers.append(Reader((ca, cb)[n % 2], run_id, cursor))
                        tasks.start_soon(readers[-1].run, 60.0)
            await producer.end()
            everyone += [*followers, *readers]
            with anyio.fail_after(30):
                for reader in everyone:
                    await reader.done.wait()
        final = Log.read(failover.server(), key)
        assert final.end == "success"

        # Every id handed out: acknowledged to the producer or given to any reader.
        handed_out = list(dict.fromkeys([*producer.acked, *before.ids, *final.ids]))
        for reader in everyone:
            handed_out += [i for i in reader.ids if i not in handed_out]
        resumers = [Reader((ca, cb)[n % 2], run_id, i) for n, i in enumerate(handed_out)]
        async with anyio.create_task_group() as tasks:
            for resumer in resumers:
                tasks.start_soon(resumer.run, 30.0)
        turns = (await ca.get("/v1/sessions/chat/turns")).json()["turns"]

    # No id given to two events: every id keeps one payload wherever it was seen.
    seen: dict[str, int] = {}
    sources: list[tuple[str, dict[str, int]]] = [
        ("producer", producer.acked),
        ("log before", before.seqs),
        ("log after", final.seqs),
    ]
    for n, reader in enumerate([*everyone, *resumers]):
        sources.append((f"reader {n}", {f.id: f.json()["seq"] for f in reader.events if f.id}))
    for source, pairs in sources:
        for entry_id, seq in pairs.items():
            assert seen.setdefault(entry_id, seq) == seq, (
                f"id {entry_id} is seq {seen[entry_id]} and, to {source}, seq {seq}"
            )
    lost = [i for i in before.ids if i not in final.ids]
    assert lost, "the failover lost no write: the case proves nothing"
    for n, follower in enumerate(followers):
        check_reader(f"follower {n}", follower, None, before, final)
        assert follower.terminal is not None and follower.terminal.event == "gap"
        assert follower.done_at - resumed_at < NOTICE, f"follower {n}: gap late"
    for reader in [*readers, *resumers]:
        check_reader(f"reader from {reader.start}", reader, reader.start, before, final)
    (turn,) = [t for t in turns if t["run_id"] == run_id]
    assert turn["state"] == "success"
    assert turn["text"] == "".join(f"{final.seqs[i]} " for i in final.ids)
    acked_lost = [i for i in producer.acked if i not in final.ids]
    if replicated:
        assert acked_lost == [], f"acknowledged, then lost: {acked_lost}"
    else:  # what the setting prevents: acknowledged events did not survive
        assert acked_lost, "no acknowledged event was lost: the case proves nothing"
    return before, final, producer


# ------------------------------------------------------------------------------ Sentinel


@dataclass
class SentinelSetup:
    master: RedisServer
    replicas: list[RedisServer]
    sentinels: SentinelGroup
    forwarder: TcpForwarder
    current: RedisServer


@pytest.fixture
def sentinel_setup() -> Iterator[SentinelSetup]:
    master = RedisServer().start()
    replicas: list[RedisServer] = []
    try:
        replicas += [start_replica(master), start_replica(master)]
        with (
            SentinelGroup(master, replicas=2) as sentinels,
            TcpForwarder(master.address) as forwarder,
        ):
            yield SentinelSetup(master, replicas, sentinels, forwarder, master)
    finally:
        for server in [*replicas, master]:
            server.close()


def sentinel_failover(setup: SentinelSetup) -> Failover:
    async def hold_back() -> None:
        for replica in setup.replicas:
            wait_in_sync(setup.master, replica)
            detach(replica)

    async def fail_over() -> None:
        setup.master.kill()
        port = await anyio.to_thread.run_sync(
            lambda: setup.sentinels.wait_promoted(away_from=setup.master.port)
        )
        setup.current = next(r for r in setup.replicas if r.port == port)
        setup.forwarder.repoint((HOST, port))

    return Failover(hold_back, fail_over, lambda: setup.current)


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("clock", "acked"),
    [("in_step", 0), ("behind", 0), ("in_step", 1)],
    ids=["lost-writes", "lost-writes-clock-behind", "min-replicas-acked-1"],
)
async def test_a_sentinel_failover_that_lost_writes(
    sentinel_setup: SentinelSetup, key_prefix: str, clock: str, acked: int
) -> None:
    args = ["--min-replicas-acked", "1", "--replica-ack-timeout-seconds", ACK_TIMEOUT] * acked
    failover = sentinel_failover(sentinel_setup)
    failover.clock_behind = clock == "behind"
    with (
        GatewayProcess(
            sentinel_setup.forwarder.url, heartbeat=HEARTBEAT, key_prefix=key_prefix, args=args
        ) as a,
        GatewayProcess(
            sentinel_setup.forwarder.url, heartbeat=HEARTBEAT, key_prefix=key_prefix, args=args
        ) as b,
    ):
        _, _, producer = await lose_writes_in_a_failover(
            [a, b], failover, lambda run: f"{key_prefix}{{{run}}}:log", replicated=acked > 0
        )
    if acked:  # the writes the replicas missed were refused, never acknowledged
        assert set(LOST) <= set(producer.refused)
    else:
        assert not set(LOST) & set(producer.refused)


# ------------------------------------------------------------------------------ Cluster


@pytest.mark.cluster
@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    "clock", ["in_step", "behind"], ids=["lost-writes", "lost-writes-clock-behind"]
)
async def test_a_forced_cluster_failover_that_lost_writes(
    redis_cluster: RedisCluster, key_prefix: str, clock: str
) -> None:
    """The replica of the run's master takes over with `CLUSTER FAILOVER FORCE` while
    its writes are paused (`CLIENT PAUSE WRITE` holds back the master's replication
    stream, which the replica still reads): what the master wrote meanwhile is not on
    the replica when it takes over, and the old master, now its replica, drops it."""
    slot: dict[str, RedisServer] = {}  # the run's master and replica, then the current one

    def log_key(run_id: str) -> str:
        key = f"{key_prefix}{{{run_id}}}:log"
        master, replica = owner_of(redis_cluster, key)
        assert replica is not None
        slot.update(master=master, replica=replica, current=master)
        slot_key.append(key)
        return key

    slot_key: list[str] = []

    async def hold_back() -> None:
        with slot["master"].client() as c:  # every kept event is on the replica
            assert c.execute_command("WAIT", 1, 5000) == 1
        with slot["replica"].client() as c:
            c.execute_command("CLIENT", "PAUSE", 30_000, "WRITE")

    async def fail_over() -> None:
        replica = slot["replica"]
        with replica.client() as c:
            c.execute_command("CLUSTER", "FAILOVER", "FORCE")

        def promoted() -> bool:
            return owner_of(redis_cluster, slot_key[0])[0].port == replica.port

        with anyio.fail_after(30):
            while not await anyio.to_thread.run_sync(promoted):
                await anyio.sleep(0.05)
        unpause()
        slot["current"] = replica
        await anyio.to_thread.run_sync(redis_cluster.wait_ok)

    def unpause() -> None:
        if "replica" in slot:
            with slot["replica"].client() as c:
                c.execute_command("CLIENT", "UNPAUSE")

    failover = Failover(hold_back, fail_over, lambda: slot["current"], clock == "behind")
    url = cluster_url(redis_cluster)
    try:
        with (
            GatewayProcess(url, heartbeat=HEARTBEAT, key_prefix=key_prefix) as a,
            GatewayProcess(url, heartbeat=HEARTBEAT, key_prefix=key_prefix) as b,
        ):
            await lose_writes_in_a_failover([a, b], failover, log_key, replicated=False)
    finally:
        unpause()  # the cluster fixture outlives the test
