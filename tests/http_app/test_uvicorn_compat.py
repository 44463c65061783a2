"""The uvicorn hooks the gateway relies on beyond its documented API
(gateway/http/serve/compat.py) still have the shape relied on: a release that moves one
fails here, by name."""

from __future__ import annotations

import inspect

import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

pytestmark = pytest.mark.timeout(20)

EXTENDED = (
    "connection_made",
    "connection_lost",
    "data_received",
    "on_header",
    "on_headers_complete",
    "on_body",
    "on_message_complete",
    "on_response_complete",
)


@pytest.mark.parametrize("name", EXTENDED)
def test_the_extended_protocol_methods_exist(name: str) -> None:
    assert callable(getattr(HttpToolsProtocol, name))


@pytest.mark.parametrize("attribute", ["transport", "url", "cycle", "connections", "app"])
def test_the_protocol_sets_the_attributes_read(attribute: str) -> None:
    source = inspect.getsource(HttpToolsProtocol)
    assert f"self.{attribute} =" in source or f"self.{attribute}: " in source


def test_server_shutdown_takes_the_sockets() -> None:
    assert "sockets" in inspect.signature(uvicorn.Server.shutdown).parameters
