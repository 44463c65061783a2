"""The exception tree: drawn whole in `gateway.errors`, answered by one table (offline)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import gateway
from gateway import errors as E
from gateway.cli import ConfigError
from gateway.cursor import MalformedCursor
from gateway.http.edge.errors import (
    RULES,
    HttpError,
    RunEndedOnClaim,
    gateway_error_response,
    public_detail,
    rule_of,
)


def _all_subclasses(cls: type) -> set[type]:
    found = set(cls.__subclasses__())
    for sub in list(found):
        found |= _all_subclasses(sub)
    return found


def _gateway_errors() -> set[type]:
    for module in pkgutil.walk_packages(gateway.__path__, "gateway."):
        importlib.import_module(module.name)
    return {c for c in _all_subclasses(E.GatewayError) if c.__module__.startswith("gateway.")}


def test_every_error_class_is_drawn_in_the_tree() -> None:
    tree = E.__doc__ or ""
    branches = (line.lstrip("│ ") for line in tree.splitlines())
    drawn = {line.split()[1] for line in branches if line.startswith(("├", "└"))}
    expected = {c.__name__ for c in _gateway_errors()} | {
        "GatewayError",
        "HttpError",
        "ConfigError",
    }
    assert expected <= drawn, f"not drawn: {sorted(expected - drawn)}"
    assert len(expected) > 14  # the walk found the classes outside gateway.errors too


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (E.InvalidInput("x"), 422, "invalid_input"),
        (MalformedCursor("x"), 422, "malformed_cursor"),
        (E.PayloadTooLarge("x"), 413, "too_large"),
        (E.RunNotFound("x"), 404, "run_not_found"),
        (E.ProducerFenced("x"), 409, "fenced"),
        (E.RunOwned("x"), 409, "run_owned"),
        (E.StreamEnded("x"), 409, "ended"),
        (RunEndedOnClaim("x"), 409, "run_ended"),
        (E.SessionActive("x"), 409, "session_active"),
        (E.BridgeClosed("x"), 503, "bridge_closed"),
        (E.BackendUnavailable("x"), 503, "backend_unavailable"),
        (E.Unauthorized("x"), 401, "unauthorized"),
        (E.TokenExpired("x"), 401, "token_expired"),
        (E.Forbidden("x"), 403, "forbidden"),
        (E.GatewayError("x"), 500, "gateway_error"),
    ],
)
def test_status_of_each_error(exc: E.GatewayError, status: int, code: str) -> None:
    response = gateway_error_response(exc)
    assert response.status_code == status
    # Backend failures show clients a generic detail (the cause, with addresses, is logged).
    detail = public_detail(exc).encode()
    assert detail == b"x" or status == 503
    assert response.body == b'{"error":"%s","detail":"%s"}' % (code.encode(), detail)


@pytest.mark.parametrize(
    ("exc", "code"),
    [(E.SequenceGap("x", 3), "sequence_gap"), (E.SequenceConflict("x", 3), "sequence_conflict")],
)
def test_sequence_errors_are_409_with_the_expected_number(
    exc: E.SequenceRefused, code: str
) -> None:
    response = gateway_error_response(exc)
    assert response.status_code == 409
    assert response.body == b'{"error":"%s","detail":"x","expected_seq":3}' % code.encode()


def test_headers_come_from_the_table() -> None:
    assert gateway_error_response(E.BackendUnavailable()).headers["retry-after"] == "1"
    assert gateway_error_response(E.BridgeClosed()).headers["retry-after"] == "1"
    assert gateway_error_response(E.TokenExpired()).headers["www-authenticate"] == "Bearer"
    assert "retry-after" not in gateway_error_response(E.RunOwned()).headers


def test_a_class_without_a_row_answers_like_its_nearest_ancestor() -> None:
    class NewKindOfEnd(RunEndedOnClaim):
        code = "new_kind"

    class TooLargeToo(E.PayloadTooLarge):
        pass

    assert NewKindOfEnd not in RULES and rule_of(NewKindOfEnd()) is RULES[RunEndedOnClaim]
    assert rule_of(TooLargeToo()).status == 413
    assert rule_of(MalformedCursor()) is RULES[E.InvalidInput]


def test_only_writes_after_end_count_as_such() -> None:
    # The metric counts writes refused by END; a claim of an ended run is not one.
    assert rule_of(E.StreamEnded()).signal == "write_after_end"
    assert rule_of(RunEndedOnClaim()).signal is None
    assert rule_of(E.ProducerFenced()).signal == "fenced_write"
    assert rule_of(E.BackendUnavailable()).signal == "backend_unavailable"


def test_http_and_config_errors_stand_outside_the_gateway_tree() -> None:
    assert not issubclass(HttpError, E.GatewayError)
    assert not issubclass(ConfigError, E.GatewayError)
