"""`gateway legacy-end-scan audit` against real redis-server processes (and a real cluster).

Streams are seeded with plain XADD/HSET (what a legacy, unfenced writer leaves) next to
runs written by the real RedisStreamBridge (which must never be flagged).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import uuid4

import anyio
import pytest
import redis

from gateway.audit import (
    EXIT_NOT_SAFE,
    EXIT_SAFE_AFTER,
    EXIT_SAFE_NOW,
    AuditReport,
    connect,
    display_key,
    escape_glob,
    format_duration,
    match_pattern,
    run_audit,
)

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]
GATEWAY_BIN = Path(sys.executable).parent / "gateway"  # the venv's console script
ISO_RE = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


# -- helpers ------------------------------------------------------------------------------


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        client.close()


def log_key(prefix: str | bytes, run_id: str | bytes) -> bytes:
    p = prefix.encode() if isinstance(prefix, str) else prefix
    rid = run_id.encode() if isinstance(run_id, str) else run_id
    return p + b"{" + rid + b"}:log"


def meta_key(prefix: str | bytes, run_id: str | bytes) -> bytes:
    return log_key(prefix, run_id)[: -len(b":log")] + b":meta"


def legacy_stream(client: Any, key: bytes, layout: str, ttl_ms: int | None = None) -> list[bytes]:
    """Seed a stream with plain XADDs: `layout` is a string of E (event) and X (END)."""
    ids = []
    for i, kind in enumerate(layout):
        fields = {b"end": b"success"} if kind == "X" else {b"e": b"token", b"d": b'{"i":%d}' % i}
        ids.append(client.xadd(key, fields))
    if ttl_ms is not None:
        client.pexpire(key, ttl_ms)
    return ids


def clean_bridge_runs(url: str, prefix: str) -> list[str]:
    """Runs written by the real RedisStreamBridge: ended, running, taken over, recovered,
    trimmed, with the legacy scan on and off. None of them may be flagged."""
    from gateway.bridge.provider import open_bridge
    from gateway.settings import Settings

    run_ids = [f"clean-{uuid4().hex[:8]}-{n}" for n in range(6)]

    async def main() -> None:
        for legacy_scan in (True, False):
            settings = Settings(
                redis_url=url,
                redis_key_prefix=prefix,
                max_events_per_run=5,
                legacy_end_scan_enabled=legacy_scan,
            )
            async with open_bridge(settings) as bridge:
                if legacy_scan:
                    ended, running, taken = run_ids[0], run_ids[1], run_ids[2]
                else:
                    ended, running, taken = run_ids[3], run_ids[4], run_ids[5]
                # ended, trimmed (12 events, 5 kept), END published twice (idempotent)
                claim = await bridge.claim(ended)
                for i in range(12):
                    await bridge.publish(ended, "token", {"i": i}, producer_token=claim.token)
                await bridge.publish_end(ended, "success", producer_token=claim.token)
                await bridge.publish_end(ended, "success", producer_token=claim.token)
                # running: no END at all
                claim = await bridge.claim(running)
                await bridge.publish(running, "token", {}, producer_token=claim.token)
                # taken over, then ended by the new owner (or recovered by a gateway)
                claim = await bridge.claim(taken, lease_seconds=0.2)
                await bridge.publish(taken, "token", {}, producer_token=claim.token)
                if legacy_scan:
                    new = await bridge.claim(taken, takeover=True)
                    await bridge.publish(taken, "token", {}, producer_token=new.token)
                    await bridge.publish_end(taken, "error", {"m": "x"}, producer_token=new.token)
                else:
                    await anyio.sleep(0.3)  # lease lapses: an unowned recovery END
                    await bridge.publish_end(taken, "producer_lost", producer_token=None)

    anyio.run(main)
    return run_ids


def gateway_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    return subprocess.run(
        [str(GATEWAY_BIN), "legacy-end-scan", "audit", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=45,
    )


def flagged_keys(report: AuditReport) -> set[bytes]:
    return {f.key for f in report.flagged}


# -- pure helpers ---------------------------------------------------------------------------


def test_escape_glob_and_pattern() -> None:
    assert escape_glob(b"gw*[x]?\\:") == b"gw\\*\\[x\\]\\?\\\\:"
    assert escape_glob(b"plain:") == b"plain:"
    assert match_pattern("gw:") == b"gw:{*}:log"
    assert match_pattern("a*b:") == b"a\\*b:{*}:log"


def test_display_key_escapes_bytes_backslashes_and_controls() -> None:
    assert display_key(b"gw:{run-1}:log") == "gw:{run-1}:log"
    assert display_key(b"gw:{\xff\xfe}:log") == "gw:{\\xff\\xfe}:log"
    assert display_key(b"a\\b") == "a\\\\b"  # a literal backslash is not an escape
    assert display_key(b'a"\n\t') == 'a\\"\\x0a\\x09'
    assert display_key("é".encode()) == "é"


def test_format_duration() -> None:
    assert format_duration(0) == "0s"
    assert format_duration(59.2) == "1m 0s"  # rounded up: never earlier than the TTL
    assert format_duration(3_661) == "1h 1m 1s"
    assert format_duration(90_061) == "1d 1h 1m 1s"


# -- single server --------------------------------------------------------------------------


def test_clean_bridge_runs_are_not_flagged(redis_url: str, key_prefix: str) -> None:
    run_ids = clean_bridge_runs(redis_url, key_prefix)
    report = run_audit(connect(redis_url), key_prefix, count=2)  # small pages
    assert report.streams_scanned == len(run_ids)
    assert report.flagged == []
    assert report.verdict == "safe_now" and report.exit_code == EXIT_SAFE_NOW

    done = gateway_cli("--redis-url", redis_url, "--prefix", key_prefix, "--count", "3")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert f"streams scanned: {len(run_ids)}" in lines
    assert "streams with a mid-stream END: 0" in lines
    assert "streams with an unfenced END: 0" in lines
    assert lines[-1] == "verdict: safe to disable now"


def test_mid_stream_and_unfenced_ends(r: redis.Redis, redis_url: str, key_prefix: str) -> None:
    p = key_prefix
    clean = clean_bridge_runs(redis_url, p)[0]  # ended, END recorded by the fenced script
    # (b) legacy: END followed by events, deep inside a long stream (crosses pages)
    legacy_stream(r, log_key(p, "mid"), "EEEEEEXEEE", ttl_ms=60_000)
    # two ENDs, the second at the tail
    legacy_stream(r, log_key(p, "twice"), "EXEX", ttl_ms=60_000)
    # (c) END at the tail, no run record at all / a record without a token
    legacy_stream(r, log_key(p, "nometa"), "EEX", ttl_ms=60_000)
    legacy_stream(r, log_key(p, "notoken"), "EX", ttl_ms=60_000)
    r.hset(meta_key(p, "notoken"), mapping={"status": "success"})
    # a token, but end_id names another entry
    ids = legacy_stream(r, log_key(p, "wrongid"), "EX", ttl_ms=60_000)
    r.hset(meta_key(p, "wrongid"), mapping={"token": "t", "end_id": ids[0]})
    # a fenced, ended bridge run that a legacy writer appended to afterwards
    r.xadd(log_key(p, clean), {b"e": b"late", b"d": b"{}"})

    report = run_audit(connect(redis_url), p, count=3)
    by_key = {f.key: f for f in report.flagged}
    expect = {  # key -> (mid-stream END, unfenced END)
        log_key(p, "mid"): (True, True),
        log_key(p, "twice"): (True, True),
        log_key(p, "nometa"): (False, True),
        log_key(p, "notoken"): (False, True),
        log_key(p, "wrongid"): (False, True),
        log_key(p, clean): (True, False),  # its END is the recorded, fenced one
    }
    assert {k: (f.mid_stream_end, f.unfenced_end) for k, f in by_key.items()} == expect
    assert by_key[log_key(p, "mid")].entries == 10
    assert by_key[log_key(p, "twice")].end_count == 2
    assert report.streams_scanned == 6 + 5  # 6 bridge runs + 5 legacy streams
    assert (report.mid_stream_end, report.unfenced_end) == (3, 5)
    assert report.verdict == "safe_after" and report.exit_code == EXIT_SAFE_AFTER


def test_prefix_glob_characters_are_escaped(
    r: redis.Redis, redis_url: str, key_prefix: str
) -> None:
    prefix = f"{key_prefix}gw*[x]?\\:"
    decoy = f"{key_prefix}gwZZx9:"  # matched by the *unescaped* glob of `prefix`
    legacy_stream(r, log_key(prefix, "mine"), "XE", ttl_ms=60_000)
    legacy_stream(r, log_key(decoy, "other"), "XE")  # never expires: would say "not safe"
    legacy_stream(r, log_key(decoy, "other2"), "X")
    unescaped = prefix.encode() + b"{*}:log"
    assert log_key(decoy, "other") in set(r.scan_iter(match=unescaped, count=1000))

    report = run_audit(connect(redis_url), prefix)
    assert report.streams_scanned == 1
    assert flagged_keys(report) == {log_key(prefix, "mine")}
    assert report.verdict == "safe_after"

    decoy_report = run_audit(connect(redis_url), decoy)
    assert flagged_keys(decoy_report) == {log_key(decoy, "other"), log_key(decoy, "other2")}


def test_binary_run_id_and_non_stream_log_keys(
    r: redis.Redis, redis_url: str, key_prefix: str
) -> None:
    p = key_prefix
    binary = log_key(p, b"\xff\xfe\\run")  # not UTF-8, and a literal backslash
    legacy_stream(r, binary, "XE", ttl_ms=120_000)
    r.hset(meta_key(p, b"\xff\xfe\\run"), mapping={b"status": b"running"})
    legacy_stream(r, log_key(p, "é"), "X", ttl_ms=60_000)
    # (f) keys ending in :log that are not streams: skipped, never read as streams
    r.set(log_key(p, "string"), b"end")
    r.hset(log_key(p, "hash"), mapping={"end": "success"})
    r.rpush(log_key(p, "list"), b"end")
    r.set(p.encode() + b"{x}:log:not-a-log", b"1")

    report = run_audit(connect(redis_url), p)
    assert report.streams_scanned == 2
    assert report.skipped_not_stream == 3
    assert flagged_keys(report) == {binary, log_key(p, "é")}
    finding = next(f for f in report.flagged if f.key == binary)
    assert finding.mid_stream_end and finding.unfenced_end

    done = gateway_cli("--redis-url", redis_url, "--prefix", p)
    assert done.returncode == EXIT_SAFE_AFTER, done.stderr
    assert f"flagged: {p}{{\\xff\\xfe\\\\run}}:log  [mid-stream END, unfenced END]" in done.stdout
    assert f"flagged: {p}{{é}}:log  [unfenced END]" in done.stdout
    assert "keys skipped (not a stream): 3" in done.stdout

    data = json.loads(gateway_cli("--redis-url", redis_url, "--prefix", p, "--json").stdout)
    hexes = {f["key_hex"] for f in data["flagged"]}
    assert binary.hex() in hexes and bytes.fromhex(binary.hex()) == binary


def test_verdict_ttl_then_no_ttl(r: redis.Redis, redis_url: str, key_prefix: str) -> None:
    p = key_prefix
    legacy_stream(r, log_key(p, "short"), "XE", ttl_ms=60_000)
    legacy_stream(r, log_key(p, "long"), "EX", ttl_ms=3_600_000)
    before = time.time()
    done = gateway_cli("--redis-url", redis_url, "--prefix", p)
    assert done.returncode == EXIT_SAFE_AFTER, done.stderr
    last = done.stdout.splitlines()[-1]
    m = re.fullmatch(rf"verdict: safe after ({ISO_RE}) \(in (59m \d+s|1h 0m 0s)\)", last)
    assert m, last
    when = datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    assert before + 3_600 - 5 <= when <= time.time() + 3_600 + 1
    assert "longest remaining TTL among flagged streams: 1h 0m 0s" in done.stdout or (
        "longest remaining TTL among flagged streams: 59m" in done.stdout
    )

    legacy_stream(r, log_key(p, "forever-1"), "XE")
    legacy_stream(r, log_key(p, "forever-2"), "XX")
    done = gateway_cli("--redis-url", redis_url, "--prefix", p, "--json")
    assert done.returncode == EXIT_NOT_SAFE, done.stderr
    data = json.loads(done.stdout)  # one JSON object, nothing else
    assert data["verdict"] == "not_safe" and data["exit_code"] == EXIT_NOT_SAFE
    assert data["verdict_line"] == "verdict: not safe: 2 flagged streams never expire"
    assert data["streams_scanned"] == 4 and data["streams_flagged"] == 4
    assert data["longest_ttl_ms"] == -1 and data["safe_after"] is None
    text = gateway_cli("--redis-url", redis_url, "--prefix", p)
    assert text.returncode == EXIT_NOT_SAFE
    assert "never expires: delete it or wait is impossible" in text.stdout
    assert text.stdout.splitlines()[-1] == "verdict: not safe: 2 flagged streams never expire"


def test_audit_is_read_only(fresh_redis: Any) -> None:
    client = redis.Redis.from_url(fresh_redis.url)
    try:
        p = "gw:"
        clean_bridge_runs(fresh_redis.url, p)
        legacy_stream(client, log_key(p, "a"), "EXE", ttl_ms=60_000)
        legacy_stream(client, log_key(p, "b"), "X")
        client.set(log_key(p, "c"), b"x")

        def snapshot() -> dict[bytes, tuple[Any, Any, bool]]:
            return {
                k: (client.type(k), client.dump(k), client.pttl(k) > 0)
                for k in client.scan_iter(count=1000)
            }

        def writes() -> int:
            return int(client.info("persistence")["rdb_changes_since_last_save"])

        before, writes_before = snapshot(), writes()
        report = run_audit(connect(fresh_redis.url), p, count=1)
        assert report.verdict == "not_safe"
        assert writes() == writes_before  # not a single write command ran
        assert snapshot() == before
    finally:
        client.close()


def test_bad_prefix_and_unreachable_redis(redis_url: str) -> None:
    done = gateway_cli("--redis-url", redis_url, "--prefix", "gw{x}:")
    assert done.returncode == 2 and "verdict" not in done.stdout
    assert "must not contain" in done.stderr
    done = gateway_cli("--redis-url", "redis://127.0.0.1:1/0")
    assert done.returncode == 3 and "verdict" not in done.stdout
    assert done.stderr.startswith("gateway: error: Redis:")


# -- cluster --------------------------------------------------------------------------------


@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_cluster_audit_scans_every_master(redis_cluster: Any, key_prefix: str) -> None:
    from redis.cluster import RedisCluster

    cluster_url = redis_cluster.url.replace("redis://", "redis+cluster://", 1)
    clean = clean_bridge_runs(cluster_url, key_prefix)
    rc = RedisCluster.from_url(redis_cluster.url)
    try:
        flagged: dict[bytes, str] = {}  # key -> the master that holds it
        n = 0
        while len(set(flagged.values())) < 3 or len(flagged) < 6:
            key = log_key(key_prefix, f"legacy-{n}")
            n += 1
            node = rc.get_node_from_key(key).name
            if list(flagged.values()).count(node) >= 3:
                continue
            legacy_stream(rc, key, "EXE", ttl_ms=600_000)
            flagged[key] = node
        binary = log_key(key_prefix, b"bin\xff")
        legacy_stream(rc, binary, "XX", ttl_ms=600_000)
        flagged[binary] = rc.get_node_from_key(binary).name

        done = gateway_cli("--redis-url", cluster_url, "--prefix", key_prefix, "--json")
        assert done.returncode == EXIT_SAFE_AFTER, done.stderr
        data = json.loads(done.stdout)
        assert data["streams_scanned"] == len(clean) + len(flagged)
        assert {bytes.fromhex(f["key_hex"]) for f in data["flagged"]} == set(flagged)
        assert len(set(flagged.values())) == 3  # found on every master

        # one master alone holds only part of them: the audit really visits them all
        one = redis.Redis(host=rc.get_primaries()[0].host, port=rc.get_primaries()[0].port)
        try:
            alone = run_audit(one, key_prefix)
            assert 0 < len(alone.flagged) < len(flagged)
        finally:
            one.close()
    finally:
        rc.close()
