"""Baseline SSE servers the bench scripts measure the gateway against (not a bench itself).

    python bench/baselines.py memory --port P
    python bench/baselines.py redis --port P --redis-url redis://127.0.0.1:6379

Both serve the gateway's paths so one load generator and one producer drive either:

- `memory`: a plain sse-starlette endpoint. `POST /v1/runs/{run}/events` (`{"events":
  [...]}` or one `{"event", "data"}`) and `POST /v1/runs/{run}/end` put every event on an
  `asyncio.Queue` per subscriber; `GET /v1/runs/{run}/stream` is an `EventSourceResponse`
  yielding one `ServerSentEvent` (one frame, one write) per event from its queue.
- `redis`: the naive Redis design. Every subscriber of `GET /v1/runs/{run}/stream` owns
  one Redis connection and loops a blocking `XREAD` on the run's log (the gateway's key
  layout, written by the gateway's own bridge or by this server's producer routes), then
  yields one frame per entry; `Last-Event-ID` is the XREAD start. Its producer routes
  (`POST /v1/runs`, `…/events`, `…/end`) are one plain `XADD` each: no lease, no
  fencing, no trimming, no END check.

Both run under uvicorn with uvloop + httptools and no access log, like `gateway serve`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import secrets
import time
from collections import defaultdict
from typing import Any

import orjson
import uvicorn
from sse_starlette.sse import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

END = object()


def memory_app() -> Starlette:
    subscribers: dict[str, set[asyncio.Queue[Any]]] = defaultdict(set)
    clock = itertools.count(1)

    async def claim(request: Request) -> Response:
        body = orjson.loads(await request.body() or b"{}")
        run_id = body.get("run_id") or secrets.token_hex(8)
        return JSONResponse({"run_id": run_id, "producer_token": "t", "epoch": 1}, 201)

    async def publish(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        body = orjson.loads(await request.body())
        events = body.get("events", [body])
        ids = []
        queues = subscribers.get(run_id, ())
        for event in events:
            event_id = f"{int(time.time() * 1000)}-{next(clock)}"
            ids.append(event_id)
            item = (event_id, event["event"], orjson.dumps(event.get("data")).decode())
            for queue in queues:
                queue.put_nowait(item)
        return JSONResponse({"ids": ids, "cancel_requested": False})

    async def end(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        for queue in subscribers.get(run_id, ()):
            queue.put_nowait(END)
        return JSONResponse({"id": None, "deduplicated": False})

    async def stream(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        queue: asyncio.Queue[Any] = asyncio.Queue()
        subscribers[run_id].add(queue)

        async def events() -> Any:
            try:
                while True:
                    item = await queue.get()
                    if item is END:
                        yield ServerSentEvent(event="end", data='{"status":"success"}', sep="\n")
                        return
                    event_id, name, data = item
                    yield ServerSentEvent(id=event_id, event=name, data=data, sep="\n")
            finally:
                subscribers[run_id].discard(queue)

        return EventSourceResponse(events(), ping=15, sep="\n", send_timeout=30)

    return Starlette(
        routes=[
            Route("/v1/runs", claim, methods=["POST"]),
            Route("/v1/runs/{run_id}/events", publish, methods=["POST"]),
            Route("/v1/runs/{run_id}/end", end, methods=["POST"]),
            Route("/v1/runs/{run_id}/stream", stream),
            Route("/healthz", lambda r: JSONResponse({"ok": True})),
        ]
    )


def redis_app(url: str, prefix: str = "gw:") -> Starlette:
    from redis.asyncio import Redis

    writer = Redis.from_url(url)

    def log_key(request: Request) -> str:
        return f"{prefix}{{{request.path_params['run_id']}}}:log"

    async def claim(request: Request) -> Response:
        body = orjson.loads(await request.body() or b"{}")
        run_id = body.get("run_id") or secrets.token_hex(8)
        return JSONResponse({"run_id": run_id, "producer_token": "naive"}, status_code=201)

    async def publish(request: Request) -> Response:
        body = orjson.loads(await request.body())
        events = body.get("events", [body])
        key = log_key(request)
        ids = [
            (await writer.xadd(key, {"e": e["event"], "d": orjson.dumps(e.get("data"))})).decode()
            for e in events
        ]
        return JSONResponse({"ids": ids, "cancel_requested": False})

    async def end(request: Request) -> Response:
        body = orjson.loads(await request.body())
        entry_id = await writer.xadd(log_key(request), {"end": body["status"]})
        return JSONResponse({"id": entry_id.decode(), "deduplicated": False})

    async def stream(request: Request) -> Response:
        key = log_key(request)
        start = request.headers.get("last-event-id") or "0-0"

        async def events() -> Any:
            client = Redis.from_url(url, single_connection_client=True)  # one per subscriber
            position = start
            try:
                while True:
                    reply = await client.xread({key: position}, count=100, block=15_000)
                    for _stream, entries in reply or ():
                        for entry_id, fields in entries:
                            position = entry_id
                            if b"end" in fields:
                                status = fields[b"end"].decode()
                                data = f'{{"status":"{status}"}}'
                                yield ServerSentEvent(event="end", data=data, sep="\n")
                                return
                            yield ServerSentEvent(
                                id=entry_id.decode(),
                                event=fields[b"e"].decode(),
                                data=fields[b"d"].decode(),
                                sep="\n",
                            )
            finally:
                await client.aclose()

        return EventSourceResponse(events(), ping=15, sep="\n", send_timeout=30)

    return Starlette(
        routes=[
            Route("/v1/runs", claim, methods=["POST"]),
            Route("/v1/runs/{run_id}/events", publish, methods=["POST"]),
            Route("/v1/runs/{run_id}/end", end, methods=["POST"]),
            Route("/v1/runs/{run_id}/stream", stream),
            Route("/healthz", lambda r: JSONResponse({"ok": True})),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["memory", "redis"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379")
    args = parser.parse_args()
    app = memory_app() if args.kind == "memory" else redis_app(args.redis_url)
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
