"""The shipped nginx and haproxy configs keep the gateways private: a per-client
connection cap, and /metrics and /readyz for loopback only (real proxies in front of two
real `gateway serve` processes on one Redis; the fixtures of tests/system/test_deploy.py).

The tests reach the proxy from 127.0.0.1 only. So each limit is checked twice: the
shipped file as is (its numbers and its loopback-only allow-list, read from the file),
and a variant of it with the cap lowered to a few connections, or with an allow-list
that 127.0.0.1 is not on, which must then refuse 127.0.0.1 the way the shipped file
refuses any outside address.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.http_server import ProducerClient
from tests.support.proxies import DEPLOY, GatewayProcess, Proxy
from tests.support.sse_client import Frame, iter_frames
from tests.system import test_deploy
from tests.system.test_deploy import config_lines, next_frame

pytestmark = [pytest.mark.timeout(60), pytest.mark.anyio]
gateways = test_deploy.gateways
proxy_kinds = test_deploy.proxy_kinds
API_KEY = test_deploy.API_KEY
AUTH = {"Authorization": f"Bearer {API_KEY}"}

SHIPPED_CAP = 100  # per client address, in both files
CAP_LINES = {  # the line that sets the cap, in each shipped file
    "nginx": f"limit_conn per_client {SHIPPED_CAP};",
    "haproxy": f"http-request deny deny_status 429 if {{ src_conn_cur gt {SHIPPED_CAP} }}",
}
ALLOW_LINES = {  # who may ask for /metrics and /readyz, in each shipped file
    "nginx": "allow 127.0.0.0/8;\nallow ::1;\ndeny all;",
    "haproxy": "acl internal_client src 127.0.0.0/8 ::1",
}
SOURCES = {"nginx": DEPLOY / "nginx.conf.template", "haproxy": DEPLOY / "haproxy.cfg"}
NOBODY = "192.0.2.1"  # TEST-NET-1: an allow-list holding only this admits no real client
INTERNAL = ["/metrics", "/readyz", "/readyz?verbose=1", "/%6Detrics", "/ready%7A"]


def variant(kind: str, tmp_path: Path, old: str, new: str) -> Path:
    """The shipped file with `old` (one exact occurrence, whitespace aside) made `new`."""
    text = SOURCES[kind].read_text()
    pattern = r"\s+".join(re.escape(part) for part in old.split())
    assert len(re.findall(pattern, text)) == 1, old
    path = tmp_path / SOURCES[kind].name
    path.write_text(re.sub(pattern, new, text))
    return path


# -- static: the shipped numbers and allow-lists -------------------------------------------


@pytest.mark.parametrize("kind", ["nginx", "haproxy"])
def test_the_shipped_configs_cap_each_client_and_keep_probes_internal(kind: str) -> None:
    text = config_lines(SOURCES[kind])
    assert CAP_LINES[kind] in text
    assert ALLOW_LINES[kind] in text
    if kind == "nginx":
        assert "limit_conn_zone $binary_remote_addr zone=per_client:10m;" in text
        assert "limit_conn_status 429;" in text
        # the cap is set for the whole server, not one location
        server = text[text.index("server {") :]
        assert server.index(CAP_LINES[kind]) < server.index("location")
        # the only allow/deny lines are the loopback ones
        assert re.findall(r"^(?:allow|deny) .*$", text, re.M) == ALLOW_LINES[kind].splitlines()
    else:
        assert "stick-table type ipv6 size 1m expire 60s store conn_cur" in text
        assert "tcp-request connection track-sc0 src" in text
        assert "http-request deny deny_status 403 if internal_path !internal_client" in text
        assert "acl internal_path path,url_dec -m str /metrics /readyz" in text


# -- live: the per-client cap --------------------------------------------------------------

SMALL_CAP = 3


async def open_stream(
    stack: AsyncExitStack, client: httpx.AsyncClient, run_id: str
) -> AsyncIterator[Frame]:
    """A stream held open until `stack` closes; its frames (keep them: a frame iterator
    that is collected closes its response)."""
    response = await stack.enter_async_context(client.stream("GET", f"/v1/runs/{run_id}/stream"))
    assert response.status_code == 200
    frames = iter_frames(response)
    assert (await next_frame(frames)).retry is not None
    return frames


@proxy_kinds
async def test_a_client_past_its_connection_cap_is_refused(
    gateways: list[GatewayProcess], kind: str, tmp_path: Path
) -> None:
    """The shipped cap lowered to 3: three open streams from one address, the fourth
    request is 429; once streams close, that address is admitted again."""
    config = variant(kind, tmp_path, CAP_LINES[kind], CAP_LINES[kind].replace("100", "3"))
    async with httpx.AsyncClient(base_url=gateways[0].url, headers=AUTH, timeout=10) as direct:
        runs = [(await ProducerClient.claim(direct)).run_id for _ in range(SMALL_CAP + 1)]
    backends = [g.url for g in gateways]
    with Proxy(kind, backends=backends, config=config) as proxy:  # type: ignore[arg-type]
        async with (
            httpx.AsyncClient(base_url=proxy.url, headers=AUTH, timeout=10) as client,
            AsyncExitStack() as first,
        ):
            held = [await open_stream(first, client, runs[0])]
            async with AsyncExitStack() as rest:
                for run_id in runs[1:SMALL_CAP]:
                    held.append(await open_stream(rest, client, run_id))
                past = await client.get(f"/v1/runs/{runs[SMALL_CAP]}/stream")
                assert past.status_code == 429, past.text
                also = await client.get("/v1/sessions")
                assert also.status_code == 429, also.text
            # Two of the three streams closed: admitted again (the proxy learns of
            # the closed connections within moments).
            with anyio.fail_after(5):
                while (await client.get("/v1/sessions")).status_code == 429:
                    await anyio.sleep(0.02)
            async with client.stream("GET", f"/v1/runs/{runs[SMALL_CAP]}/stream") as again:
                assert again.status_code == 200


# -- live: /metrics and /readyz from inside only --------------------------------------------


async def statuses(proxy: Proxy, paths: list[str]) -> dict[str, int]:
    async with httpx.AsyncClient(base_url=proxy.url, headers=AUTH, timeout=10) as client:
        return {path: (await client.get(path)).status_code for path in paths}


@proxy_kinds
async def test_metrics_and_readyz_are_answered_from_inside_only(
    gateways: list[GatewayProcess], kind: str, tmp_path: Path
) -> None:
    """As shipped, 127.0.0.1 is inside: both pass. With an allow-list 127.0.0.1 is not
    on, it is outside: 403 for each (a percent-encoded path too), the API still served."""
    probe_gateways = [g.url for g in gateways]
    with Proxy(kind, backends=probe_gateways) as proxy:  # type: ignore[arg-type]
        inside = await statuses(proxy, ["/metrics", "/readyz"])
    assert inside == {"/metrics": 200, "/readyz": 200}

    allow = {"nginx": f"allow {NOBODY};\ndeny all;", "haproxy": f"acl internal_client src {NOBODY}"}
    config = variant(kind, tmp_path, ALLOW_LINES[kind], allow[kind])
    with Proxy(kind, backends=probe_gateways, config=config) as proxy:  # type: ignore[arg-type]
        outside = await statuses(proxy, [*INTERNAL, "/healthz", "/v1/sessions"])
    assert outside == {**dict.fromkeys(INTERNAL, 403), "/healthz": 200, "/v1/sessions": 200}
