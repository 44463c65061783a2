"""JSON responses encoded with orjson (the gateway's one JSON encoding)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response


class OrjsonResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def json_response(
    content: Any, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return OrjsonResponse(content, status_code=status, headers=headers)


def no_content() -> Response:
    return Response(status_code=204)
