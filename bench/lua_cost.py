"""Redis cost of one append script call (`lua/publish.lua`), by case, beside a plain
`XADD` of the same event measured in the same run (what DeerFlow's bridge pays per event).

The bridge makes one real call of each case on a private redis-server while `MONITOR`
records it; the script then replays that call `--calls` times, pipelined (a numbered
batch with its number moved on each time, so that every call appends). Cases, one
16-byte token event each:

  plain     a run without a session, unnumbered (`bridge.publish`, one token per POST)
  numbered  a run without a session, numbered (`publish_many(seq=...)`: what a streamed
            append and the producer client send)
  session   a numbered run of a session: the turn record folds its text
  *-noscan  the same with the legacy END scan off

Two measures:
  default         Redis µs per call, `usec_per_call` of `EVALSHA` in `INFO commandstats`
                  (the commands the script runs included), median over `--rounds`; wall
                  clock, so it moves with whatever else the machine runs
  --instructions  instructions redis-server executes per call (valgrind's callgrind,
                  zeroed before and dumped after each case): the same for the same code
                  and input on any machine, the protocol's reading and writing included;
                  with a lower bound beside them, `floor`: FLOOR_SCRIPT, the least an
                  append fenced in Redis does (read the fence, XADD, notify)

Run: .venv/bin/python bench/lua_cost.py [--calls N] [--rounds R] [--instructions] [--quick]
(A/B: `PYTHONPATH=<checkout>` replays another commit's scripts.)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shlex
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis
from _common import RedisServer

from gateway import RedisStreamBridge, Settings
from gateway.redis.scripts import lua_source
from tests.support.redis_servers import free_port

TOKEN = {"text": "word "}
SEQ_AT = 5  # ARGV index (0-based) of the batch's number
SCAN_AT = 7  # ARGV index of the legacy END scan switch
PIPELINE = 200
# The least any append that keeps the fence in Redis can do, for a lower bound (never
# used by the gateway): read the fence, append, wake the readers. No lease clock, no
# record write, no trimming or TTL, so below what the contract asks; same keys and
# arguments as the real call, so the call itself costs the same.
FLOOR_SCRIPT = """
local fence = redis.call('HMGET', KEYS[1], 'token', 'status')
if fence[1] ~= ARGV[1] then return {'fenced', 'token'} end
if fence[2] and fence[2] ~= 'running' then return {'ended', ''} end
local id = redis.call('XADD', KEYS[2], '*', 'e', ARGV[9], 'd', ARGV[10])
redis.call('SPUBLISH', KEYS[2], id)
return {'ok', 0, '', id}
"""


def _evalsha(line: str) -> list[str] | None:
    """The arguments after the command name of an EVALSHA line MONITOR wrote."""
    if '"EVALSHA"' not in line and '"evalsha"' not in line:
        return None
    return shlex.split(line.split("] ", 1)[1])[1:]


def _capture(url: str, port: int) -> dict[str, list[str]]:
    """One call of each case, as the bridge sends it, recorded by MONITOR."""
    settings = Settings(redis_url=url, max_events_per_run=1000)
    tokens: dict[str, str] = {}

    async def each(seq: int) -> None:
        async with RedisStreamBridge.connect(settings) as bridge:
            if not tokens:
                for run_id, session in (
                    ("lc-plain", None),
                    ("lc-numbered", None),
                    ("lc-session", "lc"),
                ):
                    claim = await bridge.claim(run_id, session_id=session, lease_seconds=36000)
                    tokens[run_id] = claim.token
            await bridge.publish("lc-plain", "token", TOKEN, producer_token=tokens["lc-plain"])
            for run_id in ("lc-numbered", "lc-session"):
                await bridge.publish_many(
                    run_id, [("token", TOKEN)], producer_token=tokens[run_id], seq=seq
                )

    for seq in range(1, 4):  # warm: scripts loaded, records past their first append
        asyncio.run(each(seq))
    monitor = subprocess.Popen(
        ["redis-cli", "-p", str(port), "monitor"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert monitor.stdout is not None
        assert monitor.stdout.readline().strip() == "OK"
        asyncio.run(each(4))
        calls: list[list[str]] = []
        while len(calls) < 3:  # redis-cli flushes each line it prints
            call = _evalsha(monitor.stdout.readline())
            if call is not None:
                calls.append(call)
    finally:
        monitor.terminate()
        monitor.wait()
    return dict(zip(("plain", "numbered", "session"), calls, strict=True))


def _cases(captured: dict[str, list[str]]) -> dict[str, list[str]]:
    cases = {}
    for name, call in captured.items():
        nkeys = int(call[1])
        for scan in ("1", "0"):
            argv = list(call[2 + nkeys :])
            argv[SCAN_AT] = scan
            cases[name + ("" if scan == "1" else "-noscan")] = [*call[: 2 + nkeys], *argv]
    return cases


class _Replay:
    """Sends a case's call `calls` times; numbered batches take the run's next numbers."""

    def __init__(self, r: redis.Redis) -> None:
        self._r = r
        self._seq: dict[str, int] = {}  # per run: the next number (4 went in the capture)

    def case(self, call: list[str], calls: int) -> None:
        sha, nkeys = call[0], int(call[1])
        keys, argv = call[2 : 2 + nkeys], call[2 + nkeys :]
        pipe = self._r.pipeline(transaction=False)
        for i in range(calls):
            if argv[SEQ_AT]:
                seq = self._seq.get(keys[0], 5)
                self._seq[keys[0]] = seq + 1
                argv = [*argv[:SEQ_AT], str(seq), *argv[SEQ_AT + 1 :]]
            pipe.evalsha(sha, nkeys, *keys, *argv)
            if i % PIPELINE == PIPELINE - 1 or i == calls - 1:
                for reply in pipe.execute():
                    assert reply[0] == b"ok", reply

    def floor(self, call: list[str], calls: int) -> None:
        """FLOOR_SCRIPT with the arguments of `call` (a plain case)."""
        nkeys = int(call[1])
        sha = self._r.script_load(FLOOR_SCRIPT)
        pipe = self._r.pipeline(transaction=False)
        for i in range(calls):
            pipe.evalsha(sha, nkeys, *call[2:])
            if i % PIPELINE == PIPELINE - 1 or i == calls - 1:
                for reply in pipe.execute():
                    assert reply[0] == b"ok", reply

    def peer(self, calls: int) -> None:
        pipe = self._r.pipeline(transaction=False)
        for i in range(calls):
            pipe.xadd("lc-peer", {"e": "token", "d": '{"text":"word "}'}, maxlen=1000)
            if i % PIPELINE == PIPELINE - 1 or i == calls - 1:
                pipe.execute()


def _usec(r: redis.Redis, command: str, send: Callable[[], None]) -> float:
    r.config_resetstat()
    send()
    stats: dict[str, Any] = r.info("commandstats")
    return float(stats[f"cmdstat_{command}"]["usec_per_call"])


@contextlib.contextmanager
def _callgrind_server() -> Iterator[tuple[int, Callable[[Callable[[], None]], int]]]:
    """A redis-server under callgrind, and a function that counts the instructions it
    executes while a callable runs."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="lua-cost-") as tmp:
        proc = subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={tmp}/cg.%p",
                "redis-server",
                "--port",
                str(port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                tmp,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def count(send: Callable[[], None]) -> int:
            for dump in Path(tmp).glob("cg.*.*"):
                dump.unlink()
            subprocess.run(
                ["callgrind_control", "-z", str(proc.pid)], capture_output=True, check=True
            )
            send()
            subprocess.run(
                ["callgrind_control", "-d", str(proc.pid)], capture_output=True, check=True
            )
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                for dump in Path(tmp).glob("cg.*.*"):
                    for line in dump.read_text().splitlines():
                        if line.startswith("totals:"):
                            return int(line.split()[1])
                time.sleep(0.05)
            raise TimeoutError("callgrind wrote no dump")

        try:
            r = redis.Redis(port=port)
            deadline = time.monotonic() + 60
            while True:
                try:
                    r.ping()
                    break
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            yield port, count
        finally:
            proc.terminate()
            proc.wait()


def _run_usec(calls: int, rounds: int) -> dict[str, list[float]]:
    with RedisServer() as server:
        captured = _capture(server.url, server.port)
        r = redis.Redis.from_url(server.url)
        assert r.script_load(lua_source("publish")) == captured["plain"][0]
        replay = _Replay(r)
        figures: dict[str, list[float]] = {}
        for _ in range(rounds):
            for name, call in _cases(captured).items():
                figures.setdefault(name, []).append(
                    _usec(r, "evalsha", lambda call=call: replay.case(call, calls))
                )
            figures.setdefault("peer XADD", []).append(_usec(r, "xadd", lambda: replay.peer(calls)))
    return figures


def _run_instructions(calls: int) -> dict[str, list[float]]:
    with _callgrind_server() as (port, count):
        captured = _capture(f"redis://127.0.0.1:{port}/0", port)
        replay = _Replay(redis.Redis(port=port))
        figures: dict[str, list[float]] = {}
        for name, call in _cases(captured).items():
            figures[name] = [count(lambda call=call: replay.case(call, calls)) / calls]
        plain = captured["plain"]
        figures["floor (see FLOOR)"] = [count(lambda: replay.floor(plain, calls)) / calls]
        figures["peer XADD"] = [count(lambda: replay.peer(calls)) / calls]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=None, help="20000 (2000 with --instructions)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--instructions", action="store_true")
    parser.add_argument("--quick", action="store_true", help="1 round of 5000 calls (make bench)")
    args = parser.parse_args()
    if args.instructions:
        calls = args.calls or 2_000
        figures = _run_instructions(calls)
        print(f"publish.lua, redis-server instructions per call (callgrind), {calls} calls:")
        for name, values in figures.items():
            print(f"  {name:17s} {values[0]:9,.0f}")
        return
    calls = args.calls or (5_000 if args.quick else 20_000)
    rounds = 1 if args.quick else args.rounds
    figures = _run_usec(calls, rounds)
    print(
        "publish.lua, Redis µs per call (EVALSHA, commands included),",
        f"{rounds} rounds of {calls}:",
    )
    for name, values in figures.items():
        rounds = " ".join(f"{value:.2f}" for value in values)
        print(f"  {name:17s} median {statistics.median(values):6.2f}   rounds {rounds}")


if __name__ == "__main__":
    main()
