"""Decoding log entries: the replay's fast path (the layout `lua/publish.lua` writes)
gives what the general path gives, other layouts still decode, and nothing after an END
entry reaches a reader."""

from __future__ import annotations

from typing import Any

from gateway.redis.codec import decode_entries, entry_item, flatten
from gateway.values import End, StreamEvent


def _general(raw: list[Any]) -> list[Any]:
    out = []
    for raw_id, fields in raw:
        item = entry_item(raw_id.decode(), flatten(fields))
        out.append(item)
        if isinstance(item, End):
            break
    return out


def test_the_fast_path_decodes_what_the_general_path_does() -> None:
    raw = [[b"5-%d" % i, [b"e", b"tok\xc3\xa9", b"d", b'{"i":%d}' % i]] for i in range(3)]
    decoded = decode_entries(raw)
    assert decoded == _general(raw)
    assert decoded[1] == StreamEvent("5-1", "toké", b'{"i":1}')


def test_other_layouts_decode_and_nothing_follows_an_end() -> None:
    raw = [
        [b"1-0", [b"d", b"1", b"e", b"a"]],  # another writer's field order
        [b"1-1", {b"e": b"b", b"d": b"2"}],  # a client that parses entries into dicts
        [b"1-2", [b"end", b"success"]],
        [b"1-3", [b"e", b"late", b"d", b"3"]],  # a legacy log's entry after its END
    ]
    assert decode_entries(raw) == [
        StreamEvent("1-0", "a", b"1"),
        StreamEvent("1-1", "b", b"2"),
        End("success", None, "1-2"),
    ]
