"""App signing keys (`jwt_app_keys`): an app mints short reader tokens for its own users
with a key of its own (`kid`), never the gateway-wide secret (docs/api.md, "Auth")."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import jwt
import pytest

from gateway.errors import Forbidden, TokenExpired, Unauthorized
from gateway.http.edge.auth import Authenticator, mint_subscriber_token
from gateway.settings import Settings
from tests.support.http_server import RunningServer, make_settings, serve

pytestmark = pytest.mark.timeout(30)

SECRET = "g" * 40  # the gateway-wide secret
APP_A = "a" * 40
APP_B = "b" * 40
SETTINGS: dict[str, Any] = {
    "api_keys": ("producer-key",),
    "jwt_secret": SECRET,
    "jwt_app_keys": (f"app-a:{APP_A}", f"app-b:{APP_B}"),
}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def authn() -> Authenticator:
    return Authenticator.from_settings(Settings.model_validate(SETTINGS))


def app_token(secret: str, kid: str | None, **claims: Any) -> str:
    body: dict[str, Any] = {"exp": int(time.time()) + 600, "sessions": ["chat-1"]}
    body.update(claims)
    body = {k: v for k, v in body.items() if v is not None}
    return jwt.encode(body, secret, headers=None if kid is None else {"kid": kid})


def test_a_kid_token_verifies_only_with_its_own_key(authn: Authenticator) -> None:
    good = mint_subscriber_token(APP_A, sessions=["chat-1"], ttl_seconds=600, kid="app-a")
    principal = authn.authenticate_subscriber(bearer(good), {})
    assert principal.sessions == {"chat-1"} and not principal.full_access
    principal.check_session("chat-1")
    with pytest.raises(Forbidden):
        principal.check_session("chat-2")
    # signed with another app's key, or with the gateway secret, under app-a's kid
    for secret in (APP_B, SECRET):
        with pytest.raises(Unauthorized):
            authn.authenticate_subscriber(bearer(app_token(secret, "app-a")), {})
    # an unknown kid is never tried against the other secrets
    with pytest.raises(Unauthorized, match="unknown key id"):
        authn.authenticate_subscriber(bearer(app_token(SECRET, "app-z")), {})
    # an app key without a kid is no gateway secret
    with pytest.raises(Unauthorized):
        authn.authenticate_subscriber(bearer(app_token(APP_A, None)), {})


def test_app_tokens_are_short_and_name_their_sessions(authn: Authenticator) -> None:
    too_long = app_token(APP_A, "app-a", exp=int(time.time()) + 2 * 3600)
    with pytest.raises(Unauthorized, match="at most"):
        authn.authenticate_subscriber(bearer(too_long), {})
    for claims in ({"sessions": None}, {"sessions": "chat-1"}):
        with pytest.raises(Unauthorized):
            authn.authenticate_subscriber(bearer(app_token(APP_A, "app-a", **claims)), {})
    with pytest.raises(Unauthorized):  # no exp at all
        authn.authenticate_subscriber(bearer(app_token(APP_A, "app-a", exp=None)), {})
    expired = app_token(APP_A, "app-a", exp=int(time.time()) - 5)
    with pytest.raises(TokenExpired):
        authn.authenticate_subscriber(bearer(expired), {})
    # an hour is fine
    hour = mint_subscriber_token(APP_A, sessions=["s"], ttl_seconds=3600, kid="app-a")
    authn.authenticate_subscriber({}, {"access_token": hour})


def test_the_gateway_secret_still_works(authn: Authenticator) -> None:
    # without kid, as before: a day-long token, runs only
    token = mint_subscriber_token(SECRET, runs=["run-a"], ttl_seconds=86_400)
    authn.authorize_subscriber(bearer(token), {}, "run-a", None)
    with pytest.raises(Forbidden):  # never a producer credential, kid or not
        authn.authorize_producer(bearer(token))
    app = mint_subscriber_token(APP_A, sessions=["s"], ttl_seconds=60, kid="app-a")
    with pytest.raises(Forbidden):
        authn.authorize_producer(bearer(app))


def test_app_keys_settings() -> None:
    only_apps = Settings.model_validate({"jwt_app_keys": (f"app:{APP_A}",)})
    assert only_apps.authenticated  # not open mode
    assert not Authenticator.from_settings(only_apps).open_mode
    for bad in (
        ("no-colon",),
        (f":{APP_A}",),
        (f"bad kid:{APP_A}",),
        ("app:short",),
        (f"app:{APP_A}", f"app:{APP_B}"),
    ):
        with pytest.raises(ValueError):
            Settings.model_validate({"jwt_app_keys": bad})
    assert APP_A not in repr(only_apps)


@pytest.fixture
def server(key_prefix: str) -> Iterator[RunningServer]:
    with serve(make_settings("memory", None, key_prefix, **SETTINGS)) as srv:
        yield srv


@pytest.mark.anyio
async def test_an_app_token_reads_its_session_over_http(server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as client:
        producer = {"Authorization": "Bearer producer-key"}
        claim = await client.post("/v1/runs", json={"session_id": "chat-1"}, headers=producer)
        assert claim.status_code == 201
        run_id = claim.json()["run_id"]
        mine = mint_subscriber_token(APP_A, sessions=["chat-1"], ttl_seconds=300, kid="app-a")
        other = mint_subscriber_token(APP_A, sessions=["chat-2"], ttl_seconds=300, kid="app-a")
        long = app_token(APP_A, "app-a", exp=int(time.time()) + 7200)
        assert (await client.get(f"/v1/runs/{run_id}", headers=bearer(mine))).status_code == 200
        turns = await client.get("/v1/sessions/chat-1/turns", params={"access_token": mine})
        assert turns.status_code == 200
        assert (await client.get(f"/v1/runs/{run_id}", headers=bearer(other))).status_code == 403
        refused = await client.get(f"/v1/runs/{run_id}", headers=bearer(long))
        assert refused.status_code == 401 and refused.json()["error"] == "unauthorized"
        legacy = mint_subscriber_token(SECRET, sessions=["chat-1"])
        assert (await client.get(f"/v1/runs/{run_id}", headers=bearer(legacy))).status_code == 200
