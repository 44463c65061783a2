"""docs/producer.md's LangGraph example, run as written against a real gateway.

The two Python blocks of its "With LangGraph" section are executed (the producer
function, then the graph with a fake chat model from langchain-core), with
`GATEWAY_URL` and `API_KEY` pointing at a running gateway; the turn must arrive as the
graph streamed it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.support import http_server
from tests.support.http_server import RunningServer
from tests.support.sse_client import read_stream

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
gateway_server = http_server.gateway_server
client = http_server.client

DOC = Path(__file__).resolve().parents[2] / "docs" / "producer.md"


def langgraph_blocks() -> list[str]:
    section = DOC.read_text(encoding="utf-8").split("## With LangGraph", 1)[1]
    section = section.split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


@pytest.mark.gateway_settings(api_keys=("lg-key",))
async def test_the_langgraph_example_streams_a_turn(
    gateway_server: RunningServer, client: httpx.AsyncClient
) -> None:
    blocks = langgraph_blocks()
    assert len(blocks) == 2, "the section holds the producer function and the graph"
    namespace: dict[str, Any] = {"GATEWAY_URL": gateway_server.base_url, "API_KEY": "lg-key"}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)
    with anyio.fail_after(30):
        run_id = await namespace["stream_turn"](namespace["graph"], "thread-1", "Say hi")
    headers = {"Authorization": "Bearer lg-key"}
    result = await read_stream(client, f"/v1/runs/{run_id}/stream", headers=headers)
    texts = [frame.json()["text"] for frame in result.events]
    assert "".join(texts) == "Streamed word by word." and len(texts) > 3
    assert result.terminal is not None and result.terminal.json()["status"] == "success"
    reply = await client.get("/v1/sessions/thread-1/turns", headers=headers)
    (turn,) = reply.json()["turns"]
    assert turn["text"] == "Streamed word by word." and turn["state"] == "success"
    assert turn["history"][0]["parts"] == [{"kind": "text", "text": "Say hi"}]
