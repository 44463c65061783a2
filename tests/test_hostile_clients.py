"""Hostile and careless clients against real servers over real sockets: a client that
leaves mid-body."""

from __future__ import annotations

import socket

import httpx
import pytest

from tests import http_server, test_logging
from tests.http_server import ProducerClient, RunningServer
from tests.test_logging import JsonLogs, request_line

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
gateway_server = http_server.gateway_server
client = http_server.client
json_logs = test_logging.json_logs


def _address(server: RunningServer) -> tuple[str, int]:
    host, port = server.base_url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


# --------------------------------------------------------- 6. a client that leaves mid-body


async def test_client_leaving_mid_body_is_a_client_disconnect_not_a_500(
    json_logs: JsonLogs, client: httpx.AsyncClient, gateway_server: RunningServer
) -> None:
    producer = await ProducerClient.claim(client)
    head = (
        f"POST /v1/runs/{producer.run_id}/events HTTP/1.1\r\n"
        "Host: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"X-Producer-Token: {producer.token}\r\nContent-Length: 10000\r\n\r\n"
    ).encode()
    with socket.create_connection(_address(gateway_server), timeout=10) as sock:
        sock.sendall(head + b'{"event":"token","data":"')
    line = json_logs.wait(request_line("/v1/runs/{run_id}/events", outcome="client_disconnect"))
    assert line["status"] < 500 and line["level"] == "INFO"
    assert not [e for e in json_logs.entries if e.get("level") in ("ERROR", "CRITICAL")]
    assert not [e for e in json_logs.entries if "exc" in e]
    # the server is fine and nothing was appended
    run = await client.get(f"/v1/runs/{producer.run_id}")
    assert run.status_code == 200 and run.json()["retained_events"] == 0
