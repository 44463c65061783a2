"""`X-Api-Key` beside `Authorization: Bearer`: what the LangGraph SDK's `api_key=` sends.

Same keys, same rules: an API key in either header grants every route; a subscriber
token in it reads only its scope; the Authorization header wins when both are present;
an empty or unknown one is 401; keys are still never accepted in the URL.
"""

from __future__ import annotations

import anyio
import httpx
import pytest
from langgraph_sdk import get_client

from gateway.errors import Forbidden, Unauthorized
from gateway.http.edge.auth import Authenticator, mint_subscriber_token
from tests.support import http_server
from tests.support.http_server import RunningServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(40)]
gateway_server = http_server.gateway_server

KEY = "k" * 40
SECRET = "s" * 64


def test_x_api_key_is_an_api_key() -> None:
    authn = Authenticator([KEY], SECRET)
    assert authn.authorize_producer({"x-api-key": KEY}).kind == "api_key"
    assert authn.authenticate_subscriber({"X-Api-Key": KEY}, {}).full_access
    with pytest.raises(Unauthorized):
        authn.authorize_producer({"x-api-key": "wrong"})
    with pytest.raises(Unauthorized):
        authn.authorize_producer({"x-api-key": "  "})


def test_authorization_header_wins_over_x_api_key() -> None:
    authn = Authenticator([KEY], SECRET)
    with pytest.raises(Unauthorized):
        authn.authorize_producer({"authorization": "Bearer wrong", "x-api-key": KEY})


def test_token_in_x_api_key_keeps_its_scope() -> None:
    authn = Authenticator([KEY], SECRET)
    token = mint_subscriber_token(SECRET, runs=["a"])
    principal = authn.authorize_subscriber({"x-api-key": token}, {}, "a")
    assert not principal.full_access
    with pytest.raises(Forbidden):
        authn.authorize_subscriber({"x-api-key": token}, {}, "b")
    with pytest.raises(Forbidden):  # never a producer credential
        authn.authorize_producer({"x-api-key": token})


@pytest.mark.gateway_settings(api_keys=(KEY,), jwt_secret=SECRET)
async def test_langgraph_sdk_api_key_joins_a_run(gateway_server: RunningServer) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=gateway_server.base_url, timeout=10) as http:
        claim = (await http.post("/v1/runs", json={"session_id": "t"}, headers=headers)).json()
        run_id, token = claim["run_id"], claim["producer_token"]
        produce = {"x-api-key": KEY, "X-Producer-Token": token}  # the producer side too
        posted = await http.post(
            f"/v1/runs/{run_id}/events", json={"event": "values", "data": {"i": 1}}, headers=produce
        )
        assert posted.status_code == 200, posted.text
        ended = await http.post(
            f"/v1/runs/{run_id}/end", json={"status": "success"}, headers=produce
        )
        assert ended.status_code == 200, ended.text
        refused = await http.get(f"/v1/runs/{run_id}", headers={"x-api-key": "wrong"})
        assert refused.status_code == 401 and refused.json()["error"] == "unauthorized"
    async with get_client(url=gateway_server.base_url, api_key=KEY) as sdk:
        with anyio.fail_after(15):
            parts = [part async for part in sdk.runs.join_stream("t", run_id)]
    assert [p.event for p in parts] == ["values", "end"]
    assert parts[0].data == {"i": 1}
