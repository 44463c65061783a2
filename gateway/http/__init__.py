"""The HTTP/SSE face of the gateway (docs/protocol.md §3-5): a Starlette application.

app.py            create_app(settings, bridge=None), lifespan, drain()
server.py         GatewayServer: uvicorn server that drains SSE on shutdown
connections.py    the HTTP/1.1 protocol with head-size, head-deadline and connection limits
producer.py       POST /v1/runs, /events, /end, /lease
subscriber.py     GET /v1/runs/{id}, /stream, /wait; POST /cancel
operator.py       DELETE /v1/runs/{id}
langgraph.py      /threads/{session_id}/runs/{run_id}[/stream|/join]
sessions_routes.py /v1/sessions, /turns, DELETE /v1/sessions/{id}
ui_stream.py      GET /v1/sessions/{id}/ui-stream (AI SDK UI message stream)
ui_history.py     GET /v1/sessions/{id}/ui-messages (AI SDK UIMessage[])
session_feed.py   GET /v1/sessions/{id}/stream (every turn of a session)
append_stream.py  the streamed (ndjson) append of POST /events
ops.py            /healthz, /readyz, /metrics
sse.py            the SSE response (lean ASGI streaming)
send_watch.py     the SSE send timeout: one timer per loop for every write in flight
frames.py         SSE frame encoding, one Framing per kind of stream
routing.py        DirectRoute, SSERoute: the short-path routes, known in one place
guards.py         checks before any route: loopback Host in open mode, header count
cors.py           the CORS rules (Starlette's CORSMiddleware)
errors.py         the one exception → HTTP error boundary
bodies.py         bounded JSON bodies, exact integers, the append route's hand checks
schemas.py        request bodies, query parameters and replies as pydantic models
access.py         what each route calls to authorize (auth.py does the checking)
liveness.py       producer_lost recovery END for expired leases
subscriptions.py  open-subscription registry and the drain signal
metrics.py        Prometheus metrics
openapi.py        @document(Operation) per endpoint; /openapi.json and docs/api.md's
                  request tables generated from the route table and schemas.py
"""

from .app import create_app, drain

__all__ = ["create_app", "drain"]
