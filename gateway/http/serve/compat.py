"""uvicorn beyond its documented API, in one place, with the versions it was checked on.

Checked on uvicorn 0.55.0 (the version `requirements/*.txt` lock); `pyproject.toml`
allows `uvicorn>=0.30,<0.56`, since a 0.x minor may move what these rely on, and
`make newest` runs the fast suite on the newest release the range allows.
`tests/http_app/test_uvicorn_compat.py` checks that every hook below keeps its shape, so
a release that moves one fails there, by name.

- `uvicorn.protocols.http.httptools_impl.HttpToolsProtocol` (its module is not public
  API), extended by `connections.GatewayHttpProtocol` for the head limits, the
  trailer bound and the connection cap uvicorn does not enforce there. Each method is
  extended and calls the original: `connection_made`, `connection_lost`,
  `data_received`, `on_header`, `on_headers_complete`, `on_body`,
  `on_message_complete`, `on_response_complete`. Attributes read: `transport`, `url`
  (the request target, bytes), `cycle` (the request's response cycle, or None),
  `connections` (the server's open connections), and `app` (swapped for one request
  that is refused, as uvicorn itself does at `limit_concurrency`).
- `uvicorn.Server.shutdown(sockets)`: `server.GatewayServer` drains the SSE responses
  before uvicorn's graceful wait begins.
"""

from __future__ import annotations

CHECKED_ON = {"uvicorn": "0.55.0"}
