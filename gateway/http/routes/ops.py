"""Operations routes: liveness, readiness (backend reachable, not draining), metrics.

These carry no credentials: they reveal no run data.

- `/healthz`: 200 while the process serves HTTP at all (no backend call).
- `/readyz`: 200 `{"status": "ready"}` once the app has started,
  is not draining, the backend answers a ping and (Redis) every Lua script of the
  bridge and the session store is loaded: `SCRIPT EXISTS` for their SHAs, `SCRIPT LOAD`
  for any missing (never used yet, or gone after a `SCRIPT FLUSH` or a Redis restart;
  logged as the `scripts_reloaded` lifecycle event). 503
  `draining` while the gateway drains for shutdown (load balancers stop sending new
  streams here), 503 `not_started` before the lifespan has opened the bridge, 503
  `backend_unavailable` when Redis cannot be reached or refuses to load a script.
  A Redis whose `maxmemory-policy` is not `noeviction` is still ready, and the body
  says so: `{"status": "ready", "warnings": [{"code": "redis_eviction_policy", ...}]}`
  (the same warning is logged at startup).
"""

from __future__ import annotations

import logging
from typing import Any, Final, Protocol, runtime_checkable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ...errors import BackendUnavailable
from ..edge.errors import HTTP_CODES, error_response, gateway_error_response
from ..edge.observe import lifecycle, request_id_of
from ..metrics import CONTENT_TYPE
from ..openapi import Operation, Reply, document
from ..responses import json_response
from ..schemas import Error, Status
from ..state import gateway_state


@runtime_checkable
class _Scripted(Protocol):
    """A backend holding Lua scripts (the Redis bridge, the Redis session store)."""

    async def ensure_scripts(self) -> int: ...


@runtime_checkable
class _Evicting(Protocol):
    """A backend that may evict keys under memory pressure (the Redis bridge)."""

    async def eviction_policies(self) -> frozenset[str]: ...


REQUIRED_EVICTION_POLICY: Final = "noeviction"


async def eviction_warnings(bridge: object) -> list[dict[str, Any]]:
    """A warning when Redis may evict the gateway's keys (docs/operations.md)."""
    if not isinstance(bridge, _Evicting):
        return []
    unsafe = sorted(p for p in await bridge.eviction_policies() if p != REQUIRED_EVICTION_POLICY)
    if not unsafe:
        return []
    detail = (
        f"Redis maxmemory-policy is {', '.join(unsafe)}: set {REQUIRED_EVICTION_POLICY}; "
        "evicted logs end their readers with gaps"
    )
    return [{"code": "redis_eviction_policy", "detail": detail, "maxmemory_policy": unsafe}]


async def log_eviction_policy(bridge: object) -> None:
    """At startup: log the eviction warning (a failure to ask is left to readiness)."""
    try:
        warnings = await eviction_warnings(bridge)
    except BackendUnavailable:
        return
    for warning in warnings:
        lifecycle(warning["code"], warning["detail"], level=logging.WARNING)


@document(Operation("Liveness", "ops", {200: Reply("Alive", Status)}))
async def healthz(_request: Request) -> Response:
    return json_response({"status": "ok"})


@document(
    Operation(
        "Readiness: started, backend reachable, scripts loaded, not draining",
        "ops",
        {
            200: Reply("Ready (with `warnings` when the backend is misconfigured)", Status),
            503: Reply("backend_unavailable / not_started / draining", Error),
        },
    )
)
async def readyz(request: Request) -> Response:
    state = gateway_state(request)
    if state.subscriptions.draining:
        return error_response(HTTP_CODES["draining"], "draining", "the gateway is shutting down")
    bridge, sessions = state.bridge_, state.sessions_
    if not state.started or bridge is None:
        return error_response(
            HTTP_CODES["not_started"], "not_started", "the gateway has not started serving yet"
        )
    reloaded = 0
    try:
        await bridge.ping()
        for backend in (bridge, sessions):
            if isinstance(backend, _Scripted):
                reloaded += await backend.ensure_scripts()
        warnings = await eviction_warnings(bridge)
    except BackendUnavailable as exc:
        state.metrics.unavailable("ops")
        lifecycle(
            "backend_unavailable",
            "readiness check failed",
            route_kind="ops",
            request_id=request_id_of(request.scope),
        )
        return gateway_error_response(exc)
    if reloaded:
        lifecycle(
            "scripts_reloaded",
            "readiness reloaded missing Lua scripts",
            scripts=reloaded,
            request_id=request_id_of(request.scope),
        )
    if warnings:
        return json_response({"status": "ready", "warnings": warnings})
    return json_response({"status": "ready"})


@document(
    Operation("Prometheus text exposition", "ops", {200: Reply("Metrics", media="text/plain")})
)
async def metrics(request: Request) -> Response:
    body = gateway_state(request).metrics.render()
    return Response(body, media_type=CONTENT_TYPE)


routes: Final = [
    Route("/healthz", healthz, methods=["GET"]),
    Route("/readyz", readyz, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
]
