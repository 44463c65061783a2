"""`SSERoute`: how the SSE routes are known, in one place (the route table's own entries).

A route declared as `SSERoute` answers `GET` with an SSE stream. `GatewayApp` serves
those `GET`s on its short path (`app.py`), and the request log and metrics count them
as the `sse` route kind (`observe.py`). Nothing else needs to list them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


class SSERoute(Route):
    """A `GET` route whose endpoint returns an SSE response (or an error before one)."""

    def __init__(self, path: str, endpoint: Callable[[Request], Awaitable[Response]]) -> None:
        super().__init__(path, endpoint, methods=["GET"])
