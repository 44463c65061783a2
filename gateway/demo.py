"""A demo producer: streams a synthetic answer token by token, so streaming is visible at once.

Every few seconds it claims a new run `demo-<hex>` in the session `demo`, publishes one
`token` event (`{"text": "..."}`) about every 50 ms for a short paragraph, then ENDs the
run with `success`, and logs the curl command that watches it. A subscriber that
cancels the run (`POST /v1/runs/{id}/cancel`) makes it END with `cancelled`.

Two ways to drive it, one loop (`run_demo_producer`):

- in-process, straight against a bridge: `run_demo(bridge, ...)`; `gateway serve --demo`
  runs it in the serve task group next to uvicorn (structured: it is cancelled, and
  ENDs its current run as `interrupted`, before the bridge closes);
- over HTTP against a running gateway: `run_demo_http(url, api_key)`, used by
  `gateway demo --url ...` (stdlib HTTP client in a worker thread, no extra dependency).
"""

from __future__ import annotations

import json
import logging
import re
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any, Final, Literal, Protocol

import anyio

from .bridge.base import StreamBridge
from .errors import GatewayError
from .values import EndStatus

log = logging.getLogger("gateway.demo")

DEMO_SESSION: Final = "demo"

PARAGRAPH: Final = (
    "Hello! This answer is streamed token by token through the gateway. "
    "Each word you see arrived as its own `token` event on a Redis-backed run log, "
    "so a browser that reconnects with Last-Event-ID resumes exactly where it left off, "
    "without losing or repeating a word. When the answer is complete the run ends, "
    "and a new one starts a few seconds later."
)


def demo_tokens(text: str = PARAGRAPH) -> Iterator[str]:
    """The text split into word tokens that keep their trailing whitespace."""
    yield from re.findall(r"\S+\s*", text)


class DemoSink(Protocol):
    """Where the demo writes: a bridge, or a gateway over HTTP."""

    async def claim(self, run_id: str, session_id: str) -> str:
        """Claim the run; returns the producer token."""
        ...

    async def publish(self, run_id: str, producer_token: str, event: str, data: Any) -> bool:
        """Append one event; returns whether a subscriber asked to cancel the run."""
        ...

    async def end(self, run_id: str, producer_token: str, status: EndStatus) -> None: ...


class BridgeSink:
    def __init__(self, bridge: StreamBridge) -> None:
        self._bridge = bridge

    async def claim(self, run_id: str, session_id: str) -> str:
        return (await self._bridge.claim(run_id, session_id=session_id)).token

    async def publish(self, run_id: str, producer_token: str, event: str, data: Any) -> bool:
        result = await self._bridge.publish(run_id, event, data, producer_token=producer_token)
        return result.cancel_requested

    async def end(self, run_id: str, producer_token: str, status: EndStatus) -> None:
        await self._bridge.publish_end(run_id, status, producer_token=producer_token)


class DemoHttpError(Exception):
    """The gateway answered a demo request with an error."""


class HttpSink:
    """The producer HTTP API, via urllib in a worker thread."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 10.0) -> None:
        self._base = base_url.rstrip("/")
        self._api_key = api_key
        self._timeout = timeout

    def _post_sync(self, path: str, body: dict[str, Any], producer_token: str | None) -> Any:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        if producer_token:
            headers["X-Producer-Token"] = producer_token
        request = urllib.request.Request(
            self._base + path, data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            try:
                code = json.loads(exc.read()).get("error", exc.reason)
            except (ValueError, AttributeError):
                code = exc.reason
            raise DemoHttpError(f"POST {path} -> {exc.code} {code}") from None

    async def _post(self, path: str, body: dict[str, Any], producer_token: str | None) -> Any:
        return await anyio.to_thread.run_sync(self._post_sync, path, body, producer_token)

    async def claim(self, run_id: str, session_id: str) -> str:
        reply = await self._post("/v1/runs", {"run_id": run_id, "session_id": session_id}, None)
        return str(reply["producer_token"])

    async def publish(self, run_id: str, producer_token: str, event: str, data: Any) -> bool:
        reply = await self._post(
            f"/v1/runs/{run_id}/events", {"event": event, "data": data}, producer_token
        )
        return bool(reply.get("cancel_requested", False))

    async def end(self, run_id: str, producer_token: str, status: EndStatus) -> None:
        await self._post(f"/v1/runs/{run_id}/end", {"status": status}, producer_token)


AuthHint = Literal["none", "api_key", "token"]


def watch_command(base_url: str, run_id: str, *, auth: AuthHint = "none") -> str:
    """The curl command that watches a run, with a credential placeholder when needed."""
    if auth == "api_key":
        header = ' -H "Authorization: Bearer $GATEWAY_API_KEY"'
    elif auth == "token":  # needs GATEWAY_JWT_SECRET in the shell
        header = f' -H "Authorization: Bearer $(gateway token --run {run_id})"'
    else:
        header = ""
    return f"curl -N{header} {base_url.rstrip('/')}/v1/runs/{run_id}/stream"


async def _stream_one(sink: DemoSink, run_id: str, producer_token: str, delay: float) -> EndStatus:
    for piece in demo_tokens():
        if await sink.publish(run_id, producer_token, "token", {"text": piece}):
            return "cancelled"
        await anyio.sleep(delay)
    return "success"


async def run_demo_producer(
    sink: DemoSink,
    *,
    base_url: str = "http://127.0.0.1:8000",
    auth_hint: AuthHint = "none",
    stop: anyio.Event | None = None,
    session_id: str = DEMO_SESSION,
    token_delay: float = 0.05,
    pause: float = 3.0,
    max_runs: int | None = None,
) -> int:
    """Stream demo runs until `stop` is set, `max_runs` are done, or cancelled.

    Returns the number of runs it completed. Errors of one run are logged and the
    loop goes on after `pause` (the gateway may be restarting).
    """
    done = 0
    while (stop is None or not stop.is_set()) and (max_runs is None or done < max_runs):
        run_id = f"demo-{uuid.uuid4().hex[:12]}"
        try:
            producer_token = await sink.claim(run_id, session_id)
        except (GatewayError, DemoHttpError, OSError) as exc:
            log.warning("demo: could not claim a run: %s", exc, extra={"run_id": run_id})
        else:
            log.info(
                "demo run streaming; watch it with: %s",
                watch_command(base_url, run_id, auth=auth_hint),
                extra={"run_id": run_id, "session_id": session_id},
            )
            status: EndStatus = "interrupted"
            try:
                status = await _stream_one(sink, run_id, producer_token, token_delay)
            except (GatewayError, DemoHttpError, OSError) as exc:
                status = "error"
                log.warning("demo: publish failed: %s", exc, extra={"run_id": run_id})
            finally:
                # Runs on cancellation too: END the run so no reader waits on it.
                with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                    try:
                        await sink.end(run_id, producer_token, status)
                    except (GatewayError, DemoHttpError, OSError) as exc:
                        log.warning("demo: END failed: %s", exc, extra={"run_id": run_id})
            log.info("demo run ended", extra={"run_id": run_id, "outcome": status})
            done += 1
        if max_runs is not None and done >= max_runs:
            break
        with anyio.move_on_after(pause):
            if stop is None:
                await anyio.sleep_forever()
            else:
                await stop.wait()
    return done


async def run_demo(
    bridge: StreamBridge,
    stop: anyio.Event | None = None,
    *,
    base_url: str = "http://127.0.0.1:8000",
    auth_hint: AuthHint = "none",
    token_delay: float = 0.05,
    pause: float = 3.0,
    max_runs: int | None = None,
) -> int:
    """The demo producer in-process, writing straight to `bridge`.

    Run it inside a task group; it stops when `stop` is set or its scope is cancelled.
    """
    return await run_demo_producer(
        BridgeSink(bridge),
        base_url=base_url,
        auth_hint=auth_hint,
        stop=stop,
        token_delay=token_delay,
        pause=pause,
        max_runs=max_runs,
    )


async def run_demo_http(
    url: str,
    api_key: str | None = None,
    *,
    stop: anyio.Event | None = None,
    token_delay: float = 0.05,
    pause: float = 3.0,
    max_runs: int | None = None,
) -> int:
    """The demo producer against a running gateway over its HTTP producer API."""
    return await run_demo_producer(
        HttpSink(url, api_key),
        base_url=url,
        auth_hint="api_key" if api_key else "none",
        stop=stop,
        token_delay=token_delay,
        pause=pause,
        max_runs=max_runs,
    )
