"""Pure parts of the sessions store: operator-message shaping (docs/protocol.md §6),
turn-record evolution (`turns.py`) and the `limit`/`parked` validators."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from gateway.errors import InvalidInput
from gateway.sessions import turns as T
from gateway.sessions.base import parse_flag, parse_limit
from gateway.sessions.shaping import TEXT_CAP, shape_input_message

pytestmark = pytest.mark.timeout(10)


def msg(*parts: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"messageId": "m-1", "role": "user", "parts": list(parts), **extra}


def text(t: str) -> dict[str, Any]:
    return {"kind": "text", "text": t}


def texts_of(shaped: dict[str, Any]) -> list[str]:
    return [p["text"] for p in shaped["parts"] if p["kind"] == "text"]


# -- shaping --------------------------------------------------------------------------


def test_ids_role_and_text_are_kept_and_nothing_else() -> None:
    shaped = shape_input_message(
        msg(
            text("hello"),
            contextId="ctx",
            taskId="task",
            extensions=["x"],
            referenceTaskIds=["a"],
            secret="s",
        )
    )
    assert shaped == {
        "kind": "message",
        "messageId": "m-1",
        "contextId": "ctx",
        "taskId": "task",
        "role": "user",
        "parts": [{"kind": "text", "text": "hello"}],
    }


def test_metadata_whitelist() -> None:
    shaped = shape_input_message(
        msg(
            text("hi"),
            metadata={
                "incognito": True,
                "hitl_resume": {"request": "r1"},
                "hidden": False,
                "display": "shown",
                "model": "big",
                "api_key": "nope",
            },
        )
    )
    assert shaped is not None
    assert shaped["metadata"] == {
        "incognito": True,
        "hitl_resume": {"request": "r1"},
        "hidden": False,
    }
    assert "metadata" not in shape_input_message(msg(text("hi"), metadata={"model": "x"}))  # type: ignore[operator]


def test_oversized_metadata_value_is_dropped() -> None:
    shaped = shape_input_message(msg(text("hi"), metadata={"hitl_resume": "x" * 5000}))
    assert shaped is not None and "metadata" not in shaped


def test_text_capped_at_16000_in_total() -> None:
    shaped = shape_input_message(msg(text("a" * 10_000), text("b" * 10_000), text("c")))
    assert shaped is not None
    assert texts_of(shaped) == ["a" * 10_000, "b" * 6_000]
    assert sum(map(len, texts_of(shaped))) == TEXT_CAP == 16_000
    exact = shape_input_message(msg(text("é" * 16_000)))
    assert exact is not None and texts_of(exact) == ["é" * 16_000]


def test_display_replaces_the_text() -> None:
    shaped = shape_input_message(
        msg(
            text("<document dump> " * 100),
            text("what does it say?"),
            {
                "kind": "file",
                "file": {
                    "name": "a.pdf",
                    "mimeType": "application/pdf",
                    "uri": "https://x.test/a.pdf",
                },
            },
            metadata={"display": "what does it say?", "incognito": False},
        )
    )
    assert shaped is not None
    assert texts_of(shaped) == ["what does it say?"]
    assert shaped["parts"][0] == text("what does it say?")
    assert shaped["parts"][1]["file"]["name"] == "a.pdf"
    assert shaped["metadata"] == {"incognito": False}  # display itself is not stored
    capped = shape_input_message(msg(text("x"), metadata={"display": "d" * 20_000}))
    assert capped is not None and texts_of(capped) == ["d" * 16_000]


def test_top_level_display_is_ignored() -> None:
    shaped = shape_input_message(msg(text("real"), display="fake"))
    assert shaped is not None and texts_of(shaped) == ["real"]


def test_hidden_stores_the_message_without_text() -> None:
    shaped = shape_input_message(
        msg(text("approve"), metadata={"hidden": True, "incognito": True, "display": "d"})
    )
    assert shaped == {
        "kind": "message",
        "messageId": "m-1",
        "role": "user",
        "parts": [],
        "metadata": {"incognito": True, "hidden": True},
    }


@pytest.mark.parametrize("origin", ["scheduler", "watch", {"kind": "resume"}, False, 0])
def test_server_fired_turn_stores_none(origin: Any) -> None:
    assert shape_input_message(msg(text("machine text"), metadata={"origin": origin})) is None


def test_null_origin_is_not_server_fired() -> None:
    assert shape_input_message(msg(text("hi"), metadata={"origin": None})) is not None


def test_file_parts_become_shells() -> None:
    raw = b"\x00\x01" * 1000  # 2000 bytes
    b64 = base64.b64encode(raw).decode()
    shaped = shape_input_message(
        msg(
            {
                "kind": "file",
                "file": {
                    "name": "link.txt",
                    "mimeType": "text/plain",
                    "uri": "https://files.example/a?b=1",
                    "extra": 1,
                },
            },
            {
                "kind": "file",
                "file": {"name": "inline.bin", "mimeType": "application/x", "bytes": b64},
            },
            {"kind": "file", "file": {"name": "d.png", "uri": "data:image/png;base64," + b64}},
            {"kind": "file", "file": {"name": "t.txt", "uri": "data:,hello%20world"}},
            {"kind": "file", "file": {"name": "b", "uri": "blob:https://app.test/1234"}},
            {"kind": "file", "file": {"name": "j", "uri": "javascript:alert(1)"}},
            {"kind": "file", "file": {"name": "f", "uri": "file:///etc/passwd"}},
            {"kind": "file", "file": {"name": "ws", "uri": "https://x.test/a b"}},
            {"kind": "data", "data": {"k": "v" * 100}},
            {"kind": "mystery", "payload": "x"},
        )
    )
    assert shaped is not None
    files = [p for p in shaped["parts"]]
    assert files[0] == {
        "kind": "file",
        "file": {
            "name": "link.txt",
            "mimeType": "text/plain",
            "uri": "https://files.example/a?b=1",
        },
    }
    assert files[1] == {
        "kind": "file",
        "file": {"name": "inline.bin", "mimeType": "application/x", "omittedBytes": 2000},
    }
    assert files[2] == {"kind": "file", "file": {"name": "d.png", "omittedBytes": 2000}}
    assert files[3] == {"kind": "file", "file": {"name": "t.txt", "omittedBytes": 11}}
    assert files[4] == {"kind": "file", "file": {"name": "b"}}
    assert files[5] == {"kind": "file", "file": {"name": "j"}}
    assert files[6] == {"kind": "file", "file": {"name": "f"}}
    assert files[7] == {"kind": "file", "file": {"name": "ws"}}
    assert files[8] == {"kind": "data", "omittedBytes": len(b'{"k":"' + b"v" * 100 + b'"}')}
    assert len(files) == 9  # the unknown kind is dropped
    for part in files:
        assert "bytes" not in part.get("file", {}) and "data" not in part


@pytest.mark.parametrize(
    "bad",
    [
        None,
        "hello",
        [],
        {"role": "user"},  # no parts
        {"role": "user", "parts": "text"},
        {"parts": []},  # no role
        {"role": 7, "parts": []},
        {"role": "user", "parts": [], "messageId": 5},
        {"role": "user", "parts": [], "messageId": "m" * 300},
        {"role": "user", "parts": [], "metadata": ["hidden"]},
        {"role": "user", "parts": ["hi"]},
        {"role": "user", "parts": [{"kind": "text", "text": 5}]},
        {"role": "user", "parts": [{"kind": "file", "file": "https://x"}]},
        {"role": "user", "parts": [{"kind": "data", "data": object()}]},
    ],
)
def test_unshapeable_messages_return_none(bad: Any) -> None:
    assert shape_input_message(bad) is None


def test_shaped_message_is_detached_from_the_input() -> None:
    original = msg(text("hi"), metadata={"hitl_resume": {"a": [1]}})
    shaped = shape_input_message(original)
    original["metadata"]["hitl_resume"]["a"].append(2)
    original["parts"][0]["text"] = "changed"
    assert shaped is not None
    assert shaped["metadata"]["hitl_resume"] == {"a": [1]}
    assert texts_of(shaped) == ["hi"]


# -- turn evolution -----------------------------------------------------------------------


def test_turn_evolution_from_events() -> None:
    turn = T.new_turn("s", "r", None, 1.0)
    assert T.apply_events(
        turn,
        [
            ("token", {"text": "Hel"}),
            ("text-delta", "lo"),
            ("unrelated", {"text": "ignored"}),
            ("artifact", {"artifactId": "a1", "parts": [text("v1")]}),
            ("artifact", {"artifactId": "a2", "parts": []}),
            ("artifact", {"artifactId": "a1", "parts": [text("v2")]}),
            ("status", {"state": "input-required", "message": {"x": 1}}),
            ("history", {"role": "user", "parts": [text("steer")]}),
        ],
        2.0,
    )
    assert turn["text"] == "Hello"
    assert turn["artifacts"] == [
        {"artifactId": "a1", "parts": [text("v2")]},
        {"artifactId": "a2", "parts": []},
    ]
    assert turn["status"] == {"state": "input-required", "message": {"x": 1}}
    assert turn["state"] == "input-required"
    assert turn["history"] == [{"role": "user", "parts": [text("steer")]}]
    assert turn["last_updated"] == 2.0
    assert T.apply_events(turn, [("state", {"state": "running"})], 3.0)
    assert turn["state"] == "running"
    assert not T.apply_events(turn, [("state", "bogus"), ("token", 5)], 4.0)
    assert turn["last_updated"] == 3.0
    assert T.apply_events(turn, [("text-set", {"text": "final"})], 5.0)
    assert turn["text"] == "final"


def test_end_is_terminal_and_sticky() -> None:
    turn = T.new_turn("s", "r", None, 1.0)
    assert T.end_turn(turn, "success", 2.0)
    assert turn["state"] == "success"
    assert not T.end_turn(turn, "error", 3.0)
    assert not T.apply_events(turn, [("token", "late"), ("state", "running")], 4.0)
    assert turn["state"] == "success" and turn["text"] == ""


def test_turn_caps() -> None:
    limits = T.TurnLimits(max_text_chars=10, max_artifacts=2, max_history=1, max_item_bytes=100)
    turn = T.new_turn("s", "r", None, 1.0)
    T.apply_events(turn, [("token", "x" * 8), ("token", "y" * 8)], 2.0, limits)
    assert turn["text"] == "x" * 8 + "yy" and turn["truncated"]
    T.apply_events(turn, [("artifact", {"n": i}) for i in range(5)], 3.0, limits)
    assert turn["artifacts"] == [{"n": 0}, {"n": 1}]
    T.apply_events(turn, [("artifact", {"artifactId": "big", "x": "z" * 200})], 4.0, limits)
    assert len(turn["artifacts"]) == 2
    T.apply_events(turn, [("history", {"a": 1}), ("history", {"b": 2})], 5.0, limits)
    assert turn["history"] == [{"a": 1}]


def test_stored_event_data_is_detached() -> None:
    turn = T.new_turn("s", "r", None, 1.0)
    artifact: dict[str, Any] = {"artifactId": "a", "parts": []}
    T.apply_events(turn, [("artifact", artifact)], 2.0)
    artifact["parts"].append("mutated")
    assert turn["artifacts"] == [{"artifactId": "a", "parts": []}]


# -- validators ----------------------------------------------------------------------------


@pytest.mark.parametrize("value,expected", [(None, 50), ("1", 1), ("200", 200), (37, 37)])
def test_parse_limit_accepts(value: Any, expected: int) -> None:
    assert parse_limit(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        "0",
        "201",
        "-1",
        "+5",
        " 5",
        "5 ",
        "",
        "abc",
        "1e2",
        "٣",
        "5.0",
        0,
        201,
        -3,
        True,
        2.5,
        "0001",
    ],
)
def test_parse_limit_rejects(value: Any) -> None:
    with pytest.raises(InvalidInput):
        parse_limit(value)


def test_parse_flag() -> None:
    assert parse_flag("true") and parse_flag("1") and parse_flag("TRUE")
    assert not parse_flag(None) and not parse_flag("false") and not parse_flag("0")
    with pytest.raises(InvalidInput):
        parse_flag("maybe")


def test_only_turn_events_touch_a_turn() -> None:
    # The HTTP hook skips the store (both backends) when this says no.
    assert not T.touches_turn([("progress", {"step": 1}), ("tool_call", {})])
    assert T.touches_turn([("progress", {}), ("token", {"text": "a"})])
    assert all(T.touches_turn([(name, {})]) for name in T.TURN_EVENTS)
