"""The reconnect-cursor parser (docs/protocol.md §2.2), offline: no I/O, no backend.

`<ms>-<seq>`, ASCII digits only, each component an unsigned 64-bit integer. Everything
else is malformed; `try_parse_cursor` maps malformed (and missing) cursors to None so
that callers can apply the malformed-cursor policy instead of failing.
"""

from __future__ import annotations

import pytest

from gateway.cursor import MalformedCursor, key_of, parse_cursor, try_parse_cursor
from gateway.errors import InvalidInput

UINT64_MAX = 18446744073709551615

MALFORMED = [
    # non-ASCII digits: str.isdigit()/int() accept these, the cursor grammar does not
    pytest.param("\u0661\u0662-3", id="arabic-indic-digits"),
    pytest.param("3-\u0661", id="arabic-indic-seq"),
    pytest.param("\u00b3-1", id="superscript-three"),
    pytest.param("1-\u00b2", id="superscript-two-seq"),
    pytest.param("\uff11\uff12-3", id="fullwidth-digits"),
    pytest.param("12-\uff13", id="fullwidth-seq"),
    pytest.param("\u07c1-1", id="nko-digit"),
    # signs
    pytest.param("+1-2", id="plus-ms"),
    pytest.param("1-+2", id="plus-seq"),
    pytest.param("-1-2", id="minus-ms"),
    pytest.param("1--2", id="minus-seq"),
    # whitespace
    pytest.param(" 1-2", id="leading-space"),
    pytest.param("1-2 ", id="trailing-space"),
    pytest.param("1 -2", id="space-before-dash"),
    pytest.param("1- 2", id="space-after-dash"),
    pytest.param("1-2\n", id="trailing-newline"),
    pytest.param("\t1-2", id="leading-tab"),
    # underscores (int() accepts "1_0")
    pytest.param("1_0-1", id="underscore-ms"),
    pytest.param("1-1_0", id="underscore-seq"),
    # empty / missing parts
    pytest.param("", id="empty"),
    pytest.param("-", id="dash-only"),
    pytest.param("1", id="no-seq"),
    pytest.param("1-", id="empty-seq"),
    pytest.param("-1", id="empty-ms"),
    # extra parts
    pytest.param("1-2-3", id="three-parts"),
    pytest.param("1-2-", id="trailing-dash"),
    # not numbers at all
    pytest.param("abc", id="letters"),
    pytest.param("1a-2", id="letter-in-ms"),
    pytest.param("0x10-1", id="hex"),
    pytest.param("1.5-2", id="decimal-point"),
    pytest.param("1e3-0", id="exponent"),
    pytest.param("$", id="dollar"),
    pytest.param(">", id="greater-than"),
    pytest.param("*", id="star"),
    # oversized / overflowing components
    pytest.param("1" * 40 + "-0", id="40-digit-ms"),
    pytest.param("0-" + "9" * 40, id="40-digit-seq"),
    pytest.param(f"{UINT64_MAX + 1}-0", id="ms-overflow"),
    pytest.param(f"0-{UINT64_MAX + 1}", id="seq-overflow"),
    pytest.param(f"{UINT64_MAX * 10}-0", id="ms-overflow-21-digits"),
    pytest.param("99999999999999999999-0", id="ms-20-nines"),
    pytest.param(f"{UINT64_MAX + 1}-{UINT64_MAX + 1}", id="both-overflow"),
]


@pytest.mark.parametrize("cursor", MALFORMED)
def test_malformed_cursor_is_rejected(cursor: str) -> None:
    with pytest.raises(MalformedCursor):
        parse_cursor(cursor)


@pytest.mark.parametrize("cursor", MALFORMED)
def test_malformed_cursor_is_none_for_try_parse(cursor: str) -> None:
    assert try_parse_cursor(cursor) is None


def test_malformed_cursor_is_invalid_input() -> None:
    # The HTTP layer maps InvalidInput to a 4xx; a malformed cursor is never a 500.
    assert issubclass(MalformedCursor, InvalidInput)
    assert issubclass(MalformedCursor, ValueError)


def test_missing_cursor_is_none() -> None:
    assert try_parse_cursor(None) is None


@pytest.mark.parametrize(
    ("cursor", "expected"),
    [
        pytest.param("0-0", (0, 0), id="zero"),
        pytest.param("0-1", (0, 1), id="zero-ms"),
        pytest.param("1-0", (1, 0), id="zero-seq"),
        pytest.param("1700000000000-0", (1700000000000, 0), id="realistic"),
        pytest.param("1700000000000-42", (1700000000000, 42), id="realistic-seq"),
        pytest.param(f"{UINT64_MAX}-{UINT64_MAX}", (UINT64_MAX, UINT64_MAX), id="uint64-max"),
        pytest.param(f"{UINT64_MAX}-0", (UINT64_MAX, 0), id="uint64-max-ms"),
        pytest.param(f"0-{UINT64_MAX}", (0, UINT64_MAX), id="uint64-max-seq"),
    ],
)
def test_valid_cursor_is_accepted(cursor: str, expected: tuple[int, int]) -> None:
    assert parse_cursor(cursor) == expected
    assert try_parse_cursor(cursor) == expected


def test_parsed_values_are_plain_ints() -> None:
    ms, seq = parse_cursor(f"{UINT64_MAX}-{UINT64_MAX}")
    assert type(ms) is int and type(seq) is int


def test_ordering_is_numeric_not_lexical() -> None:
    assert parse_cursor("9-0") < parse_cursor("10-0")
    assert parse_cursor("1-9") < parse_cursor("1-10")
    assert parse_cursor("2-0") > parse_cursor("1-99999")
    assert parse_cursor("100-0") > parse_cursor("99-0")
    cursors = ["10-0", "9-0", "9-10", "9-9", "100-1", "0-0", f"{UINT64_MAX}-0"]
    assert sorted(cursors, key=parse_cursor) == [
        "0-0",
        "9-0",
        "9-9",
        "9-10",
        "10-0",
        "100-1",
        f"{UINT64_MAX}-0",
    ]


def test_error_message_does_not_echo_huge_input() -> None:
    # A hostile cursor must not be echoed back in full (it ends up in an HTTP body/log).
    huge = "1" * 100_000 + "-0"
    with pytest.raises(MalformedCursor) as info:
        parse_cursor(huge)
    assert len(str(info.value)) < 1_000


@pytest.mark.parametrize(
    "entry_id", ["0-0", "0-1", "1700000000000-0", f"{UINT64_MAX}-{UINT64_MAX}"]
)
def test_key_of_reads_backend_ids_as_the_parser_does(entry_id: str) -> None:
    assert key_of(entry_id) == parse_cursor(entry_id)
