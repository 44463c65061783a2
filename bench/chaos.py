"""Chaos run: producers, subscribers, 3 gateways behind haproxy and one Redis (AOF,
appendfsync always) for a given duration, with faults injected at random (seeded); then
every subscriber's sequence is checked against what the producers were acknowledged and
every run against its log in Redis.

Processes (all real, all started here): one `redis-server --appendonly yes --appendfsync
always`, three `gateway serve` processes (one API key, also the operator's) on fixed
ports (so a restarted one is the same haproxy backend), haproxy from deploy/haproxy.cfg
(tests/support/proxies.py). Everything goes through haproxy except the `/metrics` scrapes.

Workload (an asyncio thread):
- N producers, each streaming runs of 20-120 `{"seq", "by"}` events (a few ms apart) and
  ending each run (`success`), then starting the next. Runs are claimed under a session
  (a new one every 5 runs, and after the producer's session was retired). A publish
  answered 502/503/504 or cut mid-request may or may not have been applied: the producer
  reads the run's `last_event_id` back before re-sending (docs/api.md), so every event is
  appended once. A producer fenced (409) or told 404 because an eviction took its run
  record abandons that run and starts another (counted).
- M subscribers, each following a run (mostly live ones) from the start through haproxy.
  Each connection ends at random: after an exponential hold time (`subscriber_disconnect`)
  or, as `read_disconnect`, after a random number of frames, after a random number of
  bytes (mid-frame), or a few ms after the request (before or while the gateway reads
  Redis); then it reconnects with `Last-Event-ID`. After a `gap` it rejoins as the frame
  says (`Last-Event-ID = latest_available_event_id`, from the start when that is null).
  Sometimes a subscriber leaves a run for good (its prefix is still checked).
- K session followers (2 by default), each following a producer's live session on the
  session feed (`/v1/sessions/{sid}/stream`) from its running turn, reconnecting with the
  last frame's id after an exponential hold time, until the session's last turn ended
  (its producer moved on), it was retired, or a gap.
- A sampler scrapes every gateway's `gateway_sse_open_subscribers` every 0.25 s.

Faults (the main thread, one at a time, every 1-3 s by default; each kind once per
round, rounds in a seeded random order):
- `gateway_kill`: SIGKILL a gateway, restart it after 0.5-2 s;
- `gateway_sigterm`: SIGTERM (graceful drain, must exit 0), restart it;
- `redis_outage`: SIGKILL Redis, keep it down 2-4 s, restart it (AOF replays);
- `producer_dies`: a producer shortens its lease to 1 s and stops sending, never ENDs:
  the run must end with exactly one `producer_lost` END (appended by a gateway);
- `zombie_producer`: a run is taken over (`takeover: true`, epoch+1); the new owner
  finishes it while the old token keeps writing events, renewing and ENDing: every one of
  those writes must be 409 `fenced` and none may appear in the log;
- `run_delete`: `DELETE /v1/runs/{id}` (operator) of a live run; its producer keeps
  writing;
- `session_retire`: `DELETE /v1/sessions/{sid}?retire=true` of a session with a turn in
  flight (every log of the session is removed); its producer keeps writing;
- `eviction`: `CONFIG SET maxmemory` below the memory in use with `maxmemory-policy
  volatile-lru` for 2-4 s (every gateway key has a TTL), then back to 0 / `noeviction`;
- `pubsub_kill`: `CLIENT KILL TYPE pubsub` (every gateway's notifier connection);
- `reply_drop`: gw1 reaches Redis through a relay (`tests/support/fault_relay.py`); its next
  script (an append, an END, a claim, a read) runs in Redis and its reply is lost: the
  gateway answers 503 and the producer retries (the case a turn record written after
  the append would miss; see the turn checks below);
- `failover`: Redis runs with a replica and the gateways reach it through a TCP forwarder;
  the replica is detached (in sync until then), the master acknowledges 0.2-1 s of writes
  it never gets, then the master's writes are paused, both servers' logs read, the
  master killed, the replica promoted and the forwarder moved to it: acknowledged events
  (sometimes ENDs, claims) are lost, known exactly; a new replica follows;
- `restart_empty`: SIGKILL Redis and start it again without its AOF: it comes back empty
  (treated as an eviction of every key);
- `claimed_again`: an ended run's keys removed (as their TTL would), then the same run id
  claimed again in a session of its own by the workload's claimer (10-40 events, END),
  while readers resume it with cursors of the lost incarnation;
- `subscriber_disconnect`, `read_disconnect`: counted as the subscribers cut.

After the duration: stop injecting, make sure every process is up, let producers finish
their runs, make every abandoned run end (`/wait` triggers the gateway's liveness check),
let subscribers reach their END, then read every run once more from the start. Checks:
- per run: the acknowledged ids are strictly increasing across removals (never repeated,
  never backwards); against the raw `XRANGE` of its log: the event ids equal the
  acknowledged ids (no loss, no duplicate from re-sends) with the payloads sent, seqs are
  0..n-1, no zombie entry, exactly one END, last, with the expected status. For a run
  whose log was removed (delete, retirement, eviction) the log holds only a suffix of
  that (or nothing): every event and the END sent after the last removal, none before;
- per subscription, split at its gaps: each part is a contiguous run of the acknowledged
  ids, in order, starting right after its cursor (from the first event when it started
  without one and the run was never removed), with identical payload bytes, ending with
  the expected END only after the run's last event, or with an explicit `gap` (counted);
  a silent skip, a repeated id, an END before the last event, a hang or a 404 (unless an
  eviction may have taken the run) is a violation;
- per run that lost acknowledged entries (a failover, an incarnation claimed again):
  its history is every entry it held, each with the losses it lived through; the log
  holds every acknowledged event no loss took. Each part of a subscription is entries
  that were next to each other in the log at some moment, its END one that followed its
  last event so: an event after a lost position (the new events after lost ones, a new
  incarnation after an old cursor) is a silent skip. Every gap must carry a reason;
- per turn (every run is a turn of a session): its turn record (read from Redis) equals
  what its log says: the record's text is the joined `text` of the log's events (of
  every acknowledged event when the log was removed and written again: the record
  outlives a removal), its state the END's status; a session's turns carry increasing
  orders in the order their claims were accepted. Runs an eviction may have touched and
  sessions retired are skipped (their records may be gone with them). Replies lost to
  gateway kills and Redis outages (a 5xx after Redis applied the write, then a retry)
  are what this checks the record against;
- per session follow: its turns are consecutive claims of the session (none skipped,
  none out of order, none repeated), and each turn's events are exactly its acknowledged
  events from the first, in order, with the payloads sent, its `turn_end` only after the
  last one and with the expected status; a gap only on a run a removal touched;
- open responses: a sample where the gateways hold more open SSE responses than there
  were client connections open at some moment from a second before the sample until
  its last answer (those open then, and those opened since) is a violation (a response
  outlived its client by more than 1 s), and once every subscriber is gone the gateways
  must reach 0 within 1 s. Samples above the most connections open at one moment are
  counted apart: a response that closes a little after its client while the client
  has already reconnected is one of those, and no fault.

Prints duration, events published, events verified, faults by kind, gaps, violations;
exits 1 on any violation (logs are kept then). Ctrl-C stops everything.

Run: .venv/bin/python bench/chaos.py --duration 60 [--seed N] [--producers 4]
     [--subscribers 8] [--faults run_delete,session_retire,...]
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import itertools
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common  # noqa: F401  (puts the repo root on sys.path)
import anyio
import httpx
import orjson

from tests.support.fault_relay import FaultRelay
from tests.support.proxies import GatewayProcess, Proxy, free_port
from tests.support.redis_servers import HOST, RedisServer
from tests.support.replication import detach, promote, wait_in_sync
from tests.support.sse_client import Frame, SSEParser
from tests.support.tcp_forwarder import TcpForwarder

MAYBE_APPLIED = frozenset({502, 503, 504})  # gateway 503, or haproxy when a backend died
KEY_PREFIX = "chaos:"
API_KEY = "chaos-operator-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
HEARTBEAT = 0.5
LEASE = 20.0  # >> any outage injected here: a live producer never loses its lease
DYING_LEASE = 1.0
RUNS_PER_SESSION = 5
OUTLIVE = 1.0  # seconds a response may outlive its client
SAMPLE_EVERY = 0.25
OPEN_GAUGE = "gateway_sse_open_subscribers"
MAX_GAPS = 50  # per follow: more means the gap frames do not lead anywhere
AOF_ALWAYS = ("--appendonly", "yes", "--appendfsync", "always")
FAULT_KINDS = (
    "gateway_kill",
    "gateway_sigterm",
    "redis_outage",
    "producer_dies",
    "zombie_producer",
    "run_delete",
    "session_retire",
    "eviction",
    "pubsub_kill",
    "reply_drop",
    "failover",
    "restart_empty",
    "claimed_again",
)
COUNTED_KINDS = (*FAULT_KINDS, "subscriber_disconnect", "read_disconnect")

Window = list[float]  # [start, end]: a removal may have happened in between (monotonic)
Entry = tuple[str, bytes | None, bool]  # a log entry: id, event data (None: END), is END
NEVER = 1 << 30  # the loss index of an entry no loss removed


class Aborted(Exception):
    pass


def key(event_id: str) -> tuple[int, int]:
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq)


@dataclass
class Run:
    run_id: str
    producer: int
    session_id: str
    claim_started: float
    claimed_at: float = float("inf")  # when the claim was answered 201
    ids: list[str] = field(default_factory=list)  # acknowledged (or read back) ids
    payloads: list[bytes] = field(default_factory=list)  # what each of them carries
    sent_at: list[float] = field(default_factory=list)  # first attempt of each
    acked_at: list[float] = field(default_factory=list)  # when each was acknowledged
    old_ends: list[str] = field(default_factory=list)  # ENDs of incarnations lost since
    old_sessions: list[str] = field(default_factory=list)  # sessions of those incarnations
    end_id: str | None = None  # the producer's END, as acknowledged
    end_sent_at: float | None = None
    deletes: list[Window] = field(default_factory=list)  # DELETE /v1/runs/{id}
    expected_end: str = "success"
    ended: bool = False  # the producer's END was acknowledged / the run is known ended
    abandoned_at: float | None = None
    evicted: bool = False  # its producer was fenced after an eviction took the record
    zombie_writes: int = 0  # zombie requests answered 409 fenced
    zombie_unsure: int = 0  # zombie requests answered 502/503/504 or cut


@dataclass
class Loss:
    """Redis lost acknowledged history: a failover to a replica that missed the newest
    writes, or a run's keys gone and the run claimed again. `before` is what each run's
    log held just before (writes paused), `after` what the server that carries on held,
    for the runs that lost something."""

    kind: str
    at: float
    before: dict[str, list[Entry]]
    after: dict[str, set[str]]


@dataclass
class Segment:
    """What a follow read from one cursor on, up to a gap (or its end)."""

    start: str | None  # the cursor it began from; None: from the start
    ids: list[str] = field(default_factory=list)
    data: list[bytes] = field(default_factory=list)
    terminal: str | None = None  # "end" | "gap"
    terminal_data: dict[str, Any] | None = None


@dataclass
class Follow:
    run_id: str
    who: str
    segments: list[Segment] = field(default_factory=list)
    outcome: str = "open"  # "terminal" | "left" | "unfinished" | "gap loop" | "http <code>"
    connections: int = 0

    @property
    def ids(self) -> list[str]:
        return [i for s in self.segments for i in s.ids]


@dataclass
class SessionFollow:
    """A follower of one session's feed: every frame it read, across reconnects."""

    session_id: str
    who: str
    frames: list[tuple[str, str, bytes]] = field(default_factory=list)  # id, event, data
    outcome: str = "open"  # "retired" | "gap" | "done" | "unfinished" | "http <code>"
    connections: int = 0


@dataclass
class Cut:
    """How one subscriber connection ends unless the stream ends first."""

    seconds: float
    frames: int | None = None
    bytes: int | None = None
    early: bool = False  # a few ms after the request


class Violations:
    def __init__(self) -> None:
        self.items: list[str] = []
        self.lock = threading.Lock()

    def add(self, text: str) -> None:
        with self.lock:
            self.items.append(text)
        print(f"VIOLATION: {text}", flush=True)


class Workload:
    """Producers and subscribers on one asyncio loop (run in a worker thread)."""

    def __init__(
        self,
        base_url: str,
        gateway_urls: list[str],
        args: argparse.Namespace,
        violations: Violations,
    ) -> None:
        self.base_url = base_url
        self.gateway_urls = gateway_urls
        self.args = args
        self.seed = args.seed
        self.violations = violations
        self.runs: list[Run] = []
        self.follows: list[Follow] = []
        self.session_follows: list[SessionFollow] = []
        self.stats: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        # Flags set from the main thread (plain attributes: the workload polls them).
        self.stop_producing = False
        self.abort = False
        self.die_requests: set[int] = set()
        self.zombie_requests: set[int] = set()
        self.current: dict[int, Run] = {}  # producer index -> the run it is streaming
        self.gone: set[str] = set()  # runs that answered 404 (an eviction took them)
        self.sessions: dict[int, int] = {}  # producer index -> its session generation
        self.retired: list[tuple[str, Window]] = []  # session id, when it was retired
        self.evictions: list[Window] = []  # when Redis may have evicted (end inf: now)
        self.failovers: list[Window] = []  # replica detached .. promoted: claims may be lost
        self.losses: list[Loss] = []  # in the order they happened
        self.again_requests: deque[Run] = deque()  # ended runs whose keys are gone
        # Client-side SSE connections (opened before the request, closed after the
        # socket is), and their history for the open-response check.
        self.sse_open = 0
        self.sse_history: deque[tuple[float, int]] = deque([(0.0, 0)])
        self.last_close = 0.0
        self.samples = 0
        self.samples_above_simultaneous = 0  # within the bound, above the tighter one
        self.t0 = time.monotonic()  # the main thread's clock origin, for messages
        self.sample_max = 0
        self.started = threading.Event()
        self.settled = threading.Event()
        self.error: BaseException | None = None

    # ------------------------------------------------------------------ plumbing
    def _check(self) -> None:
        if self.abort:
            raise Aborted

    async def _sleep(self, seconds: float) -> None:
        self._check()
        await anyio.sleep(seconds)
        self._check()

    def _client(self, keepalive: bool = True) -> httpx.AsyncClient:
        limits = httpx.Limits() if keepalive else httpx.Limits(max_keepalive_connections=0)
        timeout = httpx.Timeout(10.0, read=30.0)
        return httpx.AsyncClient(
            base_url=self.base_url, timeout=timeout, limits=limits, headers=AUTH
        )

    def thread_main(self) -> None:
        try:
            anyio.run(self.main)
        except BaseException as exc:  # reported by the main thread
            if not self.abort:
                self.error = exc
        finally:
            self.settled.set()

    async def main(self) -> None:
        async with anyio.create_task_group() as sampler:
            sampler.start_soon(self.sample_open_responses)
            async with anyio.create_task_group() as subscribers:
                self.spawn_follow = subscribers.start_soon
                for i in range(self.args.subscribers):
                    subscribers.start_soon(self.subscriber, i)
                for i in range(self.args.session_followers):
                    subscribers.start_soon(self.session_follower, i)
                async with anyio.create_task_group() as producers:
                    for i in range(self.args.producers):
                        producers.start_soon(self.producer, i)
                    producers.start_soon(self.claimer)
                    self.started.set()
                # stop_producing was set and the producers finished their last runs.
                await self.end_abandoned_runs()
                self.stop_following = True  # every run has ended: each follow gets its END
                with anyio.move_on_after(60) as scope:
                    while self.subscribers_running:  # noqa: ASYNC110 (a counter, polled)
                        await anyio.sleep(0.1)
                if scope.cancelled_caught:
                    self.follow_abort = True  # the stragglers become "unfinished" violations
            await self.final_replay()
            sampler.cancel_scope.cancel()
        await self.all_closed()

    stop_following = False
    follow_abort = False
    subscribers_running = 0
    spawn_follow: Any = None

    def eviction_touched(self, run: Run) -> bool:
        """Whether Redis may have lost `run`'s record: an eviction (or a restart that came
        back empty) that began by now and had not ended before the run was claimed, or
        a failover whose lost writes may hold its claim."""
        now = time.monotonic()
        if any(start <= now and end >= run.claim_started for start, end in self.evictions):
            return True
        return any(
            start <= run.claimed_at and end >= run.claim_started for start, end in self.failovers
        )

    # ------------------------------------------------------------------ producers
    def session_of(self, index: int, number: int) -> str:
        return f"chaos-{self.seed}-p{index}-s{number // RUNS_PER_SESSION}-{self.sessions[index]}"

    async def producer(self, index: int) -> None:
        rng = random.Random(self.seed * 1000 + index)
        self.sessions[index] = 0
        async with self._client() as client:
            number = 0
            while not self.stop_producing:
                session = self.session_of(index, number)
                run = Run(f"chaos-{self.seed}-p{index}-{number}", index, session, time.monotonic())
                number += 1
                token = await self._claim(client, run.run_id, session)
                run.claimed_at = time.monotonic()
                self.runs.append(run)
                self.current[index] = run
                await self._stream_run(client, rng, run, token, index)
                self.current.pop(index, None)
                await self._sleep(rng.uniform(0.05, 0.3))

    async def _stream_run(
        self, client: httpx.AsyncClient, rng: random.Random, run: Run, token: str, index: int
    ) -> None:
        length = rng.randint(20, 120)
        seq = 0
        async with anyio.create_task_group() as zombies:
            while seq < length:
                if index in self.die_requests and run.ids:
                    self.die_requests.discard(index)
                    await self._die(client, run, token)
                    return
                if index in self.zombie_requests and run.ids:
                    self.zombie_requests.discard(index)
                    old = token
                    token = await self._claim(client, run.run_id, run.session_id, takeover=True)
                    self.faults["zombie_producer"] += 1
                    zombies.start_soon(self._zombie, run, old, rng.randint(3, 10))
                if not await self._publish(client, run, seq, token):
                    return  # lost its lease (a violation) or its record (eviction)
                seq += 1
                await self._sleep(rng.uniform(0.005, 0.03))
            await self._end(client, run, token)

    async def claimer(self) -> None:
        """Claims again, under the same run id, the ended runs whose keys the main thread
        removed (`claimed_again`, as a TTL expiry would), in a session of their own; then
        10-40 events and an END. Readers resume it with cursors of the lost incarnation."""
        rng = random.Random(self.seed * 3000)
        async with self._client() as client:
            while not self.stop_producing or self.again_requests:
                if not self.again_requests:
                    await self._sleep(0.05)
                    continue
                run = self.again_requests.popleft()
                old = list(run.ids)
                token = await self._claim(client, run.run_id, run.session_id)
                run.claimed_at = time.monotonic()
                for cursor in dict.fromkeys([old[-1], old[len(old) // 2], None]):
                    self.stats["again_follows"] += 1
                    self.subscribers_running += 1
                    self.spawn_follow(self._follow_from, run, cursor, rng.random())
                for seq in range(len(old), len(old) + rng.randint(10, 40)):
                    if not await self._publish(client, run, seq, token):
                        break
                    await self._sleep(rng.uniform(0.005, 0.03))
                else:
                    await self._end(client, run, token)

    async def _follow_from(self, run: Run, cursor: str | None, seed: float) -> None:
        """A reader that resumes `run` at `cursor` (of a lost incarnation, or None)."""
        try:
            async with self._client(keepalive=False) as client:
                follow = Follow(run.run_id, "again")
                self.follows.append(follow)
                await self.follow(client, random.Random(seed), follow, None, start=cursor)
        finally:
            self.subscribers_running -= 1

    async def _claim(
        self, client: httpx.AsyncClient, run_id: str, session_id: str, takeover: bool = False
    ) -> str:
        """Claim (or take over) `run_id`. A claim answered 5xx may have been applied: the
        retry takes the lease over (our own lease, or the one it just created)."""
        backoff = 0.05
        while True:
            body = {
                "run_id": run_id,
                "session_id": session_id,
                "lease_seconds": LEASE,
                "takeover": takeover,
            }
            with contextlib.suppress(httpx.TransportError):
                response = await client.post("/v1/runs", json=body)
                if response.status_code == 201:
                    token: str = response.json()["producer_token"]
                    return token
                if response.status_code not in MAYBE_APPLIED:
                    raise RuntimeError(f"claim {run_id}: {response.status_code} {response.text}")
                self.stats["http_5xx"] += 1
            takeover = True
            await self._sleep(backoff)
            backoff = min(backoff * 2, 0.5)

    async def _last_event_id(self, client: httpx.AsyncClient, run: Run) -> tuple[bool, str | None]:
        """(found, last_event_id) of the run's record; found is False on a 404."""
        while True:
            with contextlib.suppress(httpx.TransportError):
                response = await client.get(f"/v1/runs/{run.run_id}")
                if response.status_code == 200:
                    last: str | None = response.json()["last_event_id"]
                    return True, last
                if response.status_code == 404 and self.eviction_touched(run):
                    return False, None
                if response.status_code not in MAYBE_APPLIED:
                    raise RuntimeError(f"read {run.run_id}: {response.status_code} {response.text}")
            await self._sleep(0.1)

    def _lost_to_eviction(self, run: Run, response: httpx.Response | None) -> bool:
        """A 409 fenced or a 404 after an eviction may have taken the record: the
        producer abandons the run (counted), not a violation."""
        if response is not None and response.status_code == 409:
            if response.json().get("error") != "fenced":
                return False
        elif response is not None and response.status_code != 404:
            return False
        if not self.eviction_touched(run):
            return False
        run.evicted = True
        run.expected_end = "producer_lost"  # if a log survives, a gateway may end it
        run.abandoned_at = time.monotonic()
        self.stats["runs_lost_to_eviction"] += 1
        return True

    async def _publish(self, client: httpx.AsyncClient, run: Run, seq: int, token: str) -> bool:
        """Append `{"seq": seq}` exactly once (idempotent accounting across 5xx)."""
        # `text` folds into the run's turn record (checked against the log at the end)
        data = {"seq": seq, "by": f"p{run.producer}", "text": f"{seq};"}
        body = {"event": "token", "data": data}
        headers = {"X-Producer-Token": token}
        sent_at = time.monotonic()
        backoff = 0.05

        def applied(event_id: str) -> bool:
            run.ids.append(event_id)
            run.payloads.append(orjson.dumps(data))
            run.sent_at.append(sent_at)
            run.acked_at.append(time.monotonic())
            self.stats["events_published"] += 1
            return True

        while True:
            response: httpx.Response | None = None
            with contextlib.suppress(httpx.TransportError):
                response = await client.post(
                    f"/v1/runs/{run.run_id}/events", json=body, headers=headers
                )
            if response is not None and response.status_code == 200:
                return applied(response.json()["ids"][0])
            if response is not None and response.status_code not in MAYBE_APPLIED:
                if self._lost_to_eviction(run, response):
                    return False
                self.violations.add(
                    f"run {run.run_id}: live producer's publish of seq {seq} refused: "
                    f"{response.status_code} {response.text}"
                )
                run.expected_end = "producer_lost"  # its lease is gone; a gateway ends it
                run.abandoned_at = time.monotonic()
                return False
            self.stats["publish_retries"] += 1
            await self._sleep(backoff)
            backoff = min(backoff * 2, 0.5)
            found, last = await self._last_event_id(client, run)
            if not found:
                self._lost_to_eviction(run, None)
                return False
            known = run.ids[-1] if run.ids else None
            if last is not None and last != known and (known is None or key(last) > key(known)):
                self.stats["applied_despite_5xx"] += 1
                return applied(last)  # the failed request had been applied

    async def _end(self, client: httpx.AsyncClient, run: Run, token: str) -> None:
        run.end_sent_at = time.monotonic()
        while True:  # END is idempotent: re-sending it is safe
            with contextlib.suppress(httpx.TransportError):
                response = await client.post(
                    f"/v1/runs/{run.run_id}/end",
                    json={"status": "success"},
                    headers={"X-Producer-Token": token},
                )
                if response.status_code == 200:
                    run.end_id = response.json()["id"]
                    run.ended = True
                    return
                if response.status_code not in MAYBE_APPLIED:
                    if self._lost_to_eviction(run, response):
                        run.end_sent_at = None
                        return
                    self.violations.add(
                        f"run {run.run_id}: END refused: {response.status_code} {response.text}"
                    )
                    return
            await self._sleep(0.1)

    async def _die(self, client: httpx.AsyncClient, run: Run, token: str) -> None:
        """Shorten the lease, then stop: no more events, never an END."""
        for _ in range(20):
            with contextlib.suppress(httpx.TransportError):
                response = await client.post(
                    f"/v1/runs/{run.run_id}/lease",
                    json={"lease_seconds": DYING_LEASE},
                    headers={"X-Producer-Token": token},
                )
                if response.status_code == 200:
                    break
            await self._sleep(0.1)  # if it never worked, the 20 s lease runs out instead
        run.expected_end = "producer_lost"
        run.abandoned_at = time.monotonic()
        self.faults["producer_dies"] += 1

    async def _zombie(self, run: Run, token: str, writes: int) -> None:
        """The old owner, unaware of the takeover: events, a lease renewal, an END."""
        headers = {"X-Producer-Token": token}
        async with self._client() as client:
            for k in range(writes + 2):
                if k < writes:
                    path = f"/v1/runs/{run.run_id}/events"
                    body: dict[str, Any] = {
                        "event": "token",
                        "data": {"seq": 100_000 + k, "by": "zombie"},
                    }
                elif k == writes:
                    path, body = f"/v1/runs/{run.run_id}/lease", {}
                else:
                    path, body = f"/v1/runs/{run.run_id}/end", {"status": "error"}
                try:
                    response = await client.post(path, json=body, headers=headers)
                except httpx.TransportError:
                    run.zombie_unsure += 1
                    continue
                if response.status_code in MAYBE_APPLIED:
                    run.zombie_unsure += 1
                elif response.status_code == 409 and response.json()["error"] == "fenced":
                    run.zombie_writes += 1
                    self.stats["zombie_writes_fenced"] += 1
                elif response.status_code == 404 and self.eviction_touched(run):
                    run.zombie_unsure += 1  # the record is gone: nothing to fence against
                else:
                    self.violations.add(
                        f"run {run.run_id}: zombie write {path} not fenced: "
                        f"{response.status_code} {response.text}"
                    )
                await self._sleep(0.02)

    async def end_abandoned_runs(self) -> None:
        """Every run a producer abandoned must get its producer_lost END: `/wait` makes a
        gateway watch it (liveness check once per heartbeat). A run an eviction took
        entirely answers 404."""
        pending = [r for r in self.runs if not r.ended]

        async def wait_end(run: Run) -> None:
            deadline = time.monotonic() + LEASE + 30
            async with self._client(keepalive=False) as client:
                while time.monotonic() < deadline:
                    with contextlib.suppress(httpx.TransportError):
                        response = await client.get(
                            f"/v1/runs/{run.run_id}/wait", params={"timeout": 5}
                        )
                        if response.status_code == 200 or (
                            response.status_code == 404 and self.eviction_touched(run)
                        ):
                            run.ended = True
                            return
                    await self._sleep(0.1)
            self.violations.add(f"run {run.run_id}: never ended (abandoned by its producer)")

        async with anyio.create_task_group() as tg:
            for run in pending:
                tg.start_soon(wait_end, run)

    # ---------------------------------------------------------------- subscribers
    def _pick(self, rng: random.Random) -> Run | None:
        if not self.runs:
            return None
        now = time.monotonic()
        live = [
            r
            for r in self.runs[-4 * self.args.producers :]
            if not r.ended
            and not r.evicted
            and (r.abandoned_at is None or now - r.abandoned_at < 5)
        ]
        if live and rng.random() < 0.8:
            return rng.choice(live)
        run = rng.choice(self.runs)
        return None if run.run_id in self.gone else run

    async def subscriber(self, index: int) -> None:
        rng = random.Random(self.seed * 1000 + 500 + index)
        self.subscribers_running += 1
        try:
            await self._subscriber(rng, index)
        finally:
            self.subscribers_running -= 1

    async def _subscriber(self, rng: random.Random, index: int) -> None:
        async with self._client(keepalive=False) as client:
            while not self.stop_following:
                run = self._pick(rng)
                if run is None:
                    await self._sleep(0.1)
                    continue
                follow = Follow(run.run_id, f"s{index}")
                self.follows.append(follow)
                leave_after = rng.uniform(0.5, 4.0) if rng.random() < 0.1 else None
                await self.follow(client, rng, follow, leave_after)
                await self._sleep(rng.uniform(0.0, 0.2))

    async def session_follower(self, index: int) -> None:
        """Follow producers' sessions on the session feed (`/v1/sessions/{sid}/stream`),
        from the running turn, reconnecting with the last frame's id after a cut, until
        the session's last turn ends (its producer moves on), it is retired, or a gap."""
        rng = random.Random(self.seed * 7000 + index)
        self.subscribers_running += 1
        try:
            async with self._client(keepalive=False) as client:
                while not self.stop_following:
                    live = [r for r in list(self.current.values()) if r.ids]
                    if not live:
                        await self._sleep(0.1)
                        continue
                    run = rng.choice(live)
                    follow = SessionFollow(run.session_id, f"f{index}")
                    self.session_follows.append(follow)
                    await self._follow_session(client, rng, follow)
        finally:
            self.subscribers_running -= 1

    async def _follow_session(
        self, client: httpx.AsyncClient, rng: random.Random, follow: SessionFollow
    ) -> None:
        path = f"/v1/sessions/{follow.session_id}/stream"
        while True:
            if self.abort or self.follow_abort:
                follow.outcome = "unfinished"
                return
            cursor = follow.frames[-1][0] if follow.frames else None
            headers = {"Last-Event-ID": cursor} if cursor else {}
            hold = rng.expovariate(1 / self.args.hold) if self.args.hold else float("inf")
            with anyio.move_on_after(hold) as scope:
                self._sse_count(+1)
                try:
                    async with client.stream("GET", path, headers=headers) as response:
                        if response.status_code >= 500:
                            self.stats["sse_5xx"] += 1
                            await response.aread()
                        elif response.status_code == 204:  # after a gap or retirement
                            return
                        elif response.status_code != 200:
                            follow.outcome = f"http {response.status_code}"
                            return
                        else:
                            follow.connections += 1
                            parser = SSEParser()
                            async for chunk in response.aiter_raw():
                                for frame in parser.feed(chunk):
                                    if self.stop_following and self._between_turns(follow):
                                        follow.outcome = "done"
                                        return
                                    if frame.id is None or frame.event == "unavailable":
                                        continue  # heartbeats, retry hints, comments
                                    event = frame.event or "message"
                                    follow.frames.append((frame.id, event, frame.data))
                                    if event in ("end", "gap"):
                                        follow.outcome = "retired" if event == "end" else "gap"
                                        return
                                    if event == "turn_end" and self._session_done(frame.id):
                                        follow.outcome = "done"
                                        return
                except httpx.TransportError:
                    self.stats["sse_drops"] += 1
                finally:
                    self._sse_count(-1)
            if scope.cancelled_caught:
                self.faults["subscriber_disconnect"] += 1
            if self.stop_following and self._between_turns(follow):
                follow.outcome = "done"
                return
            await anyio.sleep(0.05)

    @staticmethod
    def _between_turns(follow: SessionFollow) -> bool:
        return not follow.frames or follow.frames[-1][1] == "turn_end"

    def _session_done(self, frame_id: str) -> bool:
        """Whether the turn that just ended was its session's last (its producer opens a
        new session after RUNS_PER_SESSION runs)."""
        run_id = frame_id.split("/", 1)[0]
        return int(run_id.rsplit("-", 1)[1]) % RUNS_PER_SESSION == RUNS_PER_SESSION - 1

    def _cut(self, rng: random.Random, hold_mean: float) -> Cut:
        """A hold time (exponential) and, for half of the connections, an earlier cut:
        after 0-40 frames (mid-replay, mid-stream), after 0-6000 bytes (mid-frame), or
        0-50 ms after the request (while the gateway reads Redis)."""
        if not hold_mean:
            return Cut(float("inf"))
        hold = rng.expovariate(1 / hold_mean)
        r = rng.random()
        if r < 0.5:
            return Cut(hold)
        if r < 0.7:
            return Cut(hold, frames=rng.randint(0, 40))
        if r < 0.85:
            return Cut(hold, bytes=rng.randint(0, 6000))
        return Cut(rng.uniform(0.0, 0.05), early=True)

    def _sse_count(self, delta: int) -> None:
        now = time.monotonic()
        self.sse_open += delta
        self.sse_history.append((now, self.sse_open))
        if delta < 0:
            self.last_close = now
        while len(self.sse_history) > 2 and self.sse_history[1][0] < now - 10:
            self.sse_history.popleft()

    def _clients_open_since(self, since: float) -> int:
        """The most client connections open at any one moment from `since` until now."""
        most = 0
        for at, count in reversed(self.sse_history):
            most = max(most, count)
            if at <= since:
                break
        return most

    def _clients_seen_since(self, since: float) -> int:
        """How many client connections were open at some moment from `since` until now:
        those open at `since` and those opened after it. The gateways' counts are
        scraped one by one, and a response may close up to OUTLIVE after its client
        (which may have reconnected meanwhile), so this, not the most open at one
        moment, bounds what they may hold together."""
        history = list(self.sse_history)
        start = 0
        for i, (at, _) in enumerate(history):
            if at <= since:
                start = i
        seen = history[start][1]
        for (_, before), (_, after) in itertools.pairwise(history[start:]):
            if after > before:
                seen += 1
        return seen

    async def follow(
        self,
        client: httpx.AsyncClient,
        rng: random.Random,
        follow: Follow,
        leave_after: float | None,
        hold_mean: float | None = None,
        start: str | None = None,
    ) -> None:
        """Follow to END, reconnecting with Last-Event-ID after a drop, a cut, a clean
        end without END (drain), an `unavailable` frame or a 5xx; after a gap, rejoin at
        the gap's latest available id (from the start when it has none)."""
        hold_mean = self.args.hold if hold_mean is None else hold_mean
        started = time.monotonic()
        path = f"/v1/runs/{follow.run_id}/stream"
        segment = Segment(start)
        follow.segments.append(segment)
        while True:
            if self.abort or self.follow_abort:
                follow.outcome = "unfinished"
                return
            if leave_after is not None and time.monotonic() - started > leave_after:
                follow.outcome = "left"
                return
            cursor = segment.ids[-1] if segment.ids else segment.start
            headers = {"Last-Event-ID": cursor} if cursor else {}
            retry_ms = 1000
            cut = self._cut(rng, hold_mean)
            cut_early = False  # a frame or byte budget ran out
            gap: Frame | None = None
            with anyio.move_on_after(cut.seconds) as scope:
                self._sse_count(+1)
                try:
                    async with client.stream("GET", path, headers=headers) as response:
                        if response.status_code >= 500:
                            self.stats["sse_5xx"] += 1
                            await response.aread()
                        elif response.status_code != 200:
                            follow.outcome = f"http {response.status_code}"
                            if response.status_code == 404:
                                self.gone.add(follow.run_id)  # picked again only if live
                            return
                        else:
                            follow.connections += 1
                            parser, frames, received = SSEParser(), 0, 0
                            async for chunk in response.aiter_raw():
                                if cut.bytes is not None and received + len(chunk) >= cut.bytes:
                                    chunk, cut_early = chunk[: cut.bytes - received], True
                                received += len(chunk)
                                for frame in parser.feed(chunk):
                                    if self.abort or self.follow_abort:
                                        follow.outcome = "unfinished"
                                        return
                                    frames += 1
                                    if frame.retry is not None:
                                        retry_ms = frame.retry
                                    if frame.data_id is not None:
                                        segment.ids.append(frame.data_id)
                                        segment.data.append(frame.data)
                                    elif frame.event == "end":
                                        segment.terminal = "end"
                                        segment.terminal_data = frame.json()
                                        follow.outcome = "terminal"
                                        return
                                    elif frame.event == "gap":
                                        gap = frame
                                        break
                                    elif frame.event == "unavailable":
                                        self.stats["sse_unavailable_frames"] += 1
                                    if cut.frames is not None and frames >= cut.frames:
                                        cut_early = True
                                        break
                                if cut_early or gap is not None:
                                    break
                            else:
                                self.stats["sse_clean_ends_without_end"] += 1  # drain
                except httpx.TransportError:
                    self.stats["sse_drops"] += 1
                finally:
                    self._sse_count(-1)
            if gap is not None:
                segment.terminal, segment.terminal_data = "gap", gap.json()
                self.stats["gaps_seen"] += 1
                if len(follow.segments) > MAX_GAPS:
                    follow.outcome = "gap loop"
                    return
                latest = (segment.terminal_data or {}).get("latest_available_event_id")
                segment = Segment(latest if isinstance(latest, str) else None)
                follow.segments.append(segment)
                continue  # after reloading durable state, at once
            if cut_early or (scope.cancelled_caught and cut.early):
                self.faults["read_disconnect"] += 1
            elif scope.cancelled_caught:
                self.faults["subscriber_disconnect"] += 1
            # Honour the jittered retry hint, scaled down (1-3 s -> 0.1-0.3 s).
            await anyio.sleep(min(retry_ms, 3000) / 10_000)

    async def final_replay(self) -> None:
        """Every run read once more from the start, without disconnects."""
        rng = random.Random(self.seed)
        limit = anyio.Semaphore(4)

        async def one(run: Run) -> None:
            async with limit, self._client(keepalive=False) as client:
                follow = Follow(run.run_id, "final")
                self.follows.append(follow)
                with anyio.move_on_after(30):
                    await self.follow(client, rng, follow, None, hold_mean=0)
                if follow.outcome == "open":
                    follow.outcome = "unfinished"

        async with anyio.create_task_group() as tg:
            for run in self.runs:
                tg.start_soon(one, run)

    # ------------------------------------------------------------ open responses
    async def _gateways_open(self, client: httpx.AsyncClient) -> list[int]:
        """Each gateway's open SSE responses (a gateway that does not answer counts 0: a
        dead one holds none, and a partial sum is still a lower bound)."""
        counts = [0] * len(self.gateway_urls)

        async def one(n: int, url: str) -> None:
            with contextlib.suppress(httpx.HTTPError):
                text = (await client.get(url + "/metrics", timeout=2)).text
                for line in text.splitlines():
                    if line.startswith(OPEN_GAUGE + " "):
                        counts[n] = int(float(line.rsplit(" ", 1)[1]))

        async with anyio.create_task_group() as tg:
            for n, url in enumerate(self.gateway_urls):
                tg.start_soon(one, n, url)
        return counts

    async def sample_open_responses(self) -> None:
        """Every SAMPLE_EVERY: the gateways may hold no more SSE responses than the
        client had connections open at some moment of the OUTLIVE seconds before."""
        async with httpx.AsyncClient(headers=AUTH) as client:
            while True:
                await anyio.sleep(SAMPLE_EVERY)
                before = time.monotonic()
                counts = await self._gateways_open(client)
                held = sum(counts)
                clients = self._clients_seen_since(before - OUTLIVE)
                self.samples += 1
                self.sample_max = max(self.sample_max, held)
                if held > self._clients_open_since(before - OUTLIVE):
                    self.samples_above_simultaneous += 1
                if held > clients:
                    self.violations.add(
                        f"{held} SSE responses open on the gateways {counts}, but only "
                        f"{clients} client connections open in the {OUTLIVE:g} s before "
                        f"(t={before - self.t0:.1f}s)"
                    )

    async def all_closed(self) -> None:
        """Every subscriber is gone: the gateways must hold 0 responses within OUTLIVE."""
        async with httpx.AsyncClient(headers=AUTH) as client:
            while True:
                counts = await self._gateways_open(client)
                held = sum(counts)
                if held == 0:
                    return
                if time.monotonic() > self.last_close + OUTLIVE:
                    self.violations.add(
                        f"{held} SSE responses still open {OUTLIVE:g} s after the last "
                        f"subscriber disconnected {counts}"
                    )
                    return
                await anyio.sleep(0.05)


# ------------------------------------------------------------------------ verification


def removed_until(run: Run, workload: Workload) -> float | None:
    """The end of the last removal that may have taken this run's log (None: never): a
    delete, a retirement, an eviction or an empty restart, or a failover that may have
    lost its claim."""
    windows = [*run.deletes, *workload.evictions]
    windows += [w for session, w in workload.retired if session == run.session_id]
    windows += [w for w in workload.failovers if w[0] <= run.claimed_at]
    ends = [end for start, end in windows if end >= run.claim_started]
    return max(ends) if ends else None


@dataclass
class History:
    """Every entry a run's log held that the run knows of (acknowledged, or read at a
    loss, or in the final log), in id order, each with the losses it lived through: it
    was written after `born` of the run's losses and removed by loss `died` (NEVER: it
    is in the log now). Two entries were in the log together with nothing between them
    (so a reader may get one right after the other) when some epoch E (the log between
    two losses) holds both and none of the entries between them."""

    ids: list[str]
    data: list[bytes | None]  # an event's data; None for an END
    born: list[int]
    died: list[int]
    index: dict[str, int]

    def end_may_follow(self, position: str | None) -> bool:
        """Whether an END the history does not know (one a gateway appended, then lost
        with the log to a removal) may have followed `position`: in some epoch that
        holds the position, no event after it."""
        n = self.index.get(position) if position is not None else None
        born, died = (0, NEVER) if n is None else (self.born[n], self.died[n])
        first = (
            0
            if position is None
            else bisect.bisect_right([key(i) for i in self.ids], key(position))
        )
        last = max([*self.born, *(d for d in self.died if d != NEVER)], default=0) + 1
        for epoch in range(born, min(died, last) + 1):
            if not any(
                self.data[x] is not None and self.born[x] <= epoch <= self.died[x]
                for x in range(first, len(self.ids))
            ):
                return True
        return False

    def lost(self) -> set[str]:
        return {i for i, d in zip(self.ids, self.died, strict=True) if d != NEVER}

    def after(self, position: str | None, entry: int) -> bool:
        """Whether a reader at `position` (None: the start) may get `entry` next."""
        if position is None:
            first, born_a, died_a = 0, 0, NEVER
        elif position in self.index:
            a = self.index[position]
            first, born_a, died_a = a + 1, self.born[a], self.died[a]
        else:  # a cursor the run never held: the next entry is the first above it
            first = bisect.bisect_right([key(i) for i in self.ids], key(position))
            born_a, died_a = 0, NEVER
        if first > entry:
            return False
        between = max(self.died[first:entry], default=-1)
        low = max(born_a, self.born[entry], between + 1)
        return low <= min(died_a, self.died[entry])


def history(run: Run, losses: list[Loss], log: list[tuple[str, dict[bytes, bytes]]]) -> History:
    mine = [loss for loss in losses if run.run_id in loss.before]
    entries: dict[str, bytes | None] = dict(zip(run.ids, run.payloads, strict=True))
    for end in [*run.old_ends, run.end_id]:
        if end is not None:
            entries[end] = None
    for loss in mine:
        for entry_id, data, _ in loss.before[run.run_id]:
            entries.setdefault(entry_id, data)
    for entry_id, fields in log:
        entries.setdefault(entry_id, fields.get(b"d"))
    held = [{i for i, _, _ in loss.before[run.run_id]} for loss in mine]
    acked_at = dict(zip(run.ids, run.acked_at, strict=True))
    ids = sorted(entries, key=key)
    born, died = [], []
    for entry_id in ids:
        first = next((k for k, h in enumerate(held) if entry_id in h), None)
        if first is None:  # written after the last loss that saw it (or never seen)
            at = acked_at.get(entry_id, float("inf"))
            first = sum(1 for loss in mine if loss.at < at)
        born.append(first)
        died.append(
            next(
                (
                    k
                    for k, (h, loss) in enumerate(zip(held, mine, strict=True))
                    if entry_id in h and entry_id not in loss.after[run.run_id]
                ),
                NEVER,
            )
        )
    return History(ids, [entries[i] for i in ids], born, died, {i: n for n, i in enumerate(ids)})


def verify_run(
    run: Run,
    log: list[tuple[str, dict[bytes, bytes]]],
    until: float | None,
    lost: set[str],
    violations: Violations,
) -> None:
    """`lost`: acknowledged entries a failover or a lost incarnation took (known
    exactly): the log must hold every other one."""
    rid = run.run_id
    keys = [key(i) for i in run.ids]
    if any(a >= b for a, b in itertools.pairwise(keys)):
        violations.add(f"run {rid}: acknowledged ids repeat or go backwards")
    if run.end_id is not None and keys and key(run.end_id) <= keys[-1]:
        violations.add(f"run {rid}: END id {run.end_id} not above the last event")
    if reused := set(run.old_ends) & {*run.ids, run.end_id}:
        violations.add(f"run {rid}: the id of a lost incarnation's END reused: {reused}")
    if lost:
        kept = [n for n, i in enumerate(run.ids) if i not in lost]
        run = Run(
            rid,
            run.producer,
            run.session_id,
            run.claim_started,
            ids=[run.ids[n] for n in kept],
            payloads=[run.payloads[n] for n in kept],
            sent_at=[run.sent_at[n] for n in kept],
            end_id=run.end_id,
            end_sent_at=run.end_sent_at,
            expected_end=run.expected_end,
            evicted=run.evicted,
        )
        seqs = [orjson.loads(p).get("seq") for p in run.payloads]
    else:
        seqs = list(range(len(run.ids)))
    events = [(i, f[b"d"]) for i, f in log if b"e" in f]
    ends = [(n, f[b"end"].decode()) for n, (_, f) in enumerate(log) if b"end" in f]
    allowed_ends = {run.expected_end, "success"} if run.evicted else {run.expected_end}
    if len(ends) > 1 or (until is None and len(ends) != 1):
        violations.add(f"run {rid}: {len(ends)} END entries in the log")
    elif ends and ends[0][0] != len(log) - 1:
        violations.add(f"run {rid}: END is not the last log entry")
    elif ends and ends[0][1] not in allowed_ends:
        violations.add(f"run {rid}: END {ends[0][1]!r}, expected {run.expected_end!r}")
    elif not ends and until is not None and (run.end_sent_at or 0) > until:
        violations.add(f"run {rid}: no END in the log, though it was written after the removal")
    payloads = [orjson.loads(d) for _, d in events]
    if any(p.get("by") == "zombie" for p in payloads):
        violations.add(f"run {rid}: a zombie write is in the log")
    skipped = len(run.ids) - len(events)  # removed with an earlier log
    if until is None and skipped:
        violations.add(
            f"run {rid}: log ids differ from the acknowledged ids "
            f"(log {len(events)}, acknowledged {len(run.ids)})"
        )
    elif skipped < 0 or [i for i, _ in events] != run.ids[skipped:]:
        violations.add(
            f"run {rid}: the log is not the acknowledged ids "
            f"{'' if until is None else '(or a suffix of them) '}"
            f"(log {len(events)}, acknowledged {len(run.ids)})"
        )
    elif [d for _, d in events] != run.payloads[skipped:]:
        violations.add(f"run {rid}: log payloads differ from what was sent")
    elif [p.get("seq") for p in payloads] != seqs[skipped:]:
        violations.add(f"run {rid}: log seqs are not consecutive (loss or duplicate)")
    elif until is not None and skipped > bisect.bisect_right(run.sent_at, until):
        violations.add(
            f"run {rid}: the log lacks {skipped - bisect.bisect_right(run.sent_at, until)} "
            "events written after its last removal"
        )


def describe(f: Follow, index: dict[str, int]) -> str:
    """A follow's parts, for a violation's report: cursor, the acknowledged positions
    of what it read, and how each part ended."""
    parts = []
    for n, s in enumerate(f.segments):
        got = [index.get(i, -1) for i in s.ids]
        span = f"#{got[0]}..#{got[-1]} ({len(got)})" if got else "nothing"
        contiguous = "" if got == list(range(got[0], got[0] + len(got))) else " not contiguous"
        parts.append(
            f"part {n} from {s.start}: {span}{contiguous}, then {s.terminal} {s.terminal_data}"
        )
    return f"{f.connections} connections; " + "; ".join(parts)


def verify_follow(f: Follow, run: Run, exposed: bool, violations: Violations) -> int:
    """Checks one subscription against the run's acknowledged ids; returns the events
    verified (or -1 after a violation)."""
    where = f"follow {f.who} of {f.run_id}"
    ids = f.ids
    keys = [key(i) for i in run.ids]
    index = {i: n for n, i in enumerate(run.ids)}
    if len(set(ids)) != len(ids) or any(key(a) >= key(b) for a, b in itertools.pairwise(ids)):
        repeated = [i for i in sorted(set(ids)) if ids.count(i) > 1]
        what = f"a repeated id {repeated[0]}" if repeated else "ids that go backwards"
        violations.add(f"{where}: {what}; {describe(f, index)}")
        return -1
    for part, segment in enumerate(f.segments):
        position = segment.start
        for event_id, data in zip(segment.ids, segment.data, strict=True):
            if position is None and exposed:
                expected = index.get(event_id, -1)  # from the start of whatever log is left
            else:
                expected = 0 if position is None else bisect.bisect_right(keys, key(position))
            if expected < 0 or expected >= len(run.ids) or run.ids[expected] != event_id:
                got = index.get(event_id, "not acknowledged")
                violations.add(
                    f"{where}: silent skip in part {part} (cursor {segment.start}): after "
                    f"{position} got {event_id} (#{got}), expected "
                    f"{run.ids[expected] if 0 <= expected < len(run.ids) else 'no event'} "
                    f"(#{expected}) ({len(run.ids)} acknowledged); {describe(f, index)}"
                )
                return -1
            if data != run.payloads[expected]:
                violations.add(f"{where}: payload of {event_id} differs from what was sent")
                return -1
            position = event_id
        if segment.terminal == "end":
            status = (segment.terminal_data or {}).get("status")
            if position is None:
                missing = 0 if exposed else len(run.ids)
            else:
                missing = len(run.ids) - bisect.bisect_right(keys, key(position))
            allowed = {run.expected_end, "success"} if run.evicted else {run.expected_end}
            if missing:
                violations.add(
                    f"{where}: END after {position} with {missing} later events never "
                    f"delivered (part {part}, cursor {segment.start}): a silent partial; "
                    f"{describe(f, index)}"
                )
                return -1
            if status not in allowed:
                violations.add(f"{where}: END {status!r}, expected {run.expected_end!r}")
                return -1
    return len(ids)


def verify_follow_history(
    f: Follow, run: Run, hist: History, exposed: bool, violations: Violations
) -> int:
    """`verify_follow` for a run that lost acknowledged entries: each part holds entries
    that were next to each other in the log at some moment (`History.after`), its END
    one that followed its last event so; an event after a position the log lost, or
    after a gap in what the log held, is a violation."""
    where = f"follow {f.who} of {f.run_id}"
    ids = f.ids
    if len(set(ids)) != len(ids) or any(key(a) >= key(b) for a, b in itertools.pairwise(ids)):
        repeated = [i for i in sorted(set(ids)) if ids.count(i) > 1]
        what = f"a repeated id {repeated[0]}" if repeated else "ids that go backwards"
        violations.add(f"{where}: {what}; {describe(f, hist.index)}")
        return -1
    ends = [n for n, d in enumerate(hist.data) if d is None]
    for part, segment in enumerate(f.segments):
        position = segment.start
        for event_id, data in zip(segment.ids, segment.data, strict=True):
            n = hist.index.get(event_id)
            if n is None or hist.data[n] is None:
                violations.add(f"{where}: {event_id} was never an event of the run")
                return -1
            if not (position is None and exposed) and not hist.after(position, n):
                violations.add(
                    f"{where}: after {position} got {event_id} (part {part}, cursor "
                    f"{segment.start}), never next to it in the log (lost: "
                    f"{len(hist.lost())}): a silent skip; {describe(f, hist.index)}"
                )
                return -1
            if data != hist.data[n]:
                violations.add(f"{where}: payload of {event_id} differs from what was sent")
                return -1
            position = event_id
        if segment.terminal == "end":
            status = (segment.terminal_data or {}).get("status")
            # an END of a lost incarnation, or one lost in a failover, was `success`
            allowed = {run.expected_end, "success"}
            known = any(hist.after(position, e) for e in ends)
            # an END appended by a gateway and then removed with the log is unknown here
            unknown = exposed and hist.end_may_follow(position)
            if not (position is None and exposed) and not known and not unknown:
                violations.add(
                    f"{where}: END after {position} (part {part}, cursor {segment.start}), "
                    f"which no END of the log followed: a silent partial; "
                    f"{describe(f, hist.index)}"
                )
                return -1
            if status not in allowed:
                violations.add(f"{where}: END {status!r}, expected {run.expected_end!r}")
                return -1
    return len(ids)


def folded_text(log: list[tuple[str, dict[bytes, bytes]]], meta: dict[bytes, bytes]) -> str:
    """What the turn record's text key must hold, given its log and run record: the text
    of every event, or, while a fold is pending (lua/turn_fold.lua: `tpend` entries
    after `tfold` wait in the log until a read, the END or the 64th folds them), of the
    events up to `tfold`. Readers get the fold (turn_read.lua folds first)."""
    pending = int(meta.get(b"tpend", b"0") or b"0") > 0
    upto = _id_key(meta.get(b"tfold", b"0-0").decode()) if pending else None
    return "".join(
        orjson.loads(f[b"d"]).get("text", "")
        for i, f in log
        if b"e" in f and (upto is None or _id_key(i) <= upto)
    )


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def verify_turns(
    records: dict[str, dict[bytes, bytes]],
    texts: dict[str, bytes],
    metas: dict[str, dict[bytes, bytes]],
    logs: dict[str, list[tuple[str, dict[bytes, bytes]]]],
    until: dict[str, float | None],
    lost: dict[str, set[str]],
    workload: Workload,
    violations: Violations,
) -> tuple[int, int]:
    """Every turn record equals what its log says, and a session's turns are in the
    order their claims were accepted. Returns (records verified, sessions in order)."""
    retired = {session for session, _ in workload.retired}
    checked = 0
    orders: dict[str, list[tuple[int, int, str]]] = {}
    for run in workload.runs:
        rid, record = run.run_id, records.get(run.run_id, {})
        if run.evicted or workload.eviction_touched(run) or run.session_id in retired:
            continue  # its record may be gone with its keys (or its session)
        if not record:
            violations.add(f"turn {rid}: no turn record")
            continue
        if record.get(b"session", b"").decode() != run.session_id:
            violations.add(f"turn {rid}: recorded under another session")
        number = int(rid.rsplit("-", 1)[1])
        orders.setdefault(run.session_id, []).append((number, int(record.get(b"order", b"0")), rid))
        log = logs[rid]
        ends = [f[b"end"].decode() for _, f in log if b"end" in f]
        state = record.get(b"state", b"").decode()
        if until[rid] is None:
            # the whole log: the record's text is its events' text (folded), its state
            # the END
            text = folded_text(log, metas.get(rid, {}))
            if ends and state != ends[0]:
                violations.add(f"turn {rid}: state {state!r}, the log ended {ends[0]!r}")
        else:
            # the log was removed (and written again): the record holds every
            # acknowledged event (it outlives a removal of the log)
            gone = lost.get(rid, set())  # a failover takes the record's part with the log
            text = "".join(
                orjson.loads(p).get("text", "")
                for i, p in zip(run.ids, run.payloads, strict=True)
                if i not in gone
            )
            if run.ended and state != run.expected_end:
                violations.add(f"turn {rid}: state {state!r}, expected {run.expected_end!r}")
        if texts.get(rid, b"").decode() != text:
            violations.add(
                f"turn {rid}: record text differs from its log's "
                f"({len(texts.get(rid, b''))} vs {len(text)} chars)"
            )
        checked += 1
    in_order = 0
    for session, turns in orders.items():
        turns.sort()
        if any(a[1] >= b[1] for a, b in itertools.pairwise(turns)):
            violations.add(f"session {session}: turns out of claim order {turns}")
        else:
            in_order += 1
    return checked, in_order


def verify_session_follows(
    workload: Workload,
    until: dict[str, float | None],
    lossy: set[str],
    violations: Violations,
) -> tuple[int, int]:
    """Every session follower's turns are the session's claims in order (consecutive
    runs of its producer, none skipped), and each turn's events are exactly its
    acknowledged events from the first, through its END, or end in an explicit gap on a
    run a removal touched. Returns (follows checked, turns followed)."""
    runs = {run.run_id: run for run in workload.runs}
    followed = 0
    for f in workload.session_follows:
        where = f"session follow {f.who} of {f.session_id}"
        if f.outcome.startswith("http") or f.outcome in ("open", "unfinished"):
            violations.add(f"{where}: {f.outcome} after {len(f.frames)} frames")
            continue
        order: list[str] = []
        events: dict[str, list[tuple[str, bytes]]] = {}
        ends: dict[str, str] = {}
        for frame_id, event, data in f.frames:
            run_id, _, position = frame_id.partition("/")
            if event == "end":  # retired
                continue
            if run_id not in runs:
                violations.add(f"{where}: a frame of an unknown run {frame_id}")
                continue
            if not order or order[-1] != run_id:
                if run_id in order:
                    violations.add(f"{where}: turn {run_id} came back after another")
                order.append(run_id)
            if event == "turn_end":
                ends[run_id] = orjson.loads(data).get("status")
            elif event == "gap":
                if until[run_id] is None and run_id not in lossy:
                    violations.add(f"{where}: gap in {run_id}, never removed: {data!r}")
            elif event != "turn":
                events.setdefault(run_id, []).append((position, data))
        for a, b in itertools.pairwise(order):
            number_a, number_b = (int(r.rsplit("-", 1)[1]) for r in (a, b))
            sessions = {runs[b].session_id, *runs[b].old_sessions}
            if f.session_id not in sessions or number_b != number_a + 1:
                violations.add(f"{where}: turn {b} followed {a} (a turn skipped or out of order)")
        for run_id in order:
            run, got = runs[run_id], events.get(run_id, [])
            if len({p for p, _ in got}) != len(got):
                violations.add(f"{where}: {run_id}: an event repeated")
                continue
            if until[run_id] is not None or run.evicted or run_id in lossy:
                continue  # a removal or loss changes the log under the reader
            if [p for p, _ in got] != run.ids[: len(got)]:
                violations.add(f"{where}: {run_id}: events are not its first ones in order")
            elif [d for _, d in got] != run.payloads[: len(got)]:
                violations.add(f"{where}: {run_id}: payloads differ from what was sent")
            elif run_id in ends and (len(got) != len(run.ids) or ends[run_id] != run.expected_end):
                violations.add(
                    f"{where}: {run_id}: turn_end {ends[run_id]!r} after {len(got)} of "
                    f"{len(run.ids)} events"
                )
        followed += len(order)
    return len(workload.session_follows), followed


def verify(
    redis: RedisServer, workload: Workload, violations: Violations
) -> tuple[int, int, int, int, int]:
    """Returns (events verified, gaps, gaps on runs never removed, turn records
    verified, sessions whose turns are in claim order)."""
    logs: dict[str, list[tuple[str, dict[bytes, bytes]]]] = {}
    records: dict[str, dict[bytes, bytes]] = {}
    texts: dict[str, bytes] = {}
    metas: dict[str, dict[bytes, bytes]] = {}
    with redis.client() as c:
        for run in workload.runs:
            key_name = f"{KEY_PREFIX}{{{run.run_id}}}:log"
            logs[run.run_id] = [(i.decode(), f) for i, f in c.xrange(key_name)]
            records[run.run_id] = c.hgetall(f"{KEY_PREFIX}{{{run.run_id}}}:turn")
            texts[run.run_id] = c.get(f"{KEY_PREFIX}{{{run.run_id}}}:text") or b""
            metas[run.run_id] = c.hgetall(f"{KEY_PREFIX}{{{run.run_id}}}:meta")
    runs = {run.run_id: run for run in workload.runs}
    until = {run.run_id: removed_until(run, workload) for run in workload.runs}
    lossy = {run_id for loss in workload.losses for run_id in loss.before}
    histories = {
        run.run_id: history(run, workload.losses, logs[run.run_id])
        for run in workload.runs
        if run.run_id in lossy
    }
    for run in workload.runs:
        hist = histories.get(run.run_id)
        lost = hist.lost() if hist is not None else set()
        verify_run(run, logs[run.run_id], until[run.run_id], lost, violations)
    losses = {run_id: hist.lost() for run_id, hist in histories.items()}
    turns, sessions = verify_turns(records, texts, metas, logs, until, losses, workload, violations)
    feeds, feed_turns = verify_session_follows(workload, until, lossy, violations)
    workload.stats["session_follows"] = feeds
    workload.stats["session_follow_turns"] = feed_turns

    verified = gaps = unexplained = 0
    for f in workload.follows:
        run = runs[f.run_id]
        exposed = until[f.run_id] is not None
        where = f"follow {f.who} of {f.run_id}"
        if f.outcome == "http 404" and workload.eviction_touched(run):
            workload.stats["follows_of_evicted_runs"] += 1
        elif f.outcome.startswith("http") or f.outcome in ("open", "unfinished", "gap loop"):
            violations.add(f"{where}: {f.outcome} after {len(f.ids)} events")
            continue
        hist = histories.get(f.run_id)
        if hist is None:
            count = verify_follow(f, run, exposed, violations)
        else:
            count = verify_follow_history(f, run, hist, exposed, violations)
        if count < 0:
            continue
        for segment in f.segments:
            if segment.terminal == "gap":
                if not (segment.terminal_data or {}).get("reason"):
                    violations.add(f"{where}: a gap without a reason {segment.terminal_data}")
                gaps += 1
                if not exposed and hist is None:
                    unexplained += 1
                    print(f"gap on a run never removed: {where}: {segment.terminal_data}")
        verified += count
    return verified, gaps, unexplained, turns, sessions


def snapshot(server: RedisServer, run_id: str = "*") -> dict[str, list[Entry]]:
    """Every run log on `server` (or one run's): run id -> its entries."""
    with server.client() as c:
        names = sorted(c.scan_iter(match=f"{KEY_PREFIX}{{{run_id}}}:log", count=1000))
        pipe = c.pipeline(transaction=False)
        for name in names:
            pipe.xrange(name)
        logs = pipe.execute()
    prefix, suffix = len(KEY_PREFIX) + 1, len("}:log")
    return {
        name.decode()[prefix:-suffix]: [(i.decode(), f.get(b"d"), b"end" in f) for i, f in log]
        for name, log in zip(names, logs, strict=True)
    }


# ------------------------------------------------------------------------ main thread


class Chaos:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.dir = Path(tempfile.mkdtemp(prefix=f"chaos-{args.seed}-"))
        self.redis = RedisServer(*AOF_ALWAYS, directory=self.dir / "redis")
        self.gateways = [
            GatewayProcess(
                None,  # the Redis URL is known once Redis has its port (start())
                api_key=API_KEY,
                heartbeat=HEARTBEAT,
                key_prefix=KEY_PREFIX,
                port=free_port(),
                directory=self.dir / f"gw{n}",
            )
            for n in range(1, 4)
        ]
        self.proxy: Proxy | None = None
        self.bag: list[str] = []
        self.violations = Violations()
        self.t0 = time.monotonic()
        self.keys_evicted = self.logs_removed = self.pubsub_killed = 0
        # gw1 reaches Redis through a relay that loses a script's reply on demand (Redis
        # ran it, the gateway never learns): `reply_drop`
        self.relay: FaultRelay | None = None
        self.relay_ready = threading.Event()
        # The gateways reach Redis through a forwarder that a failover points at the
        # promoted replica (as a managed endpoint or a DNS name that follows the primary).
        self.forwarder: TcpForwarder | None = None
        self.replica: RedisServer | None = None
        self.replicas_started = 0
        self.lost_events = self.lost_ends = self.lost_claims = 0
        self.turns_checked: set[str] = set()  # records checked on a server about to lose them

    def log(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {text}", flush=True)

    def _serve_relay(self) -> None:
        async def main() -> None:
            assert self.relay is not None
            async with anyio.create_task_group() as tg:
                await tg.start(self.relay.serve)
                self.relay_ready.set()
                await anyio.sleep_forever()

        with contextlib.suppress(Exception):
            anyio.run(main)

    def new_replica(self) -> RedisServer:
        """A replica of the current master (AOF as the master), once in sync."""
        self.replicas_started += 1
        replica = RedisServer(
            "--replicaof",
            HOST,
            str(self.redis.port),
            *AOF_ALWAYS,
            directory=self.dir / f"redis-replica{self.replicas_started}",
        ).start()
        wait_in_sync(self.redis, replica)
        return replica

    def start(self) -> None:
        self.redis.start()
        self.replica = self.new_replica()
        self.forwarder = TcpForwarder(self.redis.address).start()
        self.relay = FaultRelay(("127.0.0.1", self.forwarder.port), marker=b"EVALSHA")
        threading.Thread(target=self._serve_relay, name="relay", daemon=True).start()
        if not self.relay_ready.wait(10):
            raise RuntimeError("the reply-dropping relay did not start")
        for n, gw in enumerate(self.gateways):
            gw.redis_url = f"redis://127.0.0.1:{self.relay.port}" if n == 0 else self.forwarder.url
            gw.start()
        self.proxy = Proxy("haproxy", [g.url for g in self.gateways], directory=self.dir / "lb")
        self.proxy.start()
        deadline = time.monotonic() + 20
        while True:  # haproxy marks the backends up after its first health checks
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(self.proxy.url + "/readyz", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("haproxy never reported a ready gateway")
            time.sleep(0.1)

    def close(self) -> None:
        for item in [self.proxy, *self.gateways]:
            if item is not None:
                with contextlib.suppress(Exception):
                    item.kill()
        for server in (self.redis, self.replica):
            if server is not None:
                with contextlib.suppress(Exception):
                    server.kill()
        if self.forwarder is not None:
            self.forwarder.close()

    def restart_gateway(self, gw: GatewayProcess) -> None:
        for attempt in range(10):
            try:
                gw.start()
                return
            except Exception:  # e.g. the fixed port not yet free
                if attempt == 9:
                    raise
                time.sleep(0.3)

    def inject(self, workload: Workload) -> None:
        if not self.bag:  # every kind once per round, in a seeded random order
            self.bag = list(self.args.faults)
            self.rng.shuffle(self.bag)
        kind = self.bag.pop()
        if kind in ("gateway_kill", "gateway_sigterm"):
            n = self.rng.randrange(len(self.gateways))
            gw = self.gateways[n]
            pause = self.rng.uniform(0.5, 2.0)
            if kind == "gateway_kill":
                gw.kill()
                self.log(f"gateway_kill gw{n + 1} (kill -9), restart in {pause:.1f}s")
            else:
                code = gw.terminate()
                self.log(f"gateway_sigterm gw{n + 1}: exited {code}, restart in {pause:.1f}s")
                if code != 0:
                    self.violations.add(f"gw{n + 1}: SIGTERM exit code {code}\n{gw.log()}")
            time.sleep(pause)
            self.restart_gateway(gw)
            workload.faults[kind] += 1
        elif kind == "redis_outage":
            down = self.rng.uniform(2.0, 4.0)
            self.redis.kill()
            self.log(f"redis_outage: redis killed, down for {down:.1f}s")
            time.sleep(down)
            self.redis.restart()
            self.log("redis_outage: redis restarted (AOF replayed)")
            workload.faults[kind] += 1
        elif kind == "eviction":
            self.evict(workload)
        elif kind == "failover":
            self.failover(workload)
        elif kind == "restart_empty":
            self.restart_empty(workload)
        elif kind == "claimed_again":
            self.claim_again(workload)
        elif kind == "reply_drop":
            assert self.relay is not None
            self.relay.armed = True  # gw1's next script: applied, its reply lost
            self.log(f"reply_drop: gw1's next script reply is lost ({self.relay.cut} so far)")
            workload.faults[kind] += 1
        elif kind == "pubsub_kill":
            with self.redis.client() as c:
                killed = c.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
            self.log(f"pubsub_kill: {killed} pub/sub connections killed")
            self.pubsub_killed += int(killed)
            workload.faults[kind] += 1
        else:
            busy = [i for i, r in list(workload.current.items()) if r.ids]
            if not busy:
                return
            index = self.rng.choice(busy)
            run = workload.current.get(index)
            if run is None:
                return
            if kind == "producer_dies":
                workload.die_requests.add(index)
            elif kind == "zombie_producer":
                workload.zombie_requests.add(index)
            elif kind == "run_delete":
                self.delete_run(workload, run)
                return
            else:
                self.retire_session(workload, index, run)
                return
            self.log(f"{kind}: producer p{index} ({run.run_id})")

    def operator(self, method: str, path: str, done: frozenset[int]) -> httpx.Response:
        """An operator request through haproxy, re-sent after a 5xx or a cut (both
        removals are idempotent) until it answers one of `done`."""
        assert self.proxy is not None
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.TransportError):
                response = httpx.request(method, self.proxy.url + path, headers=AUTH, timeout=10)
                if response.status_code in done:
                    return response
                if response.status_code not in MAYBE_APPLIED:
                    raise RuntimeError(f"{method} {path}: {response.status_code} {response.text}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{method} {path}: no answer in 30 s")
            time.sleep(0.1)

    def delete_run(self, workload: Workload, run: Run) -> None:
        window = [time.monotonic(), float("inf")]
        run.deletes.append(window)
        response = self.operator("DELETE", f"/v1/runs/{run.run_id}", frozenset({204, 404}))
        window[1] = time.monotonic()
        self.log(f"run_delete: {run.run_id} after {len(run.ids)} events: {response.status_code}")
        workload.faults["run_delete"] += 1

    def retire_session(self, workload: Workload, index: int, run: Run) -> None:
        workload.sessions[index] += 1  # the producer's next run opens a new session
        window = [time.monotonic(), float("inf")]
        workload.retired.append((run.session_id, window))
        path = f"/v1/sessions/{run.session_id}?retire=true"
        response = self.operator("DELETE", path, frozenset({200}))
        window[1] = time.monotonic()
        removed = response.json()["removed_runs"]
        self.logs_removed += len(removed)
        self.log(
            f"session_retire: {run.session_id} with {run.run_id} in flight after "
            f"{len(run.ids)} events: {len(removed)} logs removed"
        )
        workload.faults["session_retire"] += 1

    def failover(self, workload: Workload) -> None:
        """The replica stops replicating (in sync until then), the master acknowledges
        0.2-1 s of writes the replica never gets, then the master dies and the replica is
        promoted and the forwarder moved to it: those writes are lost. Both logs are
        read with the master's writes paused (`CLIENT PAUSE WRITE`: the scripts in flight
        then die with it, unapplied) so the loss is known exactly."""
        assert self.replica is not None and self.forwarder is not None
        old, new = self.redis, self.replica
        wait_in_sync(old, new)
        window = [time.monotonic(), float("inf")]
        workload.failovers.append(window)
        detach(new)
        time.sleep(self.rng.uniform(0.2, 1.0))
        with old.client() as c:
            c.execute_command("CLIENT", "PAUSE", 30_000, "WRITE")
        before, after = snapshot(old), snapshot(new)
        self.check_turns(old, workload)
        old.kill()
        promote(new)
        new.extra_args = AOF_ALWAYS  # restarted by a later outage, it stays a primary
        self.forwarder.repoint(new.address)
        window[1] = time.monotonic()
        self.redis = new
        self.replica = self.new_replica()
        lost: dict[str, list[Entry]] = {}
        kept: dict[str, set[str]] = {}
        for run_id, entries in before.items():
            survived = {i for i, _, _ in after.get(run_id, [])}
            if any(i not in survived for i, _, _ in entries):
                lost[run_id], kept[run_id] = entries, survived
        if lost:
            workload.losses.append(Loss("failover", window[0], lost, kept))
        gone = {i for run_id, entries in lost.items() for i, _, _ in entries} - {
            i for ids in kept.values() for i in ids
        }
        events = ends = claims = 0
        for run in workload.runs:
            if run.run_id not in lost:
                continue
            events += sum(1 for i in run.ids if i in gone)
            claims += not kept[run.run_id]
            if run.end_id in gone:  # the producer was told it ended: a gateway ends it
                ends += 1
                run.end_id = run.end_sent_at = None
                run.ended = False
                run.expected_end = "producer_lost"
                run.abandoned_at = time.monotonic()
        self.lost_events += events
        self.lost_ends += ends
        self.lost_claims += claims
        self.log(
            f"failover: replica :{new.port} promoted; lost {events} acknowledged events, "
            f"{ends} ENDs, {claims} whole runs, of {len(lost)} runs"
        )
        workload.faults["failover"] += 1

    def restart_empty(self, workload: Workload) -> None:
        """Redis killed and started again without its AOF: it comes back empty (as a
        server without persistence does), and its replica follows it empty."""
        window = [time.monotonic(), float("inf")]
        workload.evictions.append(window)  # every key gone: what an eviction of all does
        down = self.rng.uniform(0.5, 2.0)
        with self.redis.client() as c:
            c.execute_command("CLIENT", "PAUSE", 30_000, "WRITE")
        self.check_turns(self.redis, workload)
        self.redis.kill()
        shutil.rmtree(self.redis.dir / "appendonlydir", ignore_errors=True)
        (self.redis.dir / "dump.rdb").unlink(missing_ok=True)
        time.sleep(down)
        self.redis.restart()
        window[1] = time.monotonic()
        self.log(f"restart_empty: redis killed, back empty after {down:.1f}s")
        workload.faults["restart_empty"] += 1

    def check_turns(self, server: RedisServer, workload: Workload) -> None:
        """With `server`'s writes paused, before a failover or an empty restart takes
        what it holds: every turn record there equals its log there (text; state, once
        the log has its END), for the runs no removal, eviction or loss touched."""
        retired = {session for session, _ in workload.retired}
        lossy = {run_id for loss in workload.losses for run_id in loss.before}
        runs = [
            r
            for r in list(workload.runs)
            if not r.evicted
            and not workload.eviction_touched(r)
            and r.session_id not in retired
            and r.run_id not in lossy
            and removed_until(r, workload) is None
        ]
        with server.client() as c:
            pipe = c.pipeline(transaction=False)
            for run in runs:
                pipe.xrange(f"{KEY_PREFIX}{{{run.run_id}}}:log")
                pipe.hgetall(f"{KEY_PREFIX}{{{run.run_id}}}:turn")
                pipe.get(f"{KEY_PREFIX}{{{run.run_id}}}:text")
                pipe.hgetall(f"{KEY_PREFIX}{{{run.run_id}}}:meta")
            replies = pipe.execute()
        for n, run in enumerate(runs):
            log, record, text, meta = replies[4 * n : 4 * n + 4]
            if not record:
                self.violations.add(f"turn {run.run_id}: no turn record on the server")
                continue
            log = [(i.decode(), f) for i, f in log]
            expected = folded_text(log, meta)
            ends = [f[b"end"].decode() for _, f in log if b"end" in f]
            state = record.get(b"state", b"").decode()
            if (text or b"").decode() != expected:
                self.violations.add(
                    f"turn {run.run_id}: record text differs from its log's on the server "
                    f"({len(text or b'')} vs {len(expected)} chars)"
                )
            elif ends and state != ends[0]:
                self.violations.add(f"turn {run.run_id}: state {state!r}, log ended {ends[0]!r}")
            else:
                self.turns_checked.add(run.run_id)

    def claim_again(self, workload: Workload) -> None:
        """An ended run's keys removed (as its TTL would), then the run id claimed again
        by the workload's claimer; its old incarnation is a loss."""
        now = time.monotonic()
        candidates = [
            r
            for r in workload.runs
            if r.ended
            and r.end_id is not None
            and r.ids
            and not r.evicted
            and not workload.eviction_touched(r)
            and removed_until(r, workload) is None
            and now - r.claimed_at > 2
        ]
        if not candidates:
            return
        run = self.rng.choice(candidates)
        with self.redis.client() as c:
            entries = snapshot(self.redis, run.run_id).get(run.run_id, [])
            names = list(c.scan_iter(match=f"{KEY_PREFIX}{{{run.run_id}}}*", count=1000))
            c.delete(*names)
        workload.losses.append(
            Loss("claimed_again", now, {run.run_id: entries}, {run.run_id: set()})
        )
        assert run.end_id is not None
        run.old_ends.append(run.end_id)
        run.old_sessions.append(run.session_id)
        run.session_id = f"{run.session_id}-again{len(run.old_sessions)}"
        run.end_id = run.end_sent_at = None
        run.ended = False
        run.expected_end = "success"
        run.claim_started = run.claimed_at = time.monotonic()
        workload.again_requests.append(run)
        self.log(
            f"claimed_again: {run.run_id} ({len(run.ids)} events, {len(names)} keys removed) "
            "claimed again"
        )
        workload.faults["claimed_again"] += 1

    def evict(self, workload: Workload) -> None:
        """maxmemory below what is in use, volatile-lru, for 2-4 s. The target cuts
        20-120 % of the dataset: sometimes only old logs go, sometimes every key with a
        TTL (live runs included) and writes meet OOM until the window closes."""
        hold = self.rng.uniform(2.0, 4.0)
        share = self.rng.uniform(0.2, 1.2)
        window = [time.monotonic(), float("inf")]
        workload.evictions.append(window)
        with self.redis.client() as c:
            memory = c.info("memory")
            before = int(c.info("stats")["evicted_keys"])
            used, dataset = int(memory["used_memory"]), int(memory["used_memory_dataset"])
            target = max(1024 * 1024, int(used - share * dataset))
            c.config_set("maxmemory-policy", "volatile-lru")
            c.config_set("maxmemory", target)
            time.sleep(hold)
            c.config_set("maxmemory", 0)
            c.config_set("maxmemory-policy", "noeviction")
            window[1] = time.monotonic()
            evicted = int(c.info("stats")["evicted_keys"]) - before
        self.keys_evicted += evicted
        self.log(
            f"eviction: maxmemory {target} (used {used}, dataset {dataset}) volatile-lru "
            f"for {hold:.1f}s: {evicted} keys evicted"
        )
        workload.faults["eviction"] += 1

    def run(self) -> int:
        args = self.args
        print(
            f"chaos: seed {args.seed}, {args.duration:g}s, {args.producers} producers, "
            f"{args.subscribers} subscribers, 3 gateways behind haproxy, Redis AOF always; "
            f"logs in {self.dir}",
            flush=True,
        )
        try:
            self.start()
        except BaseException:
            self.close()  # whatever did start; the logs stay in self.dir
            raise
        assert self.proxy is not None
        self.log("Redis, 3 gateways and haproxy up; faults start")
        workload = Workload(self.proxy.url, [g.url for g in self.gateways], args, self.violations)
        thread = threading.Thread(target=workload.thread_main, name="workload", daemon=True)
        try:
            thread.start()
            workload.started.wait(30)
            self.t0 = started = workload.t0 = time.monotonic()
            deadline = started + args.duration
            while time.monotonic() < deadline and not workload.settled.is_set():
                gap = self.rng.uniform(args.min_gap, args.max_gap)
                time.sleep(max(0.0, min(gap, deadline - time.monotonic())))
                if time.monotonic() >= deadline:
                    break
                self.inject(workload)
            elapsed = time.monotonic() - started
            self.log("injection stopped; settling")
            for gw in self.gateways:  # everything up for the settle phase
                if not gw.running:
                    self.restart_gateway(gw)
            if not self.redis.running:
                self.redis.restart()
            workload.stop_producing = True
            if not workload.settled.wait(args.settle_timeout):
                self.violations.add(f"the workload did not settle in {args.settle_timeout}s")
                workload.abort = True
                workload.settled.wait(10)
            if workload.error is not None:
                raise workload.error
            self.log("settled; verifying against the Redis logs")
            verified, gaps, unexplained, turns, sessions = verify(
                self.redis, workload, self.violations
            )
        except BaseException:
            workload.abort = True
            workload.die_requests.clear()
            thread.join(5)
            self.close()
            raise
        self.close()
        thread.join(5)

        stats, faults = workload.stats, workload.faults
        ended = {r.expected_end for r in workload.runs}
        ends = Counter(r.expected_end for r in workload.runs)
        print()
        print(f"duration:            {elapsed:.1f}s of faults (seed {args.seed})")
        by_end = ", ".join(f"{k} {ends[k]}" for k in sorted(ended))
        print(f"runs:                {len(workload.runs)} ({by_end})")
        print(
            f"events published:    {stats['events_published']} (acknowledged; "
            f"{stats['applied_despite_5xx']} found applied after a 5xx/cut reply, "
            f"{stats['publish_retries']} publish retries)"
        )
        print(
            f"events verified:     {verified} (subscriber-received events checked against "
            f"the log, over {len(workload.follows)} subscriptions)"
        )
        print(
            f"turn records:        {turns} equal to their logs (text, END state), "
            f"{sessions} sessions' turns in claim order; {len(self.turns_checked)} equal "
            "on a server just before a failover or an empty restart took them"
        )
        print(
            f"session feeds:       {stats['session_follows']} follows of whole sessions, "
            f"{stats['session_follow_turns']} turns followed (the claims in order, each "
            "exact or ending in a gap)"
        )
        print("faults injected:     " + ", ".join(f"{k} {faults[k]}" for k in COUNTED_KINDS))
        print(
            f"removals:            {sum(len(r.deletes) for r in workload.runs)} runs deleted, "
            f"{len(workload.retired)} sessions retired ({self.logs_removed} logs removed), "
            f"{self.keys_evicted} keys evicted, {stats['runs_lost_to_eviction']} runs "
            f"abandoned after an eviction took their record, "
            f"{stats['follows_of_evicted_runs']} follows of evicted runs ended 404"
        )
        print(f"pub/sub kills:       {self.pubsub_killed} notifier connections killed")
        again = sum(1 for loss in workload.losses if loss.kind == "claimed_again")
        print(
            f"losses:              {self.lost_events} acknowledged events, {self.lost_ends} "
            f"ENDs and {self.lost_claims} whole runs lost in failovers; {again} runs' "
            f"incarnations lost and claimed again ({stats['again_follows']} readers resumed "
            "them with old cursors)"
        )
        cut = self.relay.cut if self.relay is not None else 0
        print(f"lost replies:        {cut} script replies lost after Redis ran the script (gw1)")
        print(
            f"open responses:      {workload.samples} samples of {OPEN_GAUGE} "
            f"(max {workload.sample_max} open), each within the client connections of the "
            f"{OUTLIVE:g} s before ({workload.samples_above_simultaneous} above the most open "
            f"at one moment); 0 within {OUTLIVE:g} s of the last disconnect"
        )
        print(
            f"zombie writes:       {stats['zombie_writes_fenced']} fenced, "
            f"{sum(r.zombie_unsure for r in workload.runs)} unanswered (5xx/cut)"
        )
        print(
            f"subscriber side:     {stats['sse_drops']} dropped connections, "
            f"{stats['sse_clean_ends_without_end']} drained ends, "
            f"{stats['sse_unavailable_frames']} unavailable frames, {stats['sse_5xx']} 5xx"
        )
        print(f"gaps:                {gaps} ({unexplained} on runs never removed)")
        print(f"violations:          {len(self.violations.items)}")
        for text in self.violations.items[:50]:
            print(f"  - {text}")
        if self.violations.items:
            print(f"logs kept in {self.dir}")
            return 1
        shutil.rmtree(self.dir, ignore_errors=True)
        return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of faults")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--subscribers", type=int, default=8)
    parser.add_argument(
        "--session-followers",
        type=int,
        default=2,
        help="followers of whole sessions on the session feed",
    )
    parser.add_argument(
        "--hold",
        type=float,
        default=3.0,
        help="mean seconds a subscriber holds a connection before dropping it",
    )
    parser.add_argument("--min-gap", type=float, default=1.0, help="min seconds between faults")
    parser.add_argument("--max-gap", type=float, default=3.0, help="max seconds between faults")
    parser.add_argument("--settle-timeout", type=float, default=180.0)
    parser.add_argument(
        "--faults",
        type=lambda text: text.split(","),
        default=list(FAULT_KINDS),
        help=f"comma-separated fault kinds to inject (default: all of {','.join(FAULT_KINDS)})",
    )
    args = parser.parse_args()
    if unknown := set(args.faults) - set(FAULT_KINDS):
        parser.error(f"unknown fault kinds: {', '.join(sorted(unknown))}")
    if args.seed is None:
        args.seed = random.randrange(1_000_000)

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    chaos = Chaos(args)
    try:
        code = chaos.run()
    except KeyboardInterrupt:
        print("\ninterrupted: processes stopped", flush=True)
        chaos.close()
        shutil.rmtree(chaos.dir, ignore_errors=True)
        sys.exit(130)
    sys.exit(code)


if __name__ == "__main__":
    main()
