"""The gateway on a Redis that takes TLS only, with AUTH and client certificates.

A real `redis-server` with `--tls-port` (no plain port), `--requirepass` and
`--tls-auth-clients yes`, behind a throwaway CA (tests/support/tls.py); `gateway serve`
processes given `--redis-url rediss://:<password>@host:port/0?ssl_ca_certs=…&ssl_certfile=…&
ssl_keyfile=…`, the form docs/operations.md documents. A run is served end to end, change
notifications included (their own connections), on one server and on a (one-node) Redis
Cluster (`rediss+cluster://`). A wrong password or a missing CA is a clear readiness
failure whose messages never carry the password; the read-only audit command takes the
same URL.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

import httpx
import pytest

from gateway.audit import EXIT_NOT_SAFE, EXIT_REDIS_ERROR, EXIT_SAFE_AFTER, EXIT_SAFE_NOW
from tests.support.http_server import ProducerClient
from tests.support.proxies import GatewayProcess, wait_until
from tests.support.redis_servers import RedisServer
from tests.support.sse_client import iter_frames
from tests.support.tls import TlsFiles, make_tls_files
from tests.system.test_deploy import next_event, next_frame

pytestmark = [pytest.mark.timeout(60), pytest.mark.anyio]

API_KEY = "tls-test-key"
# Characters a URL must percent-encode: the documented form quotes the password.
PASSWORD = "s3cret p@ss/w:rd#1"
# What the notifier logs when its connection fails (one server, or a cluster node).
INTERRUPTED = re.compile(r"change notifications from .* interrupted")


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("redis-tls"))


@pytest.fixture(scope="module")
def tls_redis(tls_files: TlsFiles) -> Iterator[RedisServer]:
    with RedisServer(tls=tls_files, password=PASSWORD) as server:
        yield server


@pytest.fixture(scope="module")
def tls_cluster(tls_files: TlsFiles) -> Iterator[RedisServer]:
    """A Redis Cluster of one node owning every slot, TLS only (its bus too), with AUTH."""
    with RedisServer(tls=tls_files, password=PASSWORD, cluster=True) as node:
        with node.client() as client:
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)

            def ok() -> bool:
                info = client.execute_command("CLUSTER", "INFO")
                text = info.decode() if isinstance(info, bytes) else str(info)
                return "cluster_state:ok" in text

            wait_until("cluster_state:ok", ok, 20, node.log_tail)
        yield node


def gateway_on(url: str, directory: Path) -> GatewayProcess:
    return GatewayProcess(redis_url=url, api_key=API_KEY, heartbeat=0.3, directory=directory)


async def serve_one_run(gateway: GatewayProcess) -> None:
    """Ready; a stream opened before the events gets them live, then END."""
    async with httpx.AsyncClient(
        base_url=gateway.url, headers=gateway.headers, timeout=10
    ) as client:
        ready = await client.get("/readyz")
        assert ready.status_code == 200, ready.text
        producer = await ProducerClient.claim(client)
        async with client.stream("GET", f"/v1/runs/{producer.run_id}/stream") as response:
            assert response.status_code == 200
            frames = iter_frames(response)
            assert (await next_frame(frames)).retry is not None
            for i in range(3):
                (event_id,) = await producer.publish(("token", {"i": i}))
                event = await next_event(frames)
                assert (event.id, event.json()) == (event_id, {"i": i})
            await producer.end()
            end = await next_event(frames)
            assert end.event == "end" and end.json() == {"status": "success"}


def assert_no_password(text: str) -> None:
    for form in (PASSWORD, quote(PASSWORD, safe="")):
        assert form not in text


async def test_a_run_is_served_over_tls_with_a_password(
    tls_redis: RedisServer, tmp_path: Path
) -> None:
    assert tls_redis.url.startswith("rediss://")
    with gateway_on(tls_redis.url, tmp_path) as gateway:
        await serve_one_run(gateway)
        log = gateway.log(10_000)
    assert not INTERRUPTED.search(log), log  # the notifier's connections are TLS too
    assert_no_password(log)


async def test_a_run_is_served_over_tls_on_a_cluster(
    tls_cluster: RedisServer, tmp_path: Path
) -> None:
    """`rediss+cluster://`: the notifier connects to each slot owner itself, with the
    URL's password and TLS options (CA, client certificate)."""
    url = "rediss+cluster://" + tls_cluster.url.removeprefix("rediss://")
    with gateway_on(url, tmp_path) as gateway:
        await serve_one_run(gateway)
        log = gateway.log(10_000)
    assert not INTERRUPTED.search(log), log
    assert_no_password(log)


@pytest.mark.parametrize(
    ("change", "logged"),
    [
        pytest.param("password", "invalid username-password pair", id="wrong-password"),
        pytest.param("ca", "certificate verify failed", id="ca-not-given"),
    ],
)
async def test_a_bad_redis_credential_is_a_clear_readiness_error(
    tls_redis: RedisServer, tmp_path: Path, change: str, logged: str
) -> None:
    """The gateway starts (Redis may come later) but is not ready; its log says why,
    and neither the log nor any answer carries the password."""
    parts = urlsplit(tls_redis.url)
    if change == "password":
        parts = parts._replace(netloc=parts.netloc.replace(quote(PASSWORD, safe=""), "wrong"))
    else:  # the server's certificate is then checked against the system CAs only
        query = [(k, v) for k, v in parse_qsl(parts.query) if k != "ssl_ca_certs"]
        parts = parts._replace(query=urlencode(query))
    url = parts.geturl()
    assert url != tls_redis.url
    with gateway_on(url, tmp_path) as gateway:
        async with httpx.AsyncClient(
            base_url=gateway.url, headers=gateway.headers, timeout=10
        ) as client:
            ready = await client.get("/readyz")
            assert ready.status_code == 503
            assert ready.json()["error"] == "backend_unavailable"
            claim = await client.post("/v1/runs", json={})
            assert claim.status_code == 503
            answers = ready.text + claim.text
        wait_until(
            f"{logged!r} in the gateway's log",
            lambda: logged in gateway.log(10_000).lower(),
            10,
            gateway.log,
        )
        log = gateway.log(10_000)
    assert logged in log.lower(), log
    assert_no_password(log + answers)


def audit(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "legacy-end-scan", "audit", "--redis-url", url],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_the_audit_reads_over_tls_and_names_a_refusal_without_the_password(
    tls_redis: RedisServer,
) -> None:
    """`gateway legacy-end-scan audit` takes the same URL (its own client)."""
    done = audit(tls_redis.url)
    assert done.returncode in (EXIT_SAFE_NOW, EXIT_SAFE_AFTER, EXIT_NOT_SAFE), done.stderr
    parts = urlsplit(tls_redis.url)
    wrong = audit(
        parts._replace(netloc=parts.netloc.replace(quote(PASSWORD, safe=""), "wrong")).geturl()
    )
    assert wrong.returncode == EXIT_REDIS_ERROR
    assert "invalid username-password pair" in wrong.stderr, wrong.stderr
    assert_no_password(done.stdout + done.stderr + wrong.stdout + wrong.stderr)
