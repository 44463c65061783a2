"""Chaos run: producers, subscribers, 3 gateways behind haproxy and one Redis (AOF,
appendfsync always) for a given duration, with faults injected at random (seeded); then
every subscriber's sequence is checked against the authoritative log.

Processes (all real, all started here): one `redis-server --appendonly yes --appendfsync
always`, three `gateway serve` processes on fixed ports (so a restarted one is the same
haproxy backend), haproxy from deploy/haproxy.cfg (tests/proxies.py). Everything goes
through haproxy.

Workload (an asyncio thread):
- N producers, each streaming runs of 20-120 `{"seq", "by"}` events (a few ms apart) and
  ending each run (`success`), then starting the next. A publish answered 502/503/504 or
  cut mid-request may or may not have been applied: the producer reads the run's
  `last_event_id` back before re-sending (docs/api.md), so every event is appended once.
- M subscribers, each following a run (mostly live ones) from the start through haproxy,
  dropping the connection at random (exponential hold times) and reconnecting with
  `Last-Event-ID`; sometimes leaving a run for good (its prefix is still checked).

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
- `subscriber_disconnect`: counted as the subscribers drop their connections.

After the duration: stop injecting, make sure every process is up, let producers finish
their runs, make every abandoned run end (`/wait` triggers the gateway's liveness check),
let subscribers reach their END, then read every run once more from the start. Checks:
- per run (raw `XRANGE` of the log in Redis): the event ids equal the ids the producer
  was acknowledged (no loss, no duplicate from re-sends), seqs are 0..n-1, no zombie
  entry, exactly one END and it is the last entry, with the expected status;
- per subscription: the ids are the log's prefix with identical payload bytes (no loss,
  no duplicate, no reorder), ending with the log's END, or an explicit `gap` (counted
  separately), or a prefix when the subscriber left on purpose; never a hang or a 404.

Prints duration, events published, events verified, faults by kind, gaps, violations;
exits 1 on any violation (logs are kept then). Ctrl-C stops everything.

Run: .venv/bin/python bench/chaos.py --duration 60 [--seed N] [--producers 4]
     [--subscribers 8]
"""

from __future__ import annotations

import argparse
import contextlib
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common  # noqa: F401  (puts the repo root on sys.path)
import anyio
import httpx
import orjson

from tests.proxies import GatewayProcess, Proxy, free_port
from tests.redis_servers import RedisServer
from tests.sse_client import iter_frames

MAYBE_APPLIED = frozenset({502, 503, 504})  # gateway 503, or haproxy when a backend died
KEY_PREFIX = "chaos:"
HEARTBEAT = 0.5
LEASE = 20.0  # >> any outage injected here: a live producer never loses its lease
DYING_LEASE = 1.0
AOF_ALWAYS = ("--appendonly", "yes", "--appendfsync", "always")
FAULT_KINDS = (
    "gateway_kill",
    "gateway_sigterm",
    "redis_outage",
    "producer_dies",
    "zombie_producer",
)


class Aborted(Exception):
    pass


@dataclass
class Run:
    run_id: str
    producer: int
    ids: list[str] = field(default_factory=list)  # acknowledged (or read back) ids
    expected_end: str = "success"
    ended: bool = False  # the producer's END was acknowledged / the run is known ended
    abandoned_at: float | None = None
    zombie_writes: int = 0  # zombie requests answered 409 fenced
    zombie_unsure: int = 0  # zombie requests answered 502/503/504 or cut


@dataclass
class Follow:
    run_id: str
    who: str
    ids: list[str] = field(default_factory=list)
    data: list[bytes] = field(default_factory=list)
    terminal: str | None = None  # "end" | "gap"
    terminal_data: dict[str, Any] | None = None
    outcome: str = "open"  # "terminal" | "left" | "unfinished" | "http <code>"
    connections: int = 0


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

    def __init__(self, base_url: str, args: argparse.Namespace, violations: Violations) -> None:
        self.base_url = base_url
        self.args = args
        self.seed = args.seed
        self.violations = violations
        self.runs: list[Run] = []
        self.follows: list[Follow] = []
        self.stats: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        # Flags set from the main thread (plain attributes: the workload polls them).
        self.stop_producing = False
        self.abort = False
        self.die_requests: set[int] = set()
        self.zombie_requests: set[int] = set()
        self.current: dict[int, Run] = {}  # producer index -> the run it is streaming
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
        return httpx.AsyncClient(base_url=self.base_url, timeout=timeout, limits=limits)

    def thread_main(self) -> None:
        try:
            anyio.run(self.main)
        except BaseException as exc:  # reported by the main thread
            if not self.abort:
                self.error = exc
        finally:
            self.settled.set()

    async def main(self) -> None:
        async with anyio.create_task_group() as subscribers:
            for i in range(self.args.subscribers):
                subscribers.start_soon(self.subscriber, i)
            async with anyio.create_task_group() as producers:
                for i in range(self.args.producers):
                    producers.start_soon(self.producer, i)
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

    stop_following = False
    follow_abort = False
    subscribers_running = 0

    # ------------------------------------------------------------------ producers
    async def producer(self, index: int) -> None:
        rng = random.Random(self.seed * 1000 + index)
        async with self._client() as client:
            number = 0
            while not self.stop_producing:
                run = Run(f"chaos-{self.seed}-p{index}-{number}", index)
                number += 1
                token = await self._claim(client, run.run_id)
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
                    token = await self._claim(client, run.run_id, takeover=True)
                    self.faults["zombie_producer"] += 1
                    zombies.start_soon(self._zombie, run, old, rng.randint(3, 10))
                if not await self._publish(client, run, seq, token):
                    return  # lost its lease: reported as a violation
                seq += 1
                await self._sleep(rng.uniform(0.005, 0.03))
            await self._end(client, run, token)

    async def _claim(self, client: httpx.AsyncClient, run_id: str, takeover: bool = False) -> str:
        """Claim (or take over) `run_id`. A claim answered 5xx may have been applied: the
        retry takes the lease over (our own lease, or the one it just created)."""
        backoff = 0.05
        while True:
            body = {"run_id": run_id, "lease_seconds": LEASE, "takeover": takeover}
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

    async def _last_event_id(self, client: httpx.AsyncClient, run_id: str) -> str | None:
        while True:
            with contextlib.suppress(httpx.TransportError):
                response = await client.get(f"/v1/runs/{run_id}")
                if response.status_code == 200:
                    last: str | None = response.json()["last_event_id"]
                    return last
                if response.status_code not in MAYBE_APPLIED:
                    raise RuntimeError(f"read {run_id}: {response.status_code} {response.text}")
            await self._sleep(0.1)

    async def _publish(self, client: httpx.AsyncClient, run: Run, seq: int, token: str) -> bool:
        """Append `{"seq": seq}` exactly once (idempotent accounting across 5xx)."""
        body = {"event": "token", "data": {"seq": seq, "by": f"p{run.producer}"}}
        headers = {"X-Producer-Token": token}
        backoff = 0.05
        while True:
            response: httpx.Response | None = None
            with contextlib.suppress(httpx.TransportError):
                response = await client.post(
                    f"/v1/runs/{run.run_id}/events", json=body, headers=headers
                )
            if response is not None and response.status_code == 200:
                run.ids.append(response.json()["ids"][0])
                self.stats["events_published"] += 1
                return True
            if response is not None and response.status_code not in MAYBE_APPLIED:
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
            last = await self._last_event_id(client, run.run_id)
            known = run.ids[-1] if run.ids else None
            if last is not None and last != known:
                run.ids.append(last)  # the failed request had been applied
                self.stats["events_published"] += 1
                self.stats["applied_despite_5xx"] += 1
                return True

    async def _end(self, client: httpx.AsyncClient, run: Run, token: str) -> None:
        while True:  # END is idempotent: re-sending it is safe
            with contextlib.suppress(httpx.TransportError):
                response = await client.post(
                    f"/v1/runs/{run.run_id}/end",
                    json={"status": "success"},
                    headers={"X-Producer-Token": token},
                )
                if response.status_code == 200:
                    run.ended = True
                    return
                if response.status_code not in MAYBE_APPLIED:
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
                else:
                    self.violations.add(
                        f"run {run.run_id}: zombie write {path} not fenced: "
                        f"{response.status_code} {response.text}"
                    )
                await self._sleep(0.02)

    async def end_abandoned_runs(self) -> None:
        """Every run a producer abandoned must get its producer_lost END: `/wait` makes a
        gateway watch it (liveness check once per heartbeat)."""
        pending = [r for r in self.runs if not r.ended]

        async def wait_end(run: Run) -> None:
            deadline = time.monotonic() + LEASE + 30
            async with self._client(keepalive=False) as client:
                while time.monotonic() < deadline:
                    with contextlib.suppress(httpx.TransportError):
                        response = await client.get(
                            f"/v1/runs/{run.run_id}/wait", params={"timeout": 5}
                        )
                        if response.status_code == 200:
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
            if not r.ended and (r.abandoned_at is None or now - r.abandoned_at < 5)
        ]
        if live and rng.random() < 0.8:
            return rng.choice(live)
        return rng.choice(self.runs)

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

    async def follow(
        self,
        client: httpx.AsyncClient,
        rng: random.Random,
        follow: Follow,
        leave_after: float | None,
        hold_mean: float | None = None,
    ) -> None:
        """Follow to END/gap, reconnecting with Last-Event-ID after a drop, a clean end
        without END (drain), an `unavailable` frame, a 5xx, or a voluntary disconnect."""
        hold_mean = self.args.hold if hold_mean is None else hold_mean
        started = time.monotonic()
        path = f"/v1/runs/{follow.run_id}/stream"
        while True:
            if self.abort or self.follow_abort:
                follow.outcome = "unfinished"
                return
            if leave_after is not None and time.monotonic() - started > leave_after:
                follow.outcome = "left"
                return
            headers = {"Last-Event-ID": follow.ids[-1]} if follow.ids else {}
            retry_ms = 1000
            hold = rng.expovariate(1 / hold_mean) if hold_mean else float("inf")
            with anyio.move_on_after(hold) as scope:
                try:
                    async with client.stream("GET", path, headers=headers) as response:
                        if response.status_code >= 500:
                            self.stats["sse_5xx"] += 1
                            await response.aread()
                        elif response.status_code != 200:
                            follow.outcome = f"http {response.status_code}"
                            return
                        else:
                            follow.connections += 1
                            async for frame in iter_frames(response):
                                if self.abort or self.follow_abort:
                                    follow.outcome = "unfinished"
                                    return
                                if frame.retry is not None:
                                    retry_ms = frame.retry
                                if frame.data_id is not None:
                                    follow.ids.append(frame.data_id)
                                    follow.data.append(frame.data)
                                elif frame.event in ("end", "gap"):
                                    follow.terminal = frame.event
                                    follow.terminal_data = frame.json()
                                    follow.outcome = "terminal"
                                    return
                                elif frame.event == "unavailable":
                                    self.stats["sse_unavailable_frames"] += 1
                            self.stats["sse_clean_ends_without_end"] += 1  # drain
                except httpx.TransportError:
                    self.stats["sse_drops"] += 1
            if scope.cancelled_caught:
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


# ------------------------------------------------------------------------ verification


def verify(redis: RedisServer, workload: Workload, violations: Violations) -> tuple[int, int]:
    """Returns (events verified, gaps)."""
    logs: dict[str, list[tuple[str, dict[bytes, bytes]]]] = {}
    with redis.client() as c:
        for run in workload.runs:
            key = f"{KEY_PREFIX}{{{run.run_id}}}:log"
            logs[run.run_id] = [(i.decode(), f) for i, f in c.xrange(key)]

    events_of: dict[str, list[tuple[str, bytes]]] = {}
    end_of: dict[str, str | None] = {}
    for run in workload.runs:
        log = logs[run.run_id]
        events = [(i, f[b"d"]) for i, f in log if b"e" in f]
        ends = [(n, f[b"end"].decode()) for n, (_, f) in enumerate(log) if b"end" in f]
        events_of[run.run_id] = events
        end_of[run.run_id] = ends[-1][1] if ends else None
        rid = run.run_id
        if len(ends) != 1:
            violations.add(f"run {rid}: {len(ends)} END entries in the log")
        elif ends[0][0] != len(log) - 1:
            violations.add(f"run {rid}: END is not the last log entry")
        elif ends[0][1] != run.expected_end:
            violations.add(f"run {rid}: END {ends[0][1]!r}, expected {run.expected_end!r}")
        payloads = [orjson.loads(d) for _, d in events]
        if any(p.get("by") == "zombie" for p in payloads):
            violations.add(f"run {rid}: a zombie write is in the log")
        if [i for i, _ in events] != run.ids:
            violations.add(
                f"run {rid}: log ids differ from the acknowledged ids "
                f"(log {len(events)}, acknowledged {len(run.ids)})"
            )
        if [p.get("seq") for p in payloads] != list(range(len(payloads))):
            violations.add(f"run {rid}: log seqs are not 0..n-1 (loss or duplicate)")

    verified = gaps = 0
    for f in workload.follows:
        events = events_of[f.run_id]
        where = f"follow {f.who} of {f.run_id}"
        if f.outcome.startswith("http") or f.outcome in ("open", "unfinished"):
            violations.add(f"{where}: {f.outcome} after {len(f.ids)} events")
            continue
        if len(set(f.ids)) != len(f.ids):
            violations.add(f"{where}: duplicate ids")
            continue
        if f.ids != [i for i, _ in events[: len(f.ids)]]:
            violations.add(f"{where}: ids are not the log's prefix (loss, duplicate, reorder)")
            continue
        if f.data != [d for _, d in events[: len(f.ids)]]:
            violations.add(f"{where}: payload bytes differ from the log")
            continue
        if f.terminal == "gap":
            gaps += 1
            print(f"gap: {where} after {len(f.ids)} events: {f.terminal_data}", flush=True)
        elif f.terminal == "end":
            status = (f.terminal_data or {}).get("status")
            if len(f.ids) != len(events):
                violations.add(f"{where}: END after {len(f.ids)} of {len(events)} events")
                continue
            if status != end_of[f.run_id]:
                violations.add(f"{where}: END {status!r}, log says {end_of[f.run_id]!r}")
                continue
        verified += len(f.ids)
    return verified, gaps


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

    def log(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {text}", flush=True)

    def start(self) -> None:
        self.redis.start()
        for gw in self.gateways:
            gw.redis_url = self.redis.url
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
        with contextlib.suppress(Exception):
            self.redis.kill()

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
            self.bag = list(FAULT_KINDS)
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
        else:
            busy = [i for i, r in list(workload.current.items()) if r.ids]
            if not busy:
                return
            index = self.rng.choice(busy)
            run = workload.current.get(index)
            if kind == "producer_dies":
                workload.die_requests.add(index)
            else:
                workload.zombie_requests.add(index)
            self.log(f"{kind}: producer p{index} ({run.run_id if run else '?'})")

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
        workload = Workload(self.proxy.url, args, self.violations)
        thread = threading.Thread(target=workload.thread_main, name="workload", daemon=True)
        try:
            thread.start()
            workload.started.wait(30)
            self.t0 = started = time.monotonic()
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
            verified, gaps = verify(self.redis, workload, self.violations)
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
            "faults injected:     "
            + ", ".join(f"{k} {faults[k]}" for k in (*FAULT_KINDS, "subscriber_disconnect"))
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
        print(f"gaps:                {gaps}")
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
        "--hold",
        type=float,
        default=3.0,
        help="mean seconds a subscriber holds a connection before dropping it",
    )
    parser.add_argument("--min-gap", type=float, default=1.0, help="min seconds between faults")
    parser.add_argument("--max-gap", type=float, default=3.0, help="max seconds between faults")
    parser.add_argument("--settle-timeout", type=float, default=180.0)
    args = parser.parse_args()
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
