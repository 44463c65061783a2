"""Unit tests of gateway.http.edge.auth: API keys, scoped subscriber tokens, open mode."""

from __future__ import annotations

import base64
import contextlib
import hmac
import json
import time
from typing import Any

import jwt
import pytest

from gateway.errors import Forbidden, TokenExpired, Unauthorized
from gateway.http.edge.auth import Authenticator, mint_subscriber_token
from gateway.settings import Settings

pytestmark = pytest.mark.timeout(10)

SECRET = "s" * 64
KEYS = ("key-one", "key-two", "key-three")


def bearer(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


@pytest.fixture
def authn() -> Authenticator:
    return Authenticator(KEYS, SECRET)


# -- API keys ------------------------------------------------------------------------------


@pytest.mark.parametrize("key", KEYS)
def test_every_configured_key_is_a_producer(authn: Authenticator, key: str) -> None:
    principal = authn.authorize_producer(bearer(key))
    assert principal.full_access and principal.kind == "api_key"


@pytest.mark.parametrize(
    "headers",
    [
        {},
        bearer("wrong"),
        bearer("key-one "[:-2]),  # a prefix of a key
        bearer("key-one-and-more"),
        {"Authorization": "Basic a2V5LW9uZQ=="},
        {"Authorization": "Bearer"},
        {"Authorization": "key-one"},
        bearer("ключ"),  # non-ASCII never raises TypeError
    ],
)
def test_bad_producer_credentials_are_401(authn: Authenticator, headers: dict[str, str]) -> None:
    with pytest.raises(Unauthorized) as info:
        authn.authorize_producer(headers)
    assert info.value.code == "unauthorized"


def test_header_name_and_scheme_are_case_insensitive(authn: Authenticator) -> None:
    assert authn.authorize_producer({"authorization": "bearer key-two"}).full_access
    assert authn.authorize_producer({"AUTHORIZATION": "BEARER key-two"}).full_access


@pytest.mark.parametrize("presented", ["key-one", "key-three", "nope"])
def test_key_check_compares_against_every_key_in_constant_time(
    monkeypatch: pytest.MonkeyPatch, authn: Authenticator, presented: str
) -> None:
    calls: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    with contextlib.suppress(Unauthorized):
        authn.authorize_producer(bearer(presented))
    # No early exit on a match, and equal-length digests (no length leak).
    assert calls == [(32, 32)] * len(KEYS)


def test_subscriber_token_is_not_a_producer_credential(authn: Authenticator) -> None:
    token = mint_subscriber_token(SECRET, runs=["a"])
    with pytest.raises(Forbidden):
        authn.authorize_producer(bearer(token))


def test_operator_routes_use_api_keys(authn: Authenticator) -> None:
    assert authn.authorize_operator(bearer("key-one")).full_access
    with pytest.raises(Unauthorized):
        authn.authorize_operator({})


# -- subscriber tokens ---------------------------------------------------------------------


def test_api_key_reads_any_run_and_session(authn: Authenticator) -> None:
    authn.authorize_subscriber(bearer("key-one"), {}, "run-a", None)
    authn.authorize_session_reader(bearer("key-one"), {}, "any-session")


def test_run_scoped_token_reads_its_run_only(authn: Authenticator) -> None:
    token = mint_subscriber_token(SECRET, runs=["run-a"])
    principal = authn.authorize_subscriber(bearer(token), {}, "run-a", None)
    assert not principal.full_access and principal.runs == {"run-a"}
    with pytest.raises(Forbidden) as info:
        authn.authorize_subscriber(bearer(token), {}, "run-b", None)
    assert info.value.code == "forbidden"
    with pytest.raises(Forbidden):  # nor any session's turns
        authn.authorize_session_reader(bearer(token), {}, "s1")


def test_session_scoped_token_reads_runs_of_its_session(authn: Authenticator) -> None:
    token = mint_subscriber_token(SECRET, sessions=["s1"])
    authn.authorize_subscriber(bearer(token), {}, "any-run", "s1")
    authn.authorize_session_reader(bearer(token), {}, "s1")
    with pytest.raises(Forbidden):
        authn.authorize_subscriber(bearer(token), {}, "any-run", "s2")
    with pytest.raises(Forbidden):
        authn.authorize_subscriber(bearer(token), {}, "any-run", None)
    with pytest.raises(Forbidden):
        authn.authorize_session_reader(bearer(token), {}, "s2")


def test_token_with_runs_and_sessions(authn: Authenticator) -> None:
    token = mint_subscriber_token(SECRET, runs=["r1"], sessions=["s1"])
    authn.authorize_subscriber(bearer(token), {}, "r1", None)
    authn.authorize_subscriber(bearer(token), {}, "r2", "s1")
    with pytest.raises(Forbidden):
        authn.authorize_subscriber(bearer(token), {}, "r2", "s2")


def test_token_in_query_parameter(authn: Authenticator) -> None:
    token = mint_subscriber_token(SECRET, runs=["run-a"])
    authn.authorize_subscriber({}, {"access_token": token}, "run-a", None)
    with pytest.raises(Forbidden):
        authn.authorize_subscriber({}, {"access_token": token}, "run-b", None)


def test_header_wins_over_query_parameter(authn: Authenticator) -> None:
    a = mint_subscriber_token(SECRET, runs=["run-a"])
    b = mint_subscriber_token(SECRET, runs=["run-b"])
    with pytest.raises(Forbidden):
        authn.authorize_subscriber(bearer(a), {"access_token": b}, "run-b", None)


def test_api_key_is_not_accepted_in_the_url(authn: Authenticator) -> None:
    with pytest.raises(Unauthorized):
        authn.authorize_subscriber({}, {"access_token": "key-one"}, "run-a", None)


def test_missing_subscriber_credentials_are_401(authn: Authenticator) -> None:
    with pytest.raises(Unauthorized) as info:
        authn.authorize_subscriber({}, {}, "run-a", None)
    assert info.value.code == "unauthorized"
    with pytest.raises(Unauthorized):
        authn.authorize_subscriber({}, {"access_token": ""}, "run-a", None)


def test_expired_token_is_401_token_expired(authn: Authenticator) -> None:
    token = mint_subscriber_token(SECRET, runs=["run-a"], ttl_seconds=60, now=time.time() - 120)
    with pytest.raises(TokenExpired) as info:
        authn.authorize_subscriber(bearer(token), {}, "run-a", None)
    assert info.value.code == "token_expired"
    assert isinstance(info.value, Unauthorized)


def test_token_without_exp_is_refused(authn: Authenticator) -> None:
    token = jwt.encode({"runs": ["run-a"]}, SECRET, algorithm="HS256")
    with pytest.raises(Unauthorized) as info:
        authn.authorize_subscriber(bearer(token), {}, "run-a", None)
    assert info.value.code == "unauthorized"


def test_token_signed_with_another_secret_is_401(authn: Authenticator) -> None:
    token = mint_subscriber_token("x" * 64, runs=["run-a"])
    with pytest.raises(Unauthorized) as info:
        authn.authorize_subscriber(bearer(token), {}, "run-a", None)
    assert info.value.code == "unauthorized"


def _b64(value: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()


def test_alg_none_is_refused(authn: Authenticator) -> None:
    claims = {"runs": ["run-a"], "exp": int(time.time()) + 600}
    unsigned = f"{_b64({'alg': 'none', 'typ': 'JWT'})}.{_b64(claims)}."
    with pytest.raises(Unauthorized):
        authn.authorize_subscriber(bearer(unsigned), {}, "run-a", None)
    with pytest.raises(Unauthorized):
        authn.authorize_subscriber({}, {"access_token": unsigned}, "run-a", None)


@pytest.mark.parametrize("alg", ["HS256", "HS384", "HS512"])
def test_hmac_algorithms_are_accepted(authn: Authenticator, alg: str) -> None:
    token = jwt.encode({"runs": ["r"], "exp": int(time.time()) + 60}, SECRET, algorithm=alg)
    authn.authorize_subscriber(bearer(token), {}, "r", None)


@pytest.mark.parametrize("claims", [{"runs": "run-a"}, {"runs": [1]}, {"sessions": {"s": 1}}])
def test_malformed_scope_claims_are_401(authn: Authenticator, claims: dict[str, Any]) -> None:
    token = jwt.encode({**claims, "exp": int(time.time()) + 60}, SECRET, algorithm="HS256")
    with pytest.raises(Unauthorized):
        authn.authorize_subscriber(bearer(token), {}, "run-a", None)


def test_token_without_scope_reads_nothing(authn: Authenticator) -> None:
    token = mint_subscriber_token(SECRET)
    with pytest.raises(Forbidden):
        authn.authorize_subscriber(bearer(token), {}, "run-a", "s1")


def test_tokens_need_a_secret() -> None:
    keys_only = Authenticator(KEYS, None)
    token = mint_subscriber_token(SECRET, runs=["run-a"])
    with pytest.raises(Unauthorized):
        keys_only.authorize_subscriber(bearer(token), {}, "run-a", None)


def test_tokens_only_deployment_has_no_producer_access() -> None:
    tokens_only = Authenticator((), SECRET)
    assert not tokens_only.open_mode
    with pytest.raises(Unauthorized):
        tokens_only.authorize_producer({})
    token = mint_subscriber_token(SECRET, runs=["run-a"])
    tokens_only.authorize_subscriber({}, {"access_token": token}, "run-a", None)


# -- open mode -----------------------------------------------------------------------------


def test_open_mode_allows_everything() -> None:
    open_authn = Authenticator.from_settings(Settings.model_validate({}))
    assert open_authn.open_mode
    assert open_authn.authorize_producer({}).kind == "open"
    open_authn.authorize_subscriber({}, {}, "any", None)
    open_authn.authorize_session_reader({}, {}, "any")


def test_from_settings_uses_keys_and_secret() -> None:
    authn = Authenticator.from_settings(
        Settings.model_validate({"api_keys": ("k1",), "jwt_secret": SECRET})
    )
    assert not authn.open_mode
    authn.authorize_producer(bearer("k1"))
    with pytest.raises(Unauthorized):
        authn.authorize_producer(bearer("k2"))


def test_mint_rejects_non_hmac_algorithms() -> None:
    with pytest.raises(ValueError):
        mint_subscriber_token(SECRET, runs=["r"], algorithm="none")  # type: ignore[arg-type]


# -- secret rotation: a list of verification secrets, newest first -------------------------

OLD_SECRET = "o" * 48
OLDER_SECRET = "p" * 48


def test_a_token_signed_with_a_previous_secret_is_still_accepted() -> None:
    rotated = Authenticator(KEYS, SECRET, previous_secrets=(OLD_SECRET, OLDER_SECRET))
    for secret in (SECRET, OLD_SECRET, OLDER_SECRET):
        token = mint_subscriber_token(secret, runs=["r1"], subject="reader")
        principal = rotated.authorize_subscriber(bearer(token), {}, "r1")
        assert principal.runs == {"r1"} and principal.subject == "reader"
    # Once a secret is dropped from the list, its tokens are refused.
    dropped = Authenticator(KEYS, SECRET, previous_secrets=(OLD_SECRET,))
    with pytest.raises(Unauthorized):
        dropped.authorize_subscriber(
            bearer(mint_subscriber_token(OLDER_SECRET, runs=["r1"])), {}, "r1"
        )
    # Without the list (a rotation with a cliff), the old token is refused at once.
    with pytest.raises(Unauthorized):
        Authenticator(KEYS, SECRET).authorize_subscriber(
            bearer(mint_subscriber_token(OLD_SECRET, runs=["r1"])), {}, "r1"
        )


def test_an_expired_token_of_a_previous_secret_says_expired() -> None:
    rotated = Authenticator(KEYS, SECRET, previous_secrets=(OLD_SECRET,))
    token = mint_subscriber_token(OLD_SECRET, runs=["r1"], ttl_seconds=1, now=time.time() - 60)
    with pytest.raises(TokenExpired):
        rotated.authorize_subscriber(bearer(token), {}, "r1")


def test_rotation_is_read_from_settings() -> None:
    settings = Settings(jwt_secret=SECRET, jwt_previous_secrets=(OLD_SECRET,))
    authn = Authenticator.from_settings(settings)
    token = mint_subscriber_token(OLD_SECRET, sessions=["s1"])
    assert authn.authorize_session_reader(bearer(token), {}, "s1").sessions == {"s1"}


# -- who holds a stream: the per-reader share key ------------------------------------------


def test_share_keys_name_the_reader() -> None:
    authn = Authenticator(KEYS, SECRET)
    keyed = {authn.authenticate_subscriber(bearer(key), {}).share_key for key in KEYS}
    assert len(keyed) == len(KEYS) and None not in keyed  # one per API key
    assert authn.authorize_producer(bearer(KEYS[0])).share_key in keyed
    # Tokens of one subject share one key, whatever else differs.
    one = mint_subscriber_token(SECRET, runs=["r1"], subject="alice")
    two = mint_subscriber_token(SECRET, sessions=["s1"], subject="alice", ttl_seconds=60)
    first = authn.authenticate_subscriber({}, {"access_token": one}).share_key
    assert first == authn.authenticate_subscriber(bearer(two), {}).share_key
    assert first not in keyed
    # A token without a subject is a reader of its own.
    anonymous = [mint_subscriber_token(SECRET, runs=["r1"], ttl_seconds=t) for t in (60, 61)]
    keys = {authn.authenticate_subscriber(bearer(t), {}).share_key for t in anonymous}
    assert len(keys) == 2 and first not in keys and None not in keys
    # Open mode names nobody: only the connection cap applies.
    assert Authenticator().authenticate_subscriber({}, {}).share_key is None
