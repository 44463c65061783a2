"""deploy/: the shipped nginx and haproxy configs in front of real gateways, plus static checks.

Live tests (parametrized over haproxy and nginx): two `gateway serve` processes share one
real redis-server and sit behind the proxy started from the shipped deploy file
(tests/support/proxies.py). They prove that the proxy does not buffer SSE (the first event and
heartbeats arrive while the run is still open), and that a reconnect through the proxy
with Last-Event-ID resumes exactly, also when it lands on the other gateway.

Static tests: `haproxy -c` and `nginx -t` pass on the configs as shipped; the Dockerfile,
compose.yaml and Kubernetes manifests have what operators rely on.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import secrets
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit
from uuid import uuid4

import anyio
import httpx
import pytest
import yaml
from pydantic import ValidationError

from gateway.cli import SHUTDOWN_GRACE_SECONDS, ConfigError, build_settings
from gateway.settings import Settings
from tests.support.http_server import ProducerClient
from tests.support.proxies import (
    DEPLOY,
    HAPROXY_BIN,
    NGINX_BIN,
    STOP_TIMEOUT,
    GatewayProcess,
    Proxy,
    wait_until,
)
from tests.support.redis_servers import RedisServer, free_port
from tests.support.sse_client import Frame, iter_frames

pytestmark = pytest.mark.timeout(60)

API_KEY = "deploy-test-key"
HEARTBEAT = 0.3
EVENT_TIMEOUT = 5.0  # generous: an unbuffered proxy delivers within milliseconds
KINDS = ["haproxy", "nginx"]

needs = {
    "haproxy": pytest.mark.skipif(
        not os.access(HAPROXY_BIN, os.X_OK), reason="haproxy not installed (scripts/bootstrap)"
    ),
    "nginx": pytest.mark.skipif(
        not os.access(NGINX_BIN, os.X_OK), reason="nginx not installed (scripts/bootstrap)"
    ),
}
proxy_kinds = pytest.mark.parametrize(
    "kind", [pytest.param(k, marks=needs[k]) for k in KINDS], scope="module"
)


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gateways(redis_url: str) -> Iterator[list[GatewayProcess]]:
    """Two gateway processes on one Redis (module-wide; tests use their own run ids)."""
    prefix = f"t{uuid4().hex[:8]}:"
    procs = [
        GatewayProcess(redis_url=redis_url, api_key=API_KEY, heartbeat=HEARTBEAT, key_prefix=prefix)
        for _ in range(2)
    ]
    try:
        for proc in procs:
            proc.start()
        yield procs
    finally:
        for proc in procs:
            proc.close()


@pytest.fixture(scope="module")
def proxy(kind: str, gateways: list[GatewayProcess]) -> Iterator[Proxy]:
    with Proxy(kind, backends=[g.url for g in gateways]) as p:  # type: ignore[arg-type]
        yield p


@pytest.fixture
async def client(proxy: Proxy) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=proxy.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10
    ) as c:
        yield c


async def next_frame(frames: AsyncIterator[Frame], seconds: float = EVENT_TIMEOUT) -> Frame:
    with anyio.fail_after(seconds):
        return await anext(frames)


async def next_event(frames: AsyncIterator[Frame], seconds: float = EVENT_TIMEOUT) -> Frame:
    """The next frame that is not a comment-only frame or a retry hint."""
    with anyio.fail_after(seconds):
        async for frame in frames:
            if frame.is_event:
                return frame
    raise AssertionError("stream ended without an event")


def payloads(frames: list[Frame]) -> list[Any]:
    return [f.json() for f in frames]


# -- live: no buffering --------------------------------------------------------------------


@proxy_kinds
@pytest.mark.anyio
async def test_first_event_arrives_before_end(client: httpx.AsyncClient, kind: str) -> None:
    producer = await ProducerClient.claim(client)
    url = f"/v1/runs/{producer.run_id}/stream"
    async with client.stream("GET", url) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        frames = iter_frames(response)
        first = await next_frame(frames)  # the retry hint: headers and bytes are flowing
        assert first.retry is not None

        published = time.monotonic()
        (event_id,) = await producer.publish(("token", {"text": "hello"}))
        event = await next_event(frames)  # fails after EVENT_TIMEOUT if the proxy buffers
        latency = time.monotonic() - published
        assert (event.id, event.event, event.json()) == (event_id, "token", {"text": "hello"})

        # Only now does the run end; the END frame follows through the proxy.
        await producer.end()
        end = await next_event(frames)
        assert end.event == "end" and end.json() == {"status": "success"}
    print(f"{kind}: first event through the proxy {latency * 1000:.1f} ms after publish")


LATENCY_LIMIT = 0.15  # seconds; direct to a gateway the median is a few ms here


async def publish_latencies(client: httpx.AsyncClient, count: int = 7) -> list[float]:
    """Publish `count` events one by one; seconds from publish to arrival through `client`."""
    producer = await ProducerClient.claim(client)
    latencies: list[float] = []
    async with client.stream("GET", f"/v1/runs/{producer.run_id}/stream") as response:
        frames = iter_frames(response)
        await next_frame(frames)  # retry hint
        for i in range(count):
            started = time.monotonic()
            (event_id,) = await producer.publish(("token", {"i": i}))
            event = await next_event(frames)
            latencies.append(time.monotonic() - started)
            assert event.id == event_id
        await producer.end()
    return latencies


@proxy_kinds
@pytest.mark.anyio
async def test_each_event_leaves_the_proxy_promptly(client: httpx.AsyncClient, kind: str) -> None:
    """Event by event, publish -> arrival through the proxy: median well under 150ms.

    HAProxy without `option http-no-delay` delivers every frame but holds each for about
    200ms (MSG_MORE corking), which the first-event test alone would not notice.
    """
    latencies = await publish_latencies(client)
    median = statistics.median(latencies)
    print(
        f"{kind}: publish->arrival median {median * 1000:.1f} ms, max {max(latencies) * 1000:.1f}"
    )
    assert median < LATENCY_LIMIT, latencies


@needs["haproxy"]
@pytest.mark.anyio
async def test_the_latency_check_catches_haproxy_without_http_no_delay(
    gateways: list[GatewayProcess], tmp_path: Path
) -> None:
    """Negative control for the test above: the shipped haproxy.cfg minus
    `option http-no-delay` delays every SSE frame past LATENCY_LIMIT (Linux, HAProxy 2.6)."""
    shipped = (DEPLOY / "haproxy.cfg").read_text()
    line = next(x for x in shipped.splitlines() if x.strip().startswith("option http-no-delay"))
    variant = tmp_path / "haproxy-delay.cfg"
    variant.write_text(shipped.replace(line + "\n", ""))
    with Proxy("haproxy", backends=[g.url for g in gateways], config=variant) as proxy:
        headers = {"Authorization": f"Bearer {API_KEY}"}
        async with httpx.AsyncClient(base_url=proxy.url, headers=headers, timeout=10) as client:
            latencies = await publish_latencies(client, count=3)
    assert statistics.median(latencies) >= LATENCY_LIMIT, latencies


# -- live: a client's disconnect reaches the gateway ----------------------------------------

IDLE_HEARTBEAT = 3.0  # long, so a proxy that waits for a failed write shows it
FREED_WITHIN = 1.0


async def seconds_to_free(gateway: GatewayProcess, proxy: Proxy) -> float:
    """Open an idle stream through `proxy`, read the retry hint, disconnect; seconds
    until the gateway holds no SSE response (capped at 4 heartbeats)."""
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(base_url=proxy.url, headers=headers, timeout=10) as client:
        producer = await ProducerClient.claim(client)
        async with client.stream("GET", f"/v1/runs/{producer.run_id}/stream") as response:
            assert (await next_frame(iter_frames(response))).retry is not None
            assert gateway.metric("gateway_sse_open_subscribers") == 1
    closed = time.monotonic()
    while gateway.metric("gateway_sse_open_subscribers") > 0:
        if time.monotonic() - closed > 4 * IDLE_HEARTBEAT:
            break
        await anyio.sleep(0.02)
    return time.monotonic() - closed


@pytest.fixture(scope="module")
def idle_gateway(redis_url: str) -> Iterator[GatewayProcess]:
    prefix = f"t{uuid4().hex[:8]}:"
    with GatewayProcess(
        redis_url=redis_url, api_key=API_KEY, heartbeat=IDLE_HEARTBEAT, key_prefix=prefix
    ) as gateway:
        yield gateway


@proxy_kinds
@pytest.mark.anyio
async def test_a_client_disconnect_through_the_proxy_frees_the_gateway_response(
    idle_gateway: GatewayProcess, kind: str
) -> None:
    """On an idle stream (no event, heartbeats 3 s apart) the client goes away: the
    gateway's response ends within a second, not when a later write fails."""
    with Proxy(kind, backends=[idle_gateway.url]) as proxy:  # type: ignore[arg-type]
        freed = [await seconds_to_free(idle_gateway, proxy) for _ in range(3)]
    print(f"{kind}: gateway response freed {freed} s after the client disconnected")
    assert max(freed) < FREED_WITHIN, freed


@needs["haproxy"]
@pytest.mark.anyio
async def test_the_disconnect_check_catches_haproxy_without_abortonclose(
    idle_gateway: GatewayProcess, tmp_path: Path
) -> None:
    """Negative control: without `option abortonclose` HAProxy keeps the gateway's
    response open after the client's FIN until a heartbeat write to it fails."""
    shipped = (DEPLOY / "haproxy.cfg").read_text()
    line = next(x for x in shipped.splitlines() if x.strip().startswith("option abortonclose"))
    variant = tmp_path / "haproxy-no-abort.cfg"
    variant.write_text(shipped.replace(line + "\n", ""))
    with Proxy("haproxy", backends=[idle_gateway.url], config=variant) as proxy:
        freed = await seconds_to_free(idle_gateway, proxy)
    assert freed >= FREED_WITHIN, freed


# -- live: exact resume through the proxy --------------------------------------------------


async def read_events(
    client: httpx.AsyncClient, url: str, last_event_id: str | None, limit: int | None = None
) -> list[Frame]:
    """Data events and the END frame; stop (disconnect) after `limit` data events."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    out: list[Frame] = []
    with anyio.fail_after(EVENT_TIMEOUT * 2):
        async with client.stream("GET", url, headers=headers) as response:
            assert response.status_code == 200, await response.aread()
            async for frame in iter_frames(response):
                if frame.is_event:
                    out.append(frame)
                if frame.event == "end" or (limit is not None and len(out) == limit):
                    break
    return out


@proxy_kinds
@pytest.mark.anyio
async def test_reconnect_with_last_event_id_resumes_exactly(
    client: httpx.AsyncClient, gateways: list[GatewayProcess], kind: str
) -> None:
    producer = await ProducerClient.claim(client)
    url = f"/v1/runs/{producer.run_id}/stream"
    first_ids = await producer.publish(*[("token", {"i": i}) for i in range(3)])

    # The first connection is cut by the client after k=2 of the 3 events.
    cut = await read_events(client, url, None, limit=2)
    assert [f.id for f in cut] == first_ids[:2]
    later_ids = await producer.publish(*[("token", {"i": i}) for i in range(3, 6)])
    await producer.end()
    all_ids = first_ids + later_ids

    # Reconnect through the proxy until both gateways have served a resume; every
    # resume must be exact: the events after the cursor, in order, then END.
    delivered = [await _delivered(g) for g in gateways]
    served: set[int] = set()
    cursor = cut[-1].id
    for attempt in range(8):
        resumed = await read_events(client, url, cursor)
        assert resumed[-1].event == "end" and resumed[-1].id == "end"
        data = resumed[:-1]
        start = all_ids.index(cursor) + 1 if cursor else 0
        assert [f.id for f in data] == all_ids[start:], attempt
        assert payloads(data) == [{"i": i} for i in range(start, 6)]
        now = [await _delivered(g) for g in gateways]
        served |= {i for i, (a, b) in enumerate(zip(delivered, now, strict=True)) if b > a}
        delivered = now
        if served == {0, 1}:
            break
        cursor = all_ids[attempt % len(all_ids)]
    assert served == {0, 1}, "the proxy sent every reconnect to the same gateway"


async def _delivered(gateway: GatewayProcess) -> float:
    return await anyio.to_thread.run_sync(gateway.metric, "gateway_events_delivered_total")


# -- live: heartbeats pass unbuffered ------------------------------------------------------


@proxy_kinds
@pytest.mark.anyio
async def test_heartbeats_pass_through_unbuffered(client: httpx.AsyncClient, kind: str) -> None:
    producer = await ProducerClient.claim(client)
    async with client.stream("GET", f"/v1/runs/{producer.run_id}/stream") as response:
        assert response.status_code == 200
        frames = iter_frames(response)
        arrivals: list[float] = []
        with anyio.fail_after(HEARTBEAT * 4 + EVENT_TIMEOUT):
            async for frame in frames:
                assert not frame.is_event, "no event was published"
                if b"heartbeat" in frame.comments:
                    arrivals.append(time.monotonic())
                    if len(arrivals) == 4:
                        break
        gaps = [b - a for a, b in itertools.pairwise(arrivals)]
        # Each heartbeat arrives on its own, about HEARTBEAT apart: a buffering proxy
        # would hold them back and release them in bursts (gaps near 0), or not at all.
        # One arrival late under load shortens the gap after it, so each gap has a loose
        # floor and their sum (the span, which one late arrival barely moves) the bounds.
        assert all(HEARTBEAT * 0.2 < g < HEARTBEAT * 3 for g in gaps), gaps
        assert HEARTBEAT * 2 < sum(gaps) < HEARTBEAT * 6, gaps
        await producer.end()
        end = await next_event(frames)
        assert end.event == "end"
    print(f"{kind}: heartbeat gaps through the proxy {[round(g, 3) for g in gaps]} s")


# -- live: access logs without reader tokens -----------------------------------------------


@proxy_kinds
@pytest.mark.anyio
async def test_the_access_log_keeps_reader_tokens_out(
    client: httpx.AsyncClient, proxy: Proxy, kind: str
) -> None:
    """A browser's EventSource sends its token as ?access_token=: the shipped log formats
    write the path without the query string."""
    producer = await ProducerClient.claim(client)
    await producer.end()
    token = f"eyJ.secret-{uuid4().hex}.sig"
    paths = [f"/v1/runs/{producer.run_id}/stream", f"/v1/runs/{producer.run_id}"]
    for path in paths:
        # (the API key in the header is what authorises; the query is what a browser sends)
        response = await client.get(f"{path}?access_token={token}&last_event_id=0-0")
        assert response.status_code == 200, response.text

    def logged() -> list[str]:
        return [line for line in proxy.log(10_000).splitlines() if producer.run_id in line]

    with anyio.fail_after(EVENT_TIMEOUT):
        while len(logged()) < len(paths) + 1:  # the claim, the stream, the run
            await anyio.sleep(0.05)
    lines = logged()
    for path in paths:
        assert any(f"GET {path} HTTP/1.1" in line for line in lines), (path, lines)
    assert not [line for line in proxy.log(10_000).splitlines() if token in line]
    assert not [line for line in lines if "access_token" in line or "last_event_id" in line]


# -- static: configs as shipped ------------------------------------------------------------


@pytest.mark.parametrize("kind", [pytest.param(k, marks=needs[k]) for k in KINDS])
@pytest.mark.parametrize("tls", [False, True])
def test_shipped_proxy_config_is_valid(kind: str, tls: bool, tmp_path: Path) -> None:
    backends = ["127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003"]
    proxy = Proxy(kind, backends=backends, directory=tmp_path, tls=tls)  # type: ignore[arg-type]
    result = proxy.check()
    assert result.returncode == 0, result.stdout + result.stderr


@needs["haproxy"]
def test_haproxy_config_requires_a_backend(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env["HAPROXY_BIND"] = "127.0.0.1:0"
    result = subprocess.run(
        [HAPROXY_BIN, "-c", "-f", str(DEPLOY / "haproxy.cfg")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0


def config_lines(path: Path) -> str:
    """The file without comments."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return "\n".join(line for line in lines if line)


def test_proxy_configs_have_sse_settings() -> None:
    nginx = config_lines(DEPLOY / "nginx.conf.template")
    for directive in (
        "proxy_buffering off;",
        "proxy_cache off;",
        "proxy_http_version 1.1;",
        'proxy_set_header Connection "";',
        "proxy_read_timeout 1h;",
        "least_conn;",
    ):
        assert directive in nginx, directive
    assert "proxy_ignore_headers" not in nginx  # X-Accel-Buffering stays honoured
    haproxy = config_lines(DEPLOY / "haproxy.cfg")
    for directive in (
        "timeout server 1h",
        "timeout client 1h",
        "timeout tunnel 1h",
        "uri /readyz",
        "balance leastconn",
    ):
        assert directive in haproxy, directive
    assert "compression" not in haproxy


# -- static: Dockerfile --------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_runs_as_non_root_with_a_healthcheck() -> None:
    instructions = dockerfile_instructions()
    froms = [args for word, args in instructions if word == "FROM"]
    assert froms and froms[-1].split()[0].startswith("python:3.11-slim")
    users = [args for word, args in instructions if word == "USER"]
    assert users, "no USER instruction"
    assert users[-1].split(":")[0] not in ("root", "0")
    runs = [args for word, args in instructions if word == "RUN"]
    assert any(" ." in run.split("&&")[0] for run in runs if "pip install" in run)
    healthchecks = [args for word, args in instructions if word == "HEALTHCHECK"]
    assert len(healthchecks) == 1 and "/healthz" in healthchecks[0]
    assert "urllib" in healthchecks[0]
    cmds = [args for word, args in instructions if word == "CMD"]
    assert json.loads(cmds[-1]) == ["gateway", "serve", "--host", "0.0.0.0"]


def test_dockerfile_installs_from_the_hash_checked_lock() -> None:
    """Dependencies only from requirements/serve.txt, every file hash-checked and no
    resolver; then the project alone, built with the lock's hatchling (no build
    isolation, which would fetch an unpinned one)."""
    instructions = dockerfile_instructions()
    pips = [
        " ".join(command.split())
        for word, args in instructions
        if word == "RUN"
        for command in args.split("&&")
        if "pip install" in command
    ]
    assert pips == [
        "pip install --require-hashes --no-deps -r requirements/serve.txt",
        "pip install --no-deps --no-build-isolation .",
    ]
    copies = [args for word, args in instructions if word == "COPY"]
    assert "requirements/serve.txt ./requirements/serve.txt" in copies
    # the lock is copied before the sources: a code change keeps the dependency layer
    assert copies.index("requirements/serve.txt ./requirements/serve.txt") == 0
    lock = (DEPLOY.parent / "requirements" / "serve.txt").read_text()
    assert "hatchling==" in lock and "--hash=sha256:" in lock
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    assert "*" in ignore and "!requirements/serve.txt" in ignore
    # A base image is a tag or a tag pinned by its digest, never a made-up form.
    for word, args in instructions:
        if word == "FROM":
            assert re.fullmatch(r"python:3\.11-slim(@sha256:[0-9a-f]{64})?", args.split()[0])


def healthcheck_argv() -> list[str]:
    (args,) = [a for w, a in dockerfile_instructions() if w == "HEALTHCHECK"]
    cmd = args[args.index("CMD") + len("CMD") :].strip()
    argv: list[str] = json.loads(cmd) if cmd.startswith("[") else ["sh", "-c", cmd]
    return argv


def test_dockerfile_healthcheck_command_probes_a_real_gateway(tmp_path: Path) -> None:
    """The HEALTHCHECK command, run as is (python from PATH -> this interpreter)."""
    argv = healthcheck_argv()
    assert argv[0] in ("python", "python3")
    argv[0] = sys.executable
    with GatewayProcess(directory=tmp_path) as gateway:
        env = {**os.environ, "GATEWAY_PORT": str(gateway.port)}
        ok = subprocess.run(argv, env=env, capture_output=True, timeout=30)
        assert ok.returncode == 0, ok.stderr
        gateway.terminate()
        down = subprocess.run(argv, env=env, capture_output=True, timeout=30)
        assert down.returncode != 0


# -- static: compose -----------------------------------------------------------------------


def test_compose_has_redis_with_aof_two_gateways_and_a_balancer() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services: dict[str, Any] = compose["services"]
    redis = services["redis"]
    command = redis["command"]
    words = command if isinstance(command, list) else shlex.split(command)
    assert words[words.index("--appendonly") + 1] == "yes"
    gateways = {
        name: svc
        for name, svc in services.items()
        if svc.get("build") and "GATEWAY_REDIS_URL" in (svc.get("environment") or {})
    }
    assert len(gateways) >= 2, services.keys()
    for svc in gateways.values():
        env = svc["environment"]
        assert env["GATEWAY_REDIS_URL"].startswith("redis://:${REDIS_PASSWORD")
        assert "GATEWAY_API_KEYS" in env
    volumes = " ".join(str(v) for svc in services.values() for v in (svc.get("volumes") or []))
    assert "haproxy.cfg" in volumes or "nginx.conf.template" in volumes
    balancers = [
        svc
        for svc in services.values()
        if str(svc.get("image", "")).startswith(("haproxy", "nginx"))
    ]
    assert balancers and all(svc.get("ports") for svc in balancers)


def compose_value(value: str, env: dict[str, str]) -> str:
    """`value` as compose interpolates it: ${NAME}, ${NAME:?message}, ${NAME:-default}."""

    def one(match: re.Match[str]) -> str:
        name, how, arg = match.group(1), match.group(2), match.group(3)
        if env.get(name):
            return env[name]
        if how == ":?":
            raise KeyError(f"compose refuses to start: {arg}")
        return arg if how == ":-" else ""

    return re.sub(r"\$\{(\w+)(?:(:\?|:-)([^}]*))?\}", one, value)


def test_compose_redis_requires_the_password_the_gateways_use(tmp_path: Path) -> None:
    """Redis has AUTH on with REDIS_PASSWORD from the environment (no literal in the
    file, no published port; compose refuses to start without it), and the gateways'
    URL carries the same: their command and URL, run here, serve; without the
    password the gateway is not ready."""
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    redis = compose["services"]["redis"]
    gateway_env: dict[str, str] = compose["x-gateway"]["environment"]
    assert "ports" not in redis
    command: list[str] = redis["command"]
    raw = command[command.index("--requirepass") + 1]
    assert raw == "${REDIS_PASSWORD:?set REDIS_PASSWORD}"
    with pytest.raises(KeyError, match="set REDIS_PASSWORD"):
        compose_value(raw, {})
    assert redis["environment"]["REDISCLI_AUTH"] == raw  # the healthcheck authenticates
    assert "redis-cli ping" in " ".join(redis["healthcheck"]["test"])

    password = secrets.token_hex(16)
    env = {"REDIS_PASSWORD": password, "GATEWAY_API_KEYS": API_KEY}
    args = [compose_value(word, env) for word in command[1:]]
    assert password in args
    with RedisServer(*args) as server:
        url = compose_value(gateway_env["GATEWAY_REDIS_URL"], env)
        assert url == f"redis://:{password}@redis:6379/0"
        url = url.replace("@redis:6379", f"@{server.host}:{server.port}")
        without = url.replace(f":{password}@", "")
        for redis_url, status in ((url, 200), (without, 503)):
            with GatewayProcess(redis_url=redis_url, directory=tmp_path / str(status)) as gw:
                assert httpx.get(gw.url + "/readyz", timeout=5).status_code == status


# -- static: Kubernetes --------------------------------------------------------------------


def k8s_documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and "kind" in doc and doc.get("kind") != "Kustomization":
                docs.append(doc)
    return docs


def test_k8s_manifests_parse_and_cover_the_basics() -> None:
    docs = k8s_documents()
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "PodDisruptionBudget", "ConfigMap", "Secret"} <= kinds
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for kind in ("Service", "PodDisruptionBudget"):
        (doc,) = [d for d in docs if d["kind"] == kind]
        selector = doc["spec"]["selector"]
        selector = selector.get("matchLabels", selector)
        assert selector.items() <= labels.items(), kind

    (container,) = pod["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    pre_stop = container["lifecycle"]["preStop"]
    drain = (
        int(pre_stop["sleep"]["seconds"])
        if "sleep" in pre_stop
        else int(pre_stop["exec"]["command"][-1])
    )
    assert drain > 0
    # The kubelet's grace period covers preStop and then the gateway's own shutdown.
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert grace > drain + SHUTDOWN_GRACE_SECONDS
    security = {**pod["spec"].get("securityContext", {}), **container.get("securityContext", {})}
    assert security.get("runAsNonRoot") is True

    # The config the container reads exists.
    config_names = {d["metadata"]["name"] for d in docs if d["kind"] in ("ConfigMap", "Secret")}
    for source in container.get("envFrom", []):
        ref = source.get("configMapRef") or source.get("secretRef")
        assert ref["name"] in config_names
    env = {e["name"]: e for e in container.get("env", [])}
    assert "GATEWAY_API_KEYS" in env or any("secretRef" in s for s in container.get("envFrom", []))


def the_pod(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Deployment's pod template and its one container."""
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod: dict[str, Any] = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    return pod, container


def test_k8s_takes_the_redis_url_from_a_secret() -> None:
    """The URL carries Redis's password: a Secret key, never a ConfigMap value; the
    example is rediss:// with a password, its CA file in a mounted Secret."""
    docs = k8s_documents()
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            assert "GATEWAY_REDIS_URL" not in (doc.get("data") or {}), doc["metadata"]
    pod, container = the_pod(docs)
    env = {e["name"]: e for e in container["env"]}
    ref = env["GATEWAY_REDIS_URL"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "gateway-secrets", "key": "GATEWAY_REDIS_URL"}  # not optional
    example = urlsplit(shipped_example_secrets()["GATEWAY_REDIS_URL"])
    assert example.scheme == "rediss" and example.password
    (ca,) = parse_qs(example.query)["ssl_ca_certs"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    (mount,) = [m for m in container["volumeMounts"] if ca.startswith(m["mountPath"] + "/")]
    assert mount["readOnly"] is True
    assert volumes[mount["name"]]["secret"]["secretName"] == "gateway-redis-tls"


def selected(policy: dict[str, Any], labels: dict[str, str]) -> bool:
    match: dict[str, str] = policy["spec"]["podSelector"]["matchLabels"]
    return match.items() <= labels.items()


def test_k8s_network_policies_keep_redis_and_the_gateway_private() -> None:
    """Applied by the kustomization: the gateway pods take connections only from the
    ingress controller (and Prometheus) on their http port; Redis pods only from the
    gateway pods (and each other), in this namespace."""
    docs = kustomization_resources()
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    pod, _ = the_pod(docs)
    gateway_labels = pod["metadata"]["labels"]
    redis_labels = {"app.kubernetes.io/name": "redis"}

    (to_gateway,) = [p for p in policies if selected(p, gateway_labels)]
    assert to_gateway["spec"]["policyTypes"] == ["Ingress"]
    peers = [peer for rule in to_gateway["spec"]["ingress"] for peer in rule["from"]]
    namespaces = {
        peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for peer in peers
    }
    assert "ingress-nginx" in namespaces
    for peer in peers:  # a namespace and the pods in it, never "anyone" or an address range
        assert "ipBlock" not in peer and peer["podSelector"]["matchLabels"], peer
    for rule in to_gateway["spec"]["ingress"]:
        assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]

    (to_redis,) = [p for p in policies if selected(p, redis_labels)]
    assert to_redis["spec"]["policyTypes"] == ["Ingress"]
    for rule in to_redis["spec"]["ingress"]:
        for peer in rule["from"]:  # pods of this namespace only
            assert set(peer) == {"podSelector"}, peer
            assert peer["podSelector"]["matchLabels"] in (gateway_labels, redis_labels), peer
    from_gateway = [
        rule
        for rule in to_redis["spec"]["ingress"]
        if rule["from"] == [{"podSelector": {"matchLabels": gateway_labels}}]
    ]
    assert from_gateway and {p["port"] for p in from_gateway[0]["ports"]} == {6379, 6380}


def ingress_routes(ingress: dict[str, Any], path: str) -> bool:
    """Does the Ingress send `path` to a backend (Kubernetes' path matching)?"""
    for rule in ingress["spec"]["rules"]:
        for entry in rule["http"]["paths"]:
            want = entry["path"]
            if entry["pathType"] == "Exact":
                hit = path == want
            else:  # Prefix (ImplementationSpecific read the same way): by path element
                base = want.rstrip("/")
                hit = path == base or path.startswith(base + "/")
            if hit:
                return True
    return False


def test_the_example_ingress_routes_the_api_but_not_metrics_or_readyz() -> None:
    (ingress,) = [d for d in k8s_documents() if d["kind"] == "Ingress"]
    assert "defaultBackend" not in ingress["spec"]
    for path in ("/metrics", "/readyz", "/healthz", "/metrics/", "/readyz/x"):
        assert not ingress_routes(ingress, path), path
    for path in (
        "/v1/runs",
        "/v1/runs/r1/stream",
        "/v1/sessions/s1/stream",
        "/threads/s1/runs/r1/stream",
        "/",
        "/static/console.js",
        "/openapi.json",
    ):
        assert ingress_routes(ingress, path), path
    annotations = ingress["metadata"]["annotations"]
    assert int(annotations["nginx.ingress.kubernetes.io/limit-connections"]) > 0


def test_deploy_files_set_only_real_settings() -> None:
    """Every `GATEWAY_*` name the gateway containers get is a setting (others are refused)."""
    settings = {f"GATEWAY_{name.upper()}" for name in Settings.model_fields}
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    given: set[str] = set()
    for svc in compose["services"].values():
        if svc.get("build"):
            given |= set(svc.get("environment") or {})
    for doc in k8s_documents():
        if doc["kind"] in ("ConfigMap", "Secret"):
            given |= set(doc.get("data") or {}) | set(doc.get("stringData") or {})
        if doc["kind"] == "Deployment":
            for container in doc["spec"]["template"]["spec"]["containers"]:
                given |= {e["name"] for e in container.get("env", [])}
    assert {"GATEWAY_API_KEYS", "GATEWAY_REDIS_URL"} <= given
    assert given <= settings, sorted(given - settings)


# -- Kubernetes: the pod's own command, with the environment Kubernetes gives it ----------

CLUSTER_IP = "10.0.0.1"


def kustomization_resources() -> list[dict[str, Any]]:
    """The documents `kubectl apply -k deploy/k8s` applies."""
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for name in kustomization["resources"]:
        docs += [d for d in yaml.safe_load_all((DEPLOY / "k8s" / name).read_text()) if d]
    return docs


def service_links(services: list[dict[str, Any]]) -> dict[str, str]:
    """The variables Kubernetes puts into every container of the namespace for these
    Services unless the pod sets `enableServiceLinks: false` (docker-links style)."""
    env: dict[str, str] = {}
    for service in services:
        name = service["metadata"]["name"].upper().replace("-", "_")
        ports = service["spec"]["ports"]
        first = ports[0]["port"]
        env[f"{name}_SERVICE_HOST"] = CLUSTER_IP
        env[f"{name}_SERVICE_PORT"] = str(first)
        env[f"{name}_PORT"] = f"tcp://{CLUSTER_IP}:{first}"
        for port in ports:
            number, proto = port["port"], port.get("protocol", "TCP")
            if "name" in port:
                env[f"{name}_SERVICE_PORT_{port['name'].upper()}"] = str(number)
            base = f"{name}_PORT_{number}_{proto}"
            env[base] = f"{proto.lower()}://{CLUSTER_IP}:{number}"
            env[f"{base}_PROTO"] = proto.lower()
            env[f"{base}_PORT"] = str(number)
            env[f"{base}_ADDR"] = CLUSTER_IP
    return env


def pod_command(port: int) -> tuple[list[str], dict[str, Any]]:
    """The gateway container's argv (its `--port` moved to `port`) and the container."""
    (deployment,) = [d for d in kustomization_resources() if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = list(container.get("command", [])) + list(container["args"])
    assert args[:2] == ["gateway", "serve"], args
    args[args.index("--port") + 1] = str(port)
    return [sys.executable, "-m", "gateway", *args[1:]], container


def pod_environment(
    container: dict[str, Any], secret_values: dict[str, str], redis_url: str
) -> dict[str, str]:
    """What the kubelet gives the container: its ConfigMaps (`envFrom`), its `env` (Secret
    keys from `secret_values`; an optional key missing there is left out, as Kubernetes
    does), and the service links of every Service applied beside it."""
    docs = kustomization_resources()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(DEPLOY.parent), env.get("PYTHONPATH")]))
    env.update(service_links([d for d in docs if d["kind"] == "Service"]))
    maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    for source in container.get("envFrom", []):
        env.update({k: str(v) for k, v in maps[source["configMapRef"]["name"]]["data"].items()})
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = str(item["value"])
            continue
        ref = item["valueFrom"]["secretKeyRef"]
        if ref["key"] in secret_values:
            env[item["name"]] = secret_values[ref["key"]]
        else:
            assert ref.get("optional") is True, f"the pod needs secret key {ref['key']}"
    env["GATEWAY_REDIS_URL"] = redis_url  # the test's Redis, not the cluster's
    env["GATEWAY_REDIS_KEY_PREFIX"] = f"k8s{uuid4().hex[:8]}:"
    return env


def test_the_pod_opts_out_of_service_links() -> None:
    (deployment,) = [d for d in kustomization_resources() if d["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["enableServiceLinks"] is False


def test_the_kustomization_ships_no_secret_values() -> None:
    docs = kustomization_resources()
    assert not [d for d in docs if d["kind"] == "Secret"], "a Secret with values is applied"
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    assert "secretGenerator" not in kustomization


def shipped_example_secrets() -> dict[str, str]:
    (secret,) = yaml.safe_load_all((DEPLOY / "k8s" / "secret.example.yaml").read_text())
    values: dict[str, str] = dict(secret["stringData"])
    return values


@pytest.mark.timeout(60)
def test_the_pod_command_starts_with_the_environment_kubernetes_gives_it(
    redis_url: str, tmp_path: Path
) -> None:
    """Service links (`GATEWAY_SERVICE_HOST`, `GATEWAY_PORT=tcp://…`, …) and a wrapper's
    own `GATEWAY_PYTHON` are ignored with one warning line; the pod serves."""
    port = free_port()
    argv, container = pod_command(port)
    key = secrets.token_hex(32)
    secret_values = {
        "GATEWAY_REDIS_URL": redis_url,
        "GATEWAY_API_KEYS": key,
        "GATEWAY_JWT_SECRET": secrets.token_hex(32),
    }
    env = pod_environment(container, secret_values, redis_url)
    assert env["GATEWAY_PORT"] == f"tcp://{CLUSTER_IP}:80"  # what collided with `port`
    env["GATEWAY_PYTHON"] = sys.executable  # a wrapper script's own variable
    log_path = tmp_path / "gateway.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        probe = container["readinessProbe"]["httpGet"]["path"]

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"exited {proc.returncode}: {log_path.read_text()}")
            return httpx.get(url + probe, timeout=1).status_code == 200

        wait_until("the pod's gateway is ready", ready, 20, log_path.read_text)
        liveness = container["livenessProbe"]["httpGet"]["path"]
        assert httpx.get(url + liveness, timeout=5).status_code == 200
        auth = {"Authorization": f"Bearer {key}"}
        assert httpx.get(url + "/v1/sessions", headers=auth, timeout=5).status_code == 200
        assert httpx.get(url + "/v1/sessions", timeout=5).status_code == 401  # auth is on
    finally:
        proc.terminate()
        proc.wait(STOP_TIMEOUT)
    lines = [line for line in log_path.read_text().splitlines() if "name no setting" in line]
    assert len(lines) == 1, log_path.read_text()
    for name in (
        "GATEWAY_SERVICE_HOST",
        "GATEWAY_SERVICE_PORT_HTTP",
        "GATEWAY_PORT,",
        "GATEWAY_PORT_80_TCP_ADDR",
        "GATEWAY_PYTHON",
    ):
        assert name in lines[0] + ",", name


@pytest.mark.timeout(60)
def test_the_pod_command_refuses_the_shipped_example_secrets(
    redis_url: str, tmp_path: Path
) -> None:
    """Applied as shipped (with secret.example.yaml), the gateway does not start."""
    argv, container = pod_command(free_port())
    example = shipped_example_secrets()
    env = pod_environment(container, example, redis_url)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    assert "example value" in done.stderr and "api_keys" in done.stderr
    for value in example.values():
        assert value not in done.stderr  # a secret is never echoed
    # Each shipped placeholder (and the `change-me` key older docs used) is refused
    # wherever a secret goes, also once a real key is given beside it.
    example_url = example.pop("GATEWAY_REDIS_URL")
    for value in [*example.values(), "change-me"]:
        with pytest.raises(ValidationError, match="example value"):
            Settings(api_keys=("a-real-key-0123456789", value))
        with pytest.raises(ValidationError, match=r"example value|at least 32 bytes"):
            Settings(jwt_secret=value)
    # The example Redis URL's placeholder password too, and it is never echoed.
    with pytest.raises(ConfigError, match="password is an example value") as refused:
        build_settings({"redis_url": example_url})
    assert urlsplit(example_url).password not in str(refused.value)
