"""The OpenAPI 3.1 document served at `/openapi.json`, written by hand to match the routes.

Every JSON route is listed with each status it can return and the error body
`{"error", "detail"}`; the SSE routes are described as `text/event-stream` (their
frames are documented in docs/api.md). Keep this in step with the route modules.
"""

from __future__ import annotations

import copy
from typing import Any, Final, get_args

from ..names import ID_PATTERN
from ..values import EndStatus

_ID_PATTERN: Final = f"^{ID_PATTERN}$"
_END_STATUSES: Final = list(get_args(EndStatus))


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _err(description: str) -> dict[str, Any]:
    return _json(_ref("Error"), description)


_ERRORS: Final[dict[str, str]] = {
    "400": "invalid_json: the body is not valid JSON (or is empty where one is required)",
    "401": "unauthorized / token_expired: missing, invalid or expired credentials",
    "403": "forbidden: the credentials do not cover this route or run; host_not_allowed: "
    "an open (unauthenticated) gateway answers only for loopback Host names",
    "404": "run_not_found: no such run (or not a run of this thread)",
    "409": "fenced / ended / run_owned / run_ended / sequence_gap / sequence_conflict",
    "413": "too_large: body, event or batch over the configured limits",
    "415": "unsupported_media_type: a POST without Content-Type: application/json",
    "422": "invalid_input / malformed field: bad run id, event name, status, type...; "
    "reserved_event_name; number_out_of_range (an integer beyond 64 bits)",
    "429": "too_many_streams: this reader holds its share of the open streams; retry after "
    "Retry-After seconds",
    "503": "backend_unavailable / bridge_closed: retry after Retry-After seconds",
}


def _errors(*codes: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for code in codes:
        out[code] = _err(_ERRORS[code])
        if code in ("429", "503"):
            out[code]["headers"] = {"Retry-After": {"schema": {"type": "integer"}}}
    return out


def _path_param(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": {"type": "string", "pattern": _ID_PATTERN, "maxLength": 128},
    }


_RUN_ID: Final = _path_param("run_id", "Run id")
_SESSION_ID: Final = _path_param("session_id", "Session (LangGraph thread) id")
_TOKEN_HEADER: Final = {
    "name": "X-Producer-Token",
    "in": "header",
    "required": True,
    "description": "The producer_token returned by the claim (missing: 422)",
    "schema": {"type": "string"},
}
_SEQ_HEADER: Final = {
    "name": "X-Producer-Seq",
    "in": "header",
    "required": False,
    "description": (
        "Number of the batch's first event in this lease epoch (1-based): a retry of the "
        "last applied batch returns its ids and appends nothing; past the next expected "
        "number is 409 sequence_gap with expected_seq"
    ),
    "schema": {"type": "integer", "minimum": 1, "maximum": 2**53 - 1},
}
_ACCESS_TOKEN: Final = {
    "name": "access_token",
    "in": "query",
    "required": False,
    "description": "Subscriber token, for clients that cannot set headers",
    "schema": {"type": "string"},
}
_CURSOR_PARAMS: Final = [
    {
        "name": "Last-Event-ID",
        "in": "header",
        "required": False,
        "description": "Reconnect cursor `<ms>-<seq>` (wins over the query parameter)",
        "schema": {"type": "string"},
    },
    {
        "name": "last_event_id",
        "in": "query",
        "required": False,
        "description": "Reconnect cursor when the header cannot be set",
        "schema": {"type": "string"},
    },
]
_SSE_200: Final = {
    "description": "SSE stream: `retry:` first, then `id/event/data` frames, `: heartbeat`"
    " comments, and one terminal `end`, `gap` or `unavailable` frame (see docs/api.md)",
    "content": {"text/event-stream": {"schema": {"type": "string"}}},
}
_SSE_TERMINAL_204: Final = {
    "description": "The cursor is the id of an `end` or `gap` frame (`end`, `gap`): the"
    " client already saw it; stop reconnecting"
}
_NULLABLE_ID: Final = {"type": ["string", "null"]}

_SCHEMAS: Final[dict[str, Any]] = {
    "Error": {
        "type": "object",
        "required": ["error", "detail"],
        "properties": {
            "error": {"type": "string"},
            "detail": {"type": "string"},
            "expected_seq": {"type": "integer", "description": "sequence_*: next expected"},
        },
    },
    "ClaimRequest": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "run_id": {"type": ["string", "null"], "pattern": _ID_PATTERN},
            "session_id": {"type": ["string", "null"], "pattern": _ID_PATTERN},
            "lease_seconds": {"type": ["number", "null"], "exclusiveMinimum": 0},
            "takeover": {"type": ["boolean", "null"]},
            "input_message": {"type": ["object", "null"]},
            "metadata": {"type": ["object", "null"]},
        },
    },
    "Claim": {
        "type": "object",
        "required": ["run_id", "session_id", "producer_token", "epoch", "lease_expires_at"],
        "properties": {
            "run_id": {"type": "string"},
            "session_id": {"type": ["string", "null"]},
            "producer_token": {"type": "string"},
            "epoch": {"type": "integer"},
            "lease_expires_at": {"type": "number", "description": "unix seconds"},
        },
    },
    "Event": {
        "type": "object",
        "additionalProperties": False,
        "required": ["event"],
        "properties": {
            "event": {"type": "string", "pattern": r"^[!-9;-~]{1,64}$"},
            "data": {"description": "any JSON value (default null)"},
        },
    },
    "EventBatch": {
        "type": "object",
        "additionalProperties": False,
        "required": ["events"],
        "properties": {"events": {"type": "array", "minItems": 1, "items": _ref("Event")}},
    },
    "PublishResult": {
        "type": "object",
        "required": ["ids", "cancel_requested"],
        "properties": {
            "ids": {"type": "array", "items": {"type": "string"}},
            "cancel_requested": {"type": "boolean"},
        },
    },
    "EndRequest": {
        "type": "object",
        "additionalProperties": False,
        "required": ["status"],
        "properties": {
            "status": {"type": "string", "enum": _END_STATUSES},
            "error": {"type": ["object", "null"]},
        },
    },
    "EndResult": {
        "type": "object",
        "required": ["id", "deduplicated"],
        "properties": {"id": _NULLABLE_ID, "deduplicated": {"type": "boolean"}},
    },
    "LeaseRequest": {
        "type": "object",
        "additionalProperties": False,
        "properties": {"lease_seconds": {"type": ["number", "null"], "exclusiveMinimum": 0}},
    },
    "LeaseState": {
        "type": "object",
        "required": ["lease_expires_at", "cancel_requested"],
        "properties": {
            "lease_expires_at": {"type": "number"},
            "cancel_requested": {"type": "boolean"},
        },
    },
    "Run": {
        "type": "object",
        "required": [
            "run_id",
            "session_id",
            "status",
            "created_at",
            "updated_at",
            "first_event_id",
            "last_event_id",
            "retained_events",
            "cancel_requested",
            "error",
        ],
        "properties": {
            "run_id": {"type": "string"},
            "session_id": {"type": ["string", "null"]},
            "status": {"type": "string", "enum": ["running", *_END_STATUSES]},
            "created_at": {"type": "number"},
            "updated_at": {"type": "number"},
            "first_event_id": _NULLABLE_ID,
            "last_event_id": _NULLABLE_ID,
            "retained_events": {"type": "integer", "minimum": 0},
            "cancel_requested": {"type": "boolean"},
            "error": {"description": "the END's error object, or null"},
        },
    },
    "WaitDone": {
        "type": "object",
        "required": ["status", "last_event_id"],
        "properties": {
            "status": {"type": "string", "enum": _END_STATUSES},
            "last_event_id": _NULLABLE_ID,
        },
    },
    "WaitRunning": {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"type": "string", "const": "running"}},
    },
    "CancelAccepted": {
        "type": "object",
        "required": ["run_id", "cancel_requested"],
        "properties": {"run_id": {"type": "string"}, "cancel_requested": {"type": "boolean"}},
    },
    "ThreadRun": {
        "type": "object",
        "required": ["run_id", "thread_id", "status"],
        "properties": {
            "run_id": {"type": "string"},
            "thread_id": {"type": "string"},
            "status": {"type": "string", "enum": ["running", "success", "error", "interrupted"]},
        },
    },
    "Status": {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"type": "string"}},
    },
}


def _body(schema: dict[str, Any], required: bool) -> dict[str, Any]:
    return {"required": required, "content": {"application/json": {"schema": schema}}}


_PRODUCER_ERRORS: Final = ("400", "401", "403", "409", "413", "415", "422", "503")
_READER_ERRORS: Final = ("401", "403", "404", "422", "503")
_STREAM_ERRORS: Final = (*_READER_ERRORS, "429")  # what holds a connection has a share
_API_KEY: Final[list[dict[str, list[str]]]] = [{"bearer": []}]
_READER_AUTH: Final[list[dict[str, list[str]]]] = [{"bearer": []}, {"accessToken": []}]

_PATHS: Final[dict[str, Any]] = {
    "/v1/runs": {
        "post": {
            "operationId": "claimRun",
            "summary": "Claim a run (create it, or take over an expired/forced lease)",
            "security": _API_KEY,
            "requestBody": _body(_ref("ClaimRequest"), False),
            "responses": {
                "201": _json(_ref("Claim"), "The producer lease"),
                **_errors(*_PRODUCER_ERRORS),
            },
        }
    },
    "/v1/runs/{run_id}/events": {
        "post": {
            "operationId": "publishEvents",
            "summary": "Append one event or a batch (atomic)",
            "security": _API_KEY,
            "parameters": [_RUN_ID, _TOKEN_HEADER, _SEQ_HEADER],
            "requestBody": _body({"oneOf": [_ref("Event"), _ref("EventBatch")]}, True),
            "responses": {
                "200": _json(_ref("PublishResult"), "Assigned ids, and the cancel flag"),
                **_errors(*_PRODUCER_ERRORS),
            },
        }
    },
    "/v1/runs/{run_id}/end": {
        "post": {
            "operationId": "endRun",
            "summary": "Append the END (idempotent)",
            "security": _API_KEY,
            "parameters": [_RUN_ID, _TOKEN_HEADER],
            "requestBody": _body(_ref("EndRequest"), True),
            "responses": {
                "200": _json(_ref("EndResult"), "The END id; deduplicated when it existed"),
                **_errors(*_PRODUCER_ERRORS),
            },
        }
    },
    "/v1/runs/{run_id}/lease": {
        "post": {
            "operationId": "renewLease",
            "summary": "Renew the producer lease without writing an event",
            "security": _API_KEY,
            "parameters": [_RUN_ID, _TOKEN_HEADER],
            "requestBody": _body(_ref("LeaseRequest"), False),
            "responses": {
                "200": _json(_ref("LeaseState"), "New expiry, and the cancel flag"),
                **_errors(*_PRODUCER_ERRORS),
            },
        }
    },
    "/v1/runs/{run_id}": {
        "get": {
            "operationId": "getRun",
            "summary": "The run record",
            "security": _READER_AUTH,
            "parameters": [_RUN_ID, _ACCESS_TOKEN],
            "responses": {"200": _json(_ref("Run"), "The run"), **_errors(*_READER_ERRORS)},
        },
        "delete": {
            "operationId": "deleteRun",
            "summary": "Remove the retained log now (the record stays)",
            "security": _API_KEY,
            "parameters": [_RUN_ID],
            "responses": {"204": {"description": "Removed"}, **_errors(*_READER_ERRORS)},
        },
    },
    "/v1/runs/{run_id}/stream": {
        "get": {
            "operationId": "streamRun",
            "summary": "Follow the run as Server-Sent Events",
            "security": _READER_AUTH,
            "parameters": [_RUN_ID, *_CURSOR_PARAMS, _ACCESS_TOKEN],
            "responses": {
                "200": _SSE_200,
                "204": _SSE_TERMINAL_204,
                **_errors(*_STREAM_ERRORS),
            },
        }
    },
    "/v1/runs/{run_id}/wait": {
        "get": {
            "operationId": "waitRun",
            "summary": "Block until END, or until the timeout",
            "security": _READER_AUTH,
            "parameters": [
                _RUN_ID,
                {
                    "name": "timeout",
                    "in": "query",
                    "required": False,
                    "description": "seconds, default 30, capped at 300",
                    "schema": {"type": "number", "minimum": 0},
                },
                _ACCESS_TOKEN,
            ],
            "responses": {
                "200": _json(_ref("WaitDone"), "The run ended"),
                "202": _json(_ref("WaitRunning"), "Still running at the timeout"),
                **_errors(*_STREAM_ERRORS),
            },
        }
    },
    "/v1/runs/{run_id}/cancel": {
        "post": {
            "operationId": "cancelRun",
            "summary": "Ask the producer to stop (seen in its next write or lease reply)",
            "security": _READER_AUTH,
            "parameters": [_RUN_ID, _ACCESS_TOKEN],
            "requestBody": _body({"type": "object"}, False),
            "responses": {
                "202": _json(_ref("CancelAccepted"), "Cancel requested"),
                **_errors(*_READER_ERRORS, "415"),
            },
        }
    },
    "/threads/{session_id}/runs/{run_id}": {
        "get": {
            "operationId": "getThreadRun",
            "summary": "LangGraph-style run status (what langgraph-sdk polls after a drop)",
            "security": _READER_AUTH,
            "parameters": [_SESSION_ID, _RUN_ID, _ACCESS_TOKEN],
            "responses": {
                "200": _json(_ref("ThreadRun"), "The run status"),
                **_errors(*_READER_ERRORS),
            },
        }
    },
    "/threads/{session_id}/runs/{run_id}/stream": {
        "get": {
            "operationId": "joinThreadRunStream",
            "summary": "The run's SSE at the langgraph-sdk join_stream path",
            "security": _READER_AUTH,
            "parameters": [_SESSION_ID, _RUN_ID, *_CURSOR_PARAMS, _ACCESS_TOKEN],
            "responses": {
                "204": _SSE_TERMINAL_204,
                "200": {
                    **_SSE_200,
                    "headers": {"Location": {"schema": {"type": "string"}}},
                },
                **_errors(*_STREAM_ERRORS),
            },
        }
    },
    "/threads/{session_id}/runs/{run_id}/join": {
        "get": {
            "operationId": "joinThreadRun",
            "summary": "Alias of .../stream",
            "security": _READER_AUTH,
            "parameters": [_SESSION_ID, _RUN_ID, *_CURSOR_PARAMS, _ACCESS_TOKEN],
            "responses": {
                "204": _SSE_TERMINAL_204,
                "200": {
                    **_SSE_200,
                    "headers": {"Location": {"schema": {"type": "string"}}},
                },
                **_errors(*_STREAM_ERRORS),
            },
        }
    },
    "/healthz": {
        "get": {
            "operationId": "healthz",
            "summary": "Liveness",
            "security": [],
            "responses": {"200": _json(_ref("Status"), "Alive")},
        }
    },
    "/readyz": {
        "get": {
            "operationId": "readyz",
            "summary": "Readiness: backend reachable and not draining",
            "security": [],
            "responses": {
                "200": _json(_ref("Status"), "Ready"),
                "503": _err("backend_unavailable / bridge_closed / draining"),
            },
        }
    },
    "/metrics": {
        "get": {
            "operationId": "metrics",
            "summary": "Prometheus text exposition",
            "security": [],
            "responses": {
                "200": {
                    "description": "Metrics",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                }
            },
        }
    },
}

_DOCUMENT: Final[dict[str, Any]] = {
    "openapi": "3.1.0",
    "info": {
        "title": "gateway",
        "version": "0.1.0",
        "description": "Resumable SSE streaming gateway for agent runs. See docs/api.md.",
    },
    "paths": _PATHS,
    "components": {
        "schemas": _SCHEMAS,
        "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer"},
            "accessToken": {"type": "apiKey", "in": "query", "name": "access_token"},
        },
    },
}


def openapi_document() -> dict[str, Any]:
    """A fresh copy of the document (callers may extend it)."""
    return copy.deepcopy(_DOCUMENT)
