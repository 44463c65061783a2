"""`DirectRoute` and `SSERoute`: which routes take `GatewayApp`'s short path, declared in
the route tables themselves (nothing else lists them).

A `DirectRoute` is one `GatewayApp` dispatches itself, past the middleware stack
(`app.py`): the hot routes, where that stack's frames cost the most. An `SSERoute` is a
direct `GET` route answering with an SSE stream, held for minutes (each frame of the
stack would stay allocated that long); the producer's append route is direct too, since
an agent POSTs it once per token. The request log and metrics count the SSE routes as
the `sse` route kind (`observe.py`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


class DirectRoute(Route):
    """A route served on `GatewayApp`'s short path (a method it does not allow: the stack)."""

    def __init__(
        self,
        path: str,
        endpoint: Callable[[Request], Awaitable[Response]],
        methods: Sequence[str],
    ) -> None:
        super().__init__(path, endpoint, methods=list(methods))


class SSERoute(DirectRoute):
    """A `GET` route whose endpoint returns an SSE response (or an error before one)."""

    def __init__(self, path: str, endpoint: Callable[[Request], Awaitable[Response]]) -> None:
        super().__init__(path, endpoint, methods=["GET"])
