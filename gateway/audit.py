"""`gateway legacy-end-scan audit`: is it safe to turn the legacy END scan off?

The legacy END scan (`publish_end.lua`, see docs/bridge.md) exists for logs that an
unfenced legacy writer touched: such a writer could leave an END that is not the tail
of the stream (followed by events) or a second END. With the scan off, END
publication looks only at the tail and could not de-duplicate those. This audit finds
every retained stream where that matters, read-only, and says when the scan can go.

What it reads, and how much
- `SCAN` with `MATCH <prefix>{*}:log` (the prefix's glob characters `* ? [ ] \\`
  escaped, so a prefix such as `gw*[x]?:` never matches another prefix's keys) and
  `COUNT --count`. On Redis Cluster every master is scanned (redis-py's cluster
  `scan_iter` sends SCAN to all primaries and follows each node's cursor). Key names
  stay raw bytes throughout: a run id that is not valid UTF-8 is audited like any other
  and printed with backslash escapes (`\\xff`, `\\\\` for a backslash), the form
  `redis-cli` accepts inside double quotes.
- `TYPE` of each matched key: only streams count (anything else is reported as skipped).
- `XRANGE … COUNT --count` pages over each stream's retained window (never an unbounded
  read), then `HMGET <meta> token end_id` for a stream holding an END, then `PTTL` of
  each flagged stream. Nothing is written, expired or deleted.

A stream is flagged when its retained window holds
- a **mid-stream END**: an END entry (first field `end`) that is not the stream's last
  entry, i.e. an END followed by events, or more than one END; or
- an **unfenced END**: an END entry while the run record (`<prefix>{<run_id>}:meta`)
  has no `token` field (missing record included), or whose entry id differs from the
  record's `end_id`. The fenced `publish_end.lua` always records the id of the END it
  wrote (or adopted) as `end_id` in the same script, and only a claimed run has a
  `token`, so any other END came from a writer that bypassed the fence.

Verdict and exit code (text: the last line; `--json`: `verdict`, `exit_code`)
- `safe to disable now`, exit 0: nothing flagged;
- `safe after <ISO time> (in <duration>)`, exit 1: every flagged stream has a TTL; the
  time is now plus the longest remaining TTL, rounded up to the second. It assumes
  nothing writes to those streams meanwhile (a write refreshes the TTL): re-run the
  audit at that time and proceed on `safe to disable now`;
- `not safe: N flagged streams never expire`, exit 2: delete them (waiting is
  impossible) and re-run.
A Redis error exits 3 (no verdict); bad command-line arguments exit 2 with a
`gateway: error:` line on stderr and no verdict.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal

import redis
from redis.cluster import RedisCluster

from .redis.connect import CLUSTER_SCHEMES
from .redis.keys import FIELD_END, check_prefix
from .redis.replies import as_text

SyncClient = redis.Redis | RedisCluster
Verdict = Literal["safe_now", "safe_after", "not_safe"]

EXIT_SAFE_NOW: Final = 0
EXIT_SAFE_AFTER: Final = 1
EXIT_NOT_SAFE: Final = 2
EXIT_REDIS_ERROR: Final = 3
DEFAULT_COUNT: Final = 500
MAX_END_IDS_KEPT: Final = 16  # per flagged stream, for the report; all are counted

_GLOB_SPECIAL: Final = frozenset(b"*?[]\\")
_LOG_SUFFIX: Final = b":log"
_META_SUFFIX: Final = b":meta"
_NO_TTL: Final = -1
_GONE: Final = -2


def connect(url: str) -> SyncClient:
    """A synchronous client for `url`; `redis+cluster://` / `rediss+cluster://` → cluster."""
    scheme, sep, rest = url.partition("://")
    if scheme in CLUSTER_SCHEMES:
        return RedisCluster.from_url(f"{CLUSTER_SCHEMES[scheme]}{sep}{rest}")
    return redis.Redis.from_url(url)


def escape_glob(literal: bytes) -> bytes:
    """`literal` as a Redis glob that matches exactly itself."""
    out = bytearray()
    for byte in literal:
        if byte in _GLOB_SPECIAL:
            out.append(0x5C)  # backslash
        out.append(byte)
    return bytes(out)


def match_pattern(prefix: str) -> bytes:
    """The SCAN MATCH pattern of every run log under `prefix`: `<prefix>{*}:log`."""
    return escape_glob(check_prefix(prefix).encode()) + b"{*}" + _LOG_SUFFIX


def display_key(key: bytes) -> str:
    """A printable, unambiguous form of a raw key name (backslash escapes)."""
    out: list[str] = []
    for char in key.decode("utf-8", "surrogateescape"):
        code = ord(char)
        if 0xDC80 <= code <= 0xDCFF:  # a byte that is not valid UTF-8
            out.append(f"\\x{code - 0xDC00:02x}")
        elif char == "\\":
            out.append("\\\\")
        elif char == '"':
            out.append('\\"')
        elif char.isprintable():  # excludes controls and separators other than " "
            out.append(char)
        elif code <= 0xFF:
            out.append(f"\\x{code:02x}")
        else:  # a non-printable code point: its UTF-8 bytes
            out.extend(f"\\x{b:02x}" for b in char.encode())
    return "".join(out)


def _bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")


@dataclass(slots=True)
class StreamFinding:
    key: bytes
    entries: int = 0
    end_count: int = 0
    end_ids: list[str] = field(default_factory=list)  # the first MAX_END_IDS_KEPT
    mid_stream_end: bool = False
    unfenced_end: bool = False
    meta_token: bool = False
    meta_end_id: str | None = None
    pttl_ms: int = _GONE

    @property
    def flagged(self) -> bool:
        return self.mid_stream_end or self.unfenced_end

    def as_json(self) -> dict[str, Any]:
        return {
            "key": display_key(self.key),
            "key_hex": self.key.hex(),
            "mid_stream_end": self.mid_stream_end,
            "unfenced_end": self.unfenced_end,
            "entries": self.entries,
            "end_count": self.end_count,
            "end_ids": self.end_ids,
            "meta_has_token": self.meta_token,
            "meta_end_id": self.meta_end_id,
            "pttl_ms": self.pttl_ms,
        }


@dataclass(slots=True)
class AuditReport:
    prefix: str
    pattern: bytes
    streams_scanned: int = 0
    skipped_not_stream: int = 0
    vanished: int = 0  # matched by SCAN, gone before it could be read
    flagged: list[StreamFinding] = field(default_factory=list)
    now: datetime = field(default_factory=lambda: datetime.now(UTC))

    @property
    def mid_stream_end(self) -> int:
        return sum(1 for f in self.flagged if f.mid_stream_end)

    @property
    def unfenced_end(self) -> int:
        return sum(1 for f in self.flagged if f.unfenced_end)

    @property
    def never_expire(self) -> int:
        return sum(1 for f in self.flagged if f.pttl_ms == _NO_TTL)

    @property
    def longest_ttl_ms(self) -> int | None:
        """The longest remaining TTL among flagged streams; -1 if one never expires."""
        ttls = [f.pttl_ms for f in self.flagged if f.pttl_ms != _GONE]
        if not ttls:
            return None
        return _NO_TTL if _NO_TTL in ttls else max(ttls)

    @property
    def verdict(self) -> Verdict:
        longest = self.longest_ttl_ms
        if longest is None:
            return "safe_now"
        return "not_safe" if longest == _NO_TTL else "safe_after"

    @property
    def safe_after(self) -> datetime | None:
        longest = self.longest_ttl_ms
        if longest is None or longest < 0:
            return None
        return self.now + timedelta(seconds=math.ceil(longest / 1000))

    @property
    def exit_code(self) -> int:
        return {"safe_now": EXIT_SAFE_NOW, "safe_after": EXIT_SAFE_AFTER}.get(
            self.verdict, EXIT_NOT_SAFE
        )

    def verdict_line(self) -> str:
        verdict = self.verdict
        if verdict == "safe_now":
            return "verdict: safe to disable now"
        if verdict == "not_safe":
            return f"verdict: not safe: {self.never_expire} flagged streams never expire"
        when = self.safe_after
        assert when is not None
        return (
            f"verdict: safe after {_iso(when)} "
            f"(in {format_duration((when - self.now).total_seconds())})"
        )

    def as_json(self) -> dict[str, Any]:
        when = self.safe_after
        return {
            "prefix": self.prefix,
            "match": display_key(self.pattern),
            "streams_scanned": self.streams_scanned,
            "skipped_not_stream": self.skipped_not_stream,
            "vanished": self.vanished,
            "streams_mid_stream_end": self.mid_stream_end,
            "streams_unfenced_end": self.unfenced_end,
            "streams_flagged": len(self.flagged),
            "never_expire": self.never_expire,
            "longest_ttl_ms": self.longest_ttl_ms,
            "now": _iso(self.now),
            "verdict": self.verdict,
            "safe_after": _iso(when) if when is not None else None,
            "exit_code": self.exit_code,
            "verdict_line": self.verdict_line(),
            "flagged": [f.as_json() for f in self.flagged],
        }

    def text(self) -> str:
        lines = []
        for f in self.flagged:
            kinds = [
                k
                for k, on in (
                    ("mid-stream END", f.mid_stream_end),
                    ("unfenced END", f.unfenced_end),
                )
                if on
            ]
            lines.append(
                f"flagged: {display_key(f.key)}  [{', '.join(kinds)}]  "
                f"ends={f.end_count} entries={f.entries}  ttl={_ttl_text(f.pttl_ms)}"
            )
        longest = self.longest_ttl_ms
        lines += [
            f"streams scanned: {self.streams_scanned}",
            f"streams with a mid-stream END: {self.mid_stream_end}",
            f"streams with an unfenced END: {self.unfenced_end}",
            f"keys skipped (not a stream): {self.skipped_not_stream}",
            "longest remaining TTL among flagged streams: "
            + ("none (nothing flagged)" if longest is None else _ttl_text(longest)),
            self.verdict_line(),
        ]
        return "\n".join(lines)


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_duration(seconds: float) -> str:
    total = max(0, math.ceil(seconds))
    days, rest = divmod(total, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{days}d"] if days else []
    if days or hours:
        parts.append(f"{hours}h")
    if days or hours or minutes:
        parts.append(f"{minutes}m")
    parts.append(f"{secs}s")
    return " ".join(parts)


def _ttl_text(pttl_ms: int) -> str:
    if pttl_ms == _NO_TTL:
        return "never expires: delete it or wait is impossible"
    if pttl_ms == _GONE:
        return "gone (expired during the audit)"
    return f"{format_duration(pttl_ms / 1000)} ({pttl_ms} ms)"


def _scan_keys(client: SyncClient, pattern: bytes, count: int) -> Iterator[bytes]:
    """Every key matching `pattern` once (SCAN may repeat keys), on every master."""
    seen: set[bytes] = set()
    for raw in client.scan_iter(match=pattern, count=count):
        key = _bytes(raw)
        if key.endswith(_LOG_SUFFIX) and key not in seen:
            seen.add(key)
            yield key


def _type(client: SyncClient, key: bytes) -> str:
    return as_text(client.type(key))


def audit_stream(client: SyncClient, key: bytes, count: int) -> StreamFinding:
    """Page through one stream's retained window; flags as defined in the module doc."""
    finding = StreamFinding(key=key)
    start: bytes = b"-"
    last_id: bytes | None = None
    last_end_id: bytes | None = None
    while True:
        page = client.xrange(key, min=start, max=b"+", count=count) or []
        page_last: bytes | None = None
        for raw_id, fields in page:
            if raw_id is None:
                continue
            entry_id = page_last = _bytes(raw_id)
            finding.entries += 1
            last_id = entry_id
            first_field = next(iter(fields or {}), None)
            if first_field is not None and _bytes(first_field) == FIELD_END:
                finding.end_count += 1
                last_end_id = entry_id
                if len(finding.end_ids) < MAX_END_IDS_KEPT:
                    finding.end_ids.append(entry_id.decode())
        if len(page) < count or page_last is None:
            break
        start = b"(" + page_last
    if finding.end_count == 0:
        return finding
    finding.mid_stream_end = finding.end_count > 1 or last_end_id != last_id
    meta_key = key[: -len(_LOG_SUFFIX)] + _META_SUFFIX
    token, end_id = client.hmget(meta_key, ["token", "end_id"])
    finding.meta_token = token is not None
    finding.meta_end_id = as_text(end_id) if end_id is not None else None
    finding.unfenced_end = (
        not finding.meta_token
        or finding.end_count > 1
        or finding.meta_end_id != (last_end_id or b"").decode()
    )
    return finding


def run_audit(client: SyncClient, prefix: str, count: int = DEFAULT_COUNT) -> AuditReport:
    """Scan every run log under `prefix`; read-only."""
    if count < 1:
        raise ValueError("count must be at least 1")
    pattern = match_pattern(prefix)
    report = AuditReport(prefix=prefix, pattern=pattern)
    for key in _scan_keys(client, pattern, count):
        kind = _type(client, key)
        if kind == "none":
            report.vanished += 1
            continue
        if kind != "stream":
            report.skipped_not_stream += 1
            continue
        report.streams_scanned += 1
        finding = audit_stream(client, key, count)
        if finding.flagged:
            report.flagged.append(finding)
    for finding in report.flagged:
        finding.pttl_ms = int(client.pttl(finding.key))
    report.now = datetime.now(UTC)  # TTLs were read just now: count from here
    return report


def render(report: AuditReport, as_json: bool) -> str:
    if as_json:
        return json.dumps(report.as_json(), ensure_ascii=True, sort_keys=False)
    return report.text()
