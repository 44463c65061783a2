"""HTTP session routes (gateway/http/routes/sessions.py) on the memory bridge: limits
(4xx), scoped-token isolation, retire/clear, and the producer hooks. The store contract
itself (both backends) is tests/sessions/test_sessions_store.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

import anyio
import httpx
import pytest
from starlette.applications import Starlette

from gateway.bridge.memory import MemoryStreamBridge
from gateway.http.app import create_app
from gateway.http.edge.auth import mint_subscriber_token
from gateway.http.routes import sessions as sessions_routes
from gateway.http.state import gateway_state
from gateway.settings import Settings
from tests.support.http_server import ProducerClient, make_settings, serve
from tests.support.redis_servers import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

TIMEOUT = 10.0
KEY = "operator-key-0123456789"
SECRET = "jwt-secret-0123456789-0123456789-abc"
OP = {"Authorization": f"Bearer {KEY}"}


class _Req:
    """Just enough of a Request for the producer hooks (they only read `app`)."""

    def __init__(self, app: Starlette) -> None:
        self.app = app


@pytest.fixture
async def app() -> AsyncIterator[Starlette]:
    settings = Settings(api_keys=(KEY,), jwt_secret=SECRET)
    bridge = MemoryStreamBridge(settings)
    application = create_app(settings, bridge=bridge)
    if not any(getattr(r, "path", None) == "/v1/sessions" for r in application.routes):
        application.router.routes.extend(sessions_routes.routes)
    try:
        yield application
    finally:
        await bridge.close()


@pytest.fixture
async def client(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        yield c


async def turn(app: Starlette, session: str, run: str, *events: tuple[str, Any]) -> str:
    """A turn written as a producer writes it: through the bridge (which records it)."""
    bridge = gateway_state(cast(Any, _Req(app))).bridge
    claim = await bridge.claim(
        run,
        session_id=session,
        input_message={"messageId": "m", "role": "user", "parts": [{"kind": "text", "text": "q"}]},
    )
    if events:
        await bridge.publish_many(run, list(events), producer_token=claim.token)
    return claim.token


def token(*sessions: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {mint_subscriber_token(SECRET, sessions=sessions)}"}


async def test_index_and_turns(app: Starlette, client: httpx.AsyncClient) -> None:
    with anyio.fail_after(TIMEOUT):
        await turn(app, "s1", "r1", ("token", "hello"))
        await turn(app, "s2", "r2", ("state", "input-required"))
        res = await client.get("/v1/sessions", headers=OP)
        assert res.status_code == 200
        assert [r["session_id"] for r in res.json()["sessions"]] == ["s2", "s1"]
        res = await client.get("/v1/sessions?parked=true&limit=5", headers=OP)
        assert res.json()["sessions"][0]["last_state"] == "input-required"
        assert len(res.json()["sessions"]) == 1
        res = await client.get("/v1/sessions/s1/turns", headers=OP)
        (t,) = res.json()["turns"]
        assert t["text"] == "hello" and t["state"] == "running"
        assert t["history"][0]["parts"] == [{"kind": "text", "text": "q"}]


@pytest.mark.parametrize("limit", ["0", "201", "-1", "x", "", "1.5", "%20"])
async def test_bad_limit_is_4xx(client: httpx.AsyncClient, limit: str) -> None:
    with anyio.fail_after(TIMEOUT):
        for path in ("/v1/sessions", "/v1/sessions/s1/turns"):
            res = await client.get(f"{path}?limit={limit}", headers=OP)
            assert 400 <= res.status_code < 500, (path, limit, res.status_code)
            assert res.json()["error"] == "invalid_input"
        res = await client.get("/v1/sessions?parked=maybe", headers=OP)
        assert 400 <= res.status_code < 500


async def test_scoped_token_isolation(app: Starlette, client: httpx.AsyncClient) -> None:
    with anyio.fail_after(TIMEOUT):
        await turn(app, "mine", "r1", ("token", "a"))
        await turn(app, "theirs", "r2", ("token", "b"))
        headers = token("mine")
        res = await client.get("/v1/sessions", headers=headers)
        assert [r["session_id"] for r in res.json()["sessions"]] == ["mine"]
        assert (await client.get("/v1/sessions/mine/turns", headers=headers)).status_code == 200
        res = await client.get("/v1/sessions/theirs/turns", headers=headers)
        assert res.status_code == 403
        q = mint_subscriber_token(SECRET, sessions=["mine"])
        res = await client.get(f"/v1/sessions/theirs/turns?access_token={q}")
        assert res.status_code == 403
        assert (await client.get("/v1/sessions")).status_code == 401
        # subscribers cannot delete
        assert (await client.delete("/v1/sessions/mine", headers=headers)).status_code in (
            401,
            403,
        )


async def test_clear_409_while_running_then_retire(
    app: Starlette, client: httpx.AsyncClient
) -> None:
    with anyio.fail_after(TIMEOUT):
        producer = await turn(app, "s", "r1", ("token", "streaming"))
        res = await client.delete("/v1/sessions/s?retire=false", headers=OP)
        assert res.status_code == 409 and res.json()["error"] == "session_active"
        bridge = gateway_state(cast(Any, _Req(app))).bridge
        await bridge.publish_end("r1", "success", producer_token=producer)

        res = await client.delete("/v1/sessions/s?retire=false", headers=OP)
        assert res.status_code == 200
        assert res.json() == {"session_id": "s", "retired": False, "removed_runs": ["r1"]}
        await turn(app, "s", "r2", ("token", "again"))
        res = await client.delete("/v1/sessions/s", headers=OP)  # default: retire
        assert res.json()["retired"] is True
        await turn(app, "s", "r3", ("token", "late"))  # a late producer: dropped
        assert (await client.get("/v1/sessions", headers=OP)).json() == {"sessions": []}
        res = await client.get("/v1/sessions/s/turns", headers=OP)
        assert res.status_code == 200 and res.json() == {"turns": []}


async def test_the_turn_record_costs_no_round_trip_of_its_own(
    fresh_redis: RedisServer, key_prefix: str
) -> None:
    # Only what Redis ran tells: each append is one script call that keeps the turn
    # record (no session-store call after it), and an event no turn folds in makes
    # the record cost nothing (publish.lua's own read of the run record only).
    settings = make_settings("redis", fresh_redis.url, key_prefix)
    with serve(settings, "redis") as srv:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=10) as client:
            producer = await ProducerClient.claim(client, session_id="chat-quiet")
            await producer.publish(("progress", {"step": -1}))  # the first write sets TTLs
            with fresh_redis.client() as raw:
                raw.config_resetstat()
                for n in range(20):
                    await producer.publish(("progress", {"step": n}))
                calls = {name: stats["calls"] for name, stats in raw.info("commandstats").items()}
                raw.config_resetstat()
                for _ in range(5):
                    await producer.publish(("token", {"text": "hi"}))
                after = {name: stats["calls"] for name, stats in raw.info("commandstats").items()}
            res = await client.get("/v1/sessions/chat-quiet/turns")
    assert calls["cmdstat_evalsha"] == 20, calls  # one call per append, nothing more
    assert calls["cmdstat_hmget"] == 20, calls  # publish.lua's own read
    assert "cmdstat_hget" not in calls and "cmdstat_exists" not in calls, calls
    assert after["cmdstat_evalsha"] == 5, after  # the append alone
    # the text waits in the log until a read or every 64 entries folds it (turn_fold.lua)
    assert "cmdstat_append" not in after, after
    assert res.json()["turns"][0]["text"] == "hi" * 5
