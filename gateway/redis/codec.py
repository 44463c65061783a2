"""What the Redis bridge reads, decoded: stream entries and `read.lua`'s typed reply.

Both the bridge (`bridge.py`) and the per-process fan-out (`fanout.py`) import
this; it imports neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import orjson

from ..bridge.rules import READ_BATCH, Bounds, Entry, LogRead, predecessor
from ..cursor import parse_cursor
from ..values import End, StreamEvent
from .keys import FIELD_DATA, FIELD_END, FIELD_ERROR, FIELD_EVENT
from .replies import as_text


def is_end(fields: Sequence[bytes]) -> bool:
    return bool(fields) and fields[0] == FIELD_END


def flatten(fields: Any) -> list[bytes]:
    if isinstance(fields, dict):
        flat: list[bytes] = []
        for key, value in fields.items():
            flat += [key, value]
        return flat
    return list(fields)


def entry_item(entry_id: str, fields: list[bytes]) -> Entry:
    """Turn one stream entry into what a reader sees."""
    if fields and fields[0] == FIELD_END:
        error: Any = None
        if len(fields) >= 4 and fields[2] == FIELD_ERROR:
            error = orjson.loads(fields[3])
        return End(status=as_text(fields[1]), error=error, id=entry_id)  # type: ignore[arg-type]
    if len(fields) == 4 and fields[0] == FIELD_EVENT and fields[2] == FIELD_DATA:
        # The layout lua/publish.lua writes: no dict per entry on the replay hot path.
        return StreamEvent(id=entry_id, event=fields[1].decode(), data=fields[3])
    pairs = dict(zip(fields[::2], fields[1::2], strict=False))  # another writer's order
    return StreamEvent(id=entry_id, event=as_text(pairs[FIELD_EVENT]), data=pairs[FIELD_DATA])


def decode_entries(raw: Sequence[Any]) -> list[Entry]:
    """XRANGE replies as reader items, cut after the first END (a legacy log may hold
    entries after one; readers never see them)."""
    items: list[Entry] = []
    for raw_id, fields in raw:
        if (
            type(fields) is list
            and len(fields) == 4
            and fields[0] == FIELD_EVENT
            and fields[2] == FIELD_DATA
        ):
            # An event as lua/publish.lua writes it and read.lua returns it (the layout
            # `entry_item` decodes first): a replay's hot path, inline, since the call
            # and the copy of the general path below cost as much again (the id too:
            # `as_text`'s call was a third of this branch).
            entry_id = raw_id.decode() if type(raw_id) is bytes else as_text(raw_id)
            items.append(StreamEvent(entry_id, fields[1].decode(), fields[3]))
            continue
        item = entry_item(as_text(raw_id), flatten(fields))
        items.append(item)
        if isinstance(item, End):
            break
    return items


def log_bounds(
    length: int, entries_added: int, max_deleted: str, last_generated: str, first: str
) -> Bounds:
    """The floor of a log from its stream metadata (see `rules.Bounds`).

    The scripts record every removal they make in max-deleted-entry-id. A log that
    dropped entries (entries-added > length) with no such record was trimmed by someone
    else: only what is retained can be verified, so the floor is just below the first
    retained entry (or the last generated id of an emptied log).
    """
    trimmed = entries_added > length
    recorded = parse_cursor(max_deleted) if max_deleted else (0, 0)
    if recorded != (0, 0):
        floor: tuple[int, int] | None = recorded
    elif trimmed:
        floor = predecessor(parse_cursor(first)) if first else parse_cursor(last_generated)
    else:
        floor = None
    # first/last event ids are filled in by the reader when it reports a gap.
    return Bounds(floor=floor, trimmed=trimmed, first=None, last=None)


def parse_read(reply: Sequence[Any], after: str) -> LogRead:
    """`read.lua`'s reply to a read after `after` ("-": from the start)."""
    exists, length, added, max_deleted, last_generated, first, raw, tail = reply[:8]
    status, error, end, last = reply[8:]
    if not exists:
        return _record_read(status, error, end, last)
    bounds = log_bounds(
        int(length), int(added), as_text(max_deleted), as_text(last_generated), as_text(first)
    )
    return _log_read(bounds, raw, tail, after)


def _record_read(status: Any, error: Any, end: Any, last: Any) -> LogRead:
    """A read that found no log: what the run record says (its HMGET fields)."""
    return LogRead(
        exists=False,
        bounds=None,
        entries=[],
        tail=None,
        status=as_text(status),
        error=orjson.loads(error) if error else None,
        end_id=as_text(end) or None,
        last_event=parse_cursor(as_text(last)) if last else None,
    )


def _log_read(bounds: Bounds, raw: Sequence[Any], tail: Any, after: str) -> LogRead:
    """A read of an existing log: its bounds, the entries after `after`, its newest entry,
    and whether `after` is one of its entries.

    The reads' XRANGE starts at `after` itself, inclusive, and asks for READ_BATCH + 1
    entries, so that the read tells whether the position is an entry of the log (the
    rule in `bridge.rules.unvouched`); it is taken out here, leaving READ_BATCH."""
    found: bool | None = None
    if after != "-":
        found = bool(raw) and as_text(raw[0][0]) == after
        raw = raw[1:] if found else raw
    return LogRead(
        exists=True,
        bounds=bounds,
        entries=decode_entries(raw[:READ_BATCH]),
        tail=entry_item(as_text(tail[0]), flatten(tail[1])) if tail else None,
        status="",
        error=None,
        end_id=None,
        last_event=None,
        found=found,
    )


def stream_info(info: Any) -> dict[bytes, Any]:
    """XINFO STREAM's reply as a dict (a flat list in RESP2, a map in RESP3)."""
    if isinstance(info, dict):
        return {k if isinstance(k, bytes) else str(k).encode(): v for k, v in info.items()}
    return dict(zip(info[::2], info[1::2], strict=False))


def parse_log_read(record: Sequence[Any], info: Any, raw: Sequence[Any], after: str) -> LogRead:
    """The replies of the bridge's read transaction (`reads.Reads.read`) as the
    same `LogRead` `read.lua` gives: `record` HMGET status err end_id last of the run
    record, `info` XINFO STREAM of the log (an error reply when there is no log), `raw`
    the XRANGE from the reader's position `after`, inclusive (see `_log_read`)."""
    if isinstance(info, Exception):
        return _record_read(*(value or b"" for value in record))
    fields = stream_info(info)
    first = fields.get(b"first-entry")
    tail = fields.get(b"last-entry")
    bounds = log_bounds(
        int(fields[b"length"]),
        int(fields[b"entries-added"]),
        as_text(fields[b"max-deleted-entry-id"]),
        as_text(fields[b"last-generated-id"]),
        as_text(first[0]) if first else "",
    )
    return _log_read(bounds, raw, tail, after)


class Push(NamedTuple):
    """A change notification that carries what was appended (see lua/publish.lua).
    (A tuple: one is made per notification, and a frozen dataclass costs three times as
    much to make.)"""

    prev: str  # the id of the entry the appended ones follow
    entries: list[Entry]


def decode_push(message: bytes) -> Push | None:
    """The entries a notification carries; None when it carries none (read the log)."""
    if not message:
        return None
    try:
        newline = message.index(b"\n")
        kind, prev, count = message[:newline].split(b" ")
        pos = newline + 1
        entries: list[Entry] = []
        for _ in range(int(count)):
            newline = message.index(b"\n", pos)
            entry_id, name, size = message[pos:newline].split(b" ")
            pos = newline + 1 + int(size)
            data = message[newline + 1 : pos]
            if kind == b"e":
                entries.append(StreamEvent(entry_id.decode(), name.decode(), data))
            else:
                error = orjson.loads(data) if data else None
                entries.append(End(status=name.decode(), error=error, id=entry_id.decode()))  # type: ignore[arg-type]
    except (ValueError, orjson.JSONDecodeError):
        return None  # not in this format (another version's writer): read the log
    return Push(prev.decode(), entries)
