"""The HTTP/SSE face of the gateway (docs/protocol.md §3-5): a Starlette application.

app.py, state.py     create_app(settings, bridge=None), lifespan, drain(); what routes share
schemas.py           request bodies, query parameters and replies as pydantic models
openapi.py           @document(Operation) per endpoint; /openapi.json and docs/api.md's
                     request tables generated from the route table and schemas.py
metrics.py           Prometheus metrics        responses.py   JSON responses

edge/       what every request passes first
  guards.py          loopback Host in open mode, header count (before any route)
  cors.py            the CORS rules (Starlette's CORSMiddleware)
  routing.py         DirectRoute, SSERoute: the short-path routes, known in one place
  access.py          what each route calls to authorize; auth.py does the checking
  bodies.py          bounded JSON bodies, exact integers, the append route's hand checks
  observe.py         request ids and one log line per request
  errors.py          the one exception → HTTP error boundary
routes/     the endpoints, each module with its route table
  producer.py        POST /v1/runs, /events, /end, /lease (append_stream.py: ndjson)
  subscriber.py      GET /v1/runs/{id}, /stream, /wait; POST /cancel
  operator.py        DELETE /v1/runs/{id}
  langgraph.py       /threads/{session_id}/runs/{run_id}[/stream|/join]
  sessions.py        /v1/sessions, /turns, DELETE /v1/sessions/{id}
  session_feed.py    GET /v1/sessions/{id}/stream (every turn of a session)
  ui_stream.py       GET /v1/sessions/{id}/ui-stream (AI SDK UI message stream)
  ui_history.py      GET /v1/sessions/{id}/ui-messages (AI SDK UIMessage[])
  ops.py             /healthz, /readyz, /metrics
streaming/  what keeps a response open
  sse.py             the SSE response (lean ASGI streaming); frames.py: one Framing a kind
  send_watch.py      the send timeout: one timer per loop for every write in flight
  subscriptions.py   open streams, each reader's share of them, the drain signal
  liveness.py        producer_lost recovery END for expired leases
serve/      what runs the app
  server.py          GatewayServer: uvicorn server that drains SSE on shutdown
  connections.py     the HTTP/1.1 protocol with head-size, head-deadline and connection limits
"""

from .app import create_app, drain

__all__ = ["create_app", "drain"]
