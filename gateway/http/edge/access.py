"""How routes authorize: each route calls one of these first (`gateway.http.edge.auth` checks).

Producer and operator routes need an API key. Subscriber routes need an API key or a
subscriber token covering the run, judged against the session the run is *recorded*
under (never a session id taken from the request path).
"""

from __future__ import annotations

from starlette.requests import Request

from ...values import RunInfo
from ..state import gateway_state
from ..streaming.subscriptions import READER_KEY
from .auth import Principal


def producer(request: Request) -> Principal:
    return gateway_state(request).auth.authorize_producer(request.headers)


def operator(request: Request) -> Principal:
    return gateway_state(request).auth.authorize_operator(request.headers)


def subscriber(request: Request) -> Principal:
    """Authenticate a reader (401s) before anything about the run is revealed. Who it is
    goes on the scope for the stream it opens (its share of the open streams)."""
    principal = gateway_state(request).auth.authenticate_subscriber(
        request.headers, request.query_params
    )
    request.scope[READER_KEY] = principal.share_key
    return principal


def reader_of(principal: Principal, run: RunInfo) -> None:
    """403 unless the reader's credentials cover this run."""
    principal.check_run(run.run_id, run.session_id)
