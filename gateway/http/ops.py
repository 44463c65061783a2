"""Operations routes: liveness, readiness (backend reachable, not draining), metrics.

These carry no credentials: they reveal no run data. Readiness turns 503 while the
gateway drains for shutdown so load balancers stop sending new streams here.
"""

from __future__ import annotations

from typing import Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import BackendUnavailable
from .errors import error_response, gateway_error_response
from .metrics import CONTENT_TYPE
from .responses import json_response
from .state import gateway_state


async def healthz(_request: Request) -> Response:
    return json_response({"status": "ok"})


async def readyz(request: Request) -> Response:
    state = gateway_state(request)
    if state.subscriptions.draining:
        return error_response(503, "draining", "the gateway is shutting down")
    try:
        await state.bridge.ping()
    except BackendUnavailable as exc:
        return gateway_error_response(exc)
    return json_response({"status": "ready"})


async def metrics(request: Request) -> Response:
    body = gateway_state(request).metrics.render()
    return Response(body, media_type=CONTENT_TYPE)


routes: Final = [
    Route("/healthz", healthz, methods=["GET"]),
    Route("/readyz", readyz, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
]
