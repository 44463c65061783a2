"""The OpenAPI 3.1 document served at `/openapi.json`, and the request tables of
docs/api.md, both generated from the app's route table and the declared models.

Each endpoint declares what it takes and answers next to its code, with `@document(
Operation(...))`: its summary, who may call it, the models of its body and query
parameters (`schemas.py`, the same ones it parses with), its headers and its replies.
`openapi_document(routes)` walks the route table (`create_app(...).routes`): every
route's path and methods become the document's, its path parameters come from the path
itself, and a route whose endpoint declares nothing is an error, so a route cannot be
served without being documented (tests/http_app/test_openapi.py compares the two).

    scripts/gen-api-docs              # rewrite the generated part of docs/api.md
    scripts/gen-api-docs --check      # exit 1 when docs/api.md is out of date
    scripts/gen-api-docs --openapi    # the document, as JSON
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

import orjson
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.routing import BaseRoute, Mount, Route

from .schemas import ID_SCHEMA, Error, Query

Who = Literal["producer", "subscriber", "operator", "ops"]
Media = Literal[
    "application/json", "text/event-stream", "application/x-ndjson", "text/plain", "text/html"
]


@dataclass(frozen=True, slots=True)
class Header:
    """A request header a route reads."""

    name: str
    description: str
    schema: Mapping[str, Any] = field(default_factory=lambda: {"type": "string"})
    required: bool = False


@dataclass(frozen=True, slots=True)
class Reply:
    """One status a route answers: its description and, unless it has no body, the
    model (JSON) or the media type of that body."""

    description: str
    model: type[BaseModel] | Sequence[type[BaseModel]] | None = None
    media: Media = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)  # name -> description
    array: bool = False  # a bare JSON array of `model`
    more: Mapping[Media, type[BaseModel] | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Operation:
    """What one endpoint takes and answers. `errors` are the error statuses it may
    answer (`error_codes` and `STATUS_MEANINGS` describe each); `who` sets the
    credentials it takes."""

    summary: str
    who: Who
    replies: Mapping[int, Reply]
    errors: Sequence[int] = ()
    body: type[BaseModel] | Sequence[type[BaseModel]] | None = None
    body_required: bool = False
    streamed_body: type[BaseModel] | None = None  # an `application/x-ndjson` body, per line
    query: type[Query] | None = None
    headers: Sequence[Header] = ()
    description: str = ""


# -- the shared pieces ----------------------------------------------------------------------

# What each error status means to a client; the codes under it are generated from their
# one source (`error_codes`).
STATUS_MEANINGS: Final[Mapping[int, str]] = {
    400: "the body is not valid JSON, or the request contradicts itself",
    401: "missing, invalid or expired credentials",
    403: "the credentials do not cover this route, run or session; an open gateway "
    "answers only for loopback Host names",
    404: "no such run (or not a run of this thread); no such path",
    408: "a streamed append's body sent nothing for a whole lease (an error line)",
    409: "the run's or session's state refuses the request",
    413: "body, event or batch over the configured limits",
    415: "a POST without Content-Type: application/json",
    422: "a malformed field, id, name, status, query parameter or cursor",
    429: "this reader or key holds its share of the open streams; retry after Retry-After",
    503: "the backend is unavailable or the gateway is not serving; retry after Retry-After",
}


def error_codes() -> dict[int, list[str]]:
    """Every error code a client can receive, by status: each `GatewayError` class with
    the status of its row in `edge.errors.RULES`, and the HTTP layer's own codes
    (`edge.errors.HTTP_CODES`). (500 is not an answer the API documents.)"""
    from ..errors import GatewayError
    from .edge.errors import HTTP_CODES, rule_of_class

    codes: dict[int, set[str]] = {}
    pending: list[type[GatewayError]] = [GatewayError]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        codes.setdefault(rule_of_class(cls).status, set()).add(cls.code)
    for code, status in HTTP_CODES.items():
        codes.setdefault(status, set()).add(code)
    codes.pop(500, None)
    return {status: sorted(names) for status, names in sorted(codes.items())}


def _error_description(status: int) -> str:
    codes = " / ".join(error_codes().get(status, ()))
    return f"{codes}: {STATUS_MEANINGS[status]}" if codes else STATUS_MEANINGS[status]


PRODUCER_ERRORS: Final = (400, 401, 403, 409, 413, 415, 422, 503)
READER_ERRORS: Final = (401, 403, 404, 422, 503)
STREAM_ERRORS: Final = (*READER_ERRORS, 429)  # what holds a connection has a share
SESSION_ERRORS: Final = (401, 403, 422, 503)

PRODUCER_TOKEN: Final = Header(
    "X-Producer-Token",
    "The producer_token returned by the claim (missing: 422 missing_producer_token)",
    required=True,
)
PRODUCER_SEQ: Final = Header(
    "X-Producer-Seq",
    "Number of the batch's (or the stream's first line's) first event in this lease epoch, "
    "1-based: a retry of the last applied batch returns its ids and appends nothing; past "
    "the next expected number is 409 sequence_gap with expected_seq",
    {"type": "integer", "minimum": 1, "maximum": 2**53 - 1},
)
IDEMPOTENCY_KEY: Final = Header(
    "Idempotency-Key",
    "The claim's idempotency key, as the `idempotency_key` field (400 when both are sent "
    "and differ)",
    {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,200}$"},
)
LAST_EVENT_ID: Final = Header(
    "Last-Event-ID", "Reconnect cursor (wins over the `last_event_id` query parameter)"
)
SSE: Final = Reply(
    "SSE stream: `retry:` first, then `id/event/data` frames, `: heartbeat` comments, and "
    "one terminal frame (docs/api.md)",
    media="text/event-stream",
)
TERMINAL_CURSOR: Final = Reply(
    "The cursor is the id of a terminal frame the client already saw: stop reconnecting"
)

_SECURITY: Final[Mapping[Who, list[dict[str, list[str]]]]] = {
    "producer": [{"bearer": []}],
    "operator": [{"bearer": []}],
    "subscriber": [{"bearer": []}, {"accessToken": []}],
    "ops": [],
}
_ACCESS_TOKEN: Final[dict[str, Any]] = {
    "name": "access_token",
    "in": "query",
    "required": False,
    "description": "Subscriber token, for clients that cannot set headers",
    "schema": {"type": "string"},
}
_PATH_PARAMS: Final[Mapping[str, tuple[str, Mapping[str, Any]]]] = {
    "run_id": ("Run id", {"type": "string", **ID_SCHEMA}),
    "session_id": ("Session (LangGraph thread) id", {"type": "string", **ID_SCHEMA}),
}

_OPERATIONS: dict[Callable[..., Any], Operation] = {}
_E = TypeVar("_E", bound=Callable[..., Any])


def document(operation: Operation) -> Callable[[_E], _E]:
    """Declare what an endpoint takes and answers (every route's endpoint must)."""

    def register(endpoint: _E) -> _E:
        _OPERATIONS[endpoint] = operation
        return endpoint

    return register


# -- the route table ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Served:
    """One method of one path the app serves, with its declaration."""

    method: str
    path: str  # OpenAPI form: `{name}`, convertors dropped
    name: str  # the endpoint's name
    operation: Operation


def served(routes: Iterable[BaseRoute]) -> list[Served]:
    """Every (method, path) of the route table, in its order (`HEAD` is `GET`'s).

    A `Mount` serves everything under its path (`{path}`); its app is documented by the
    operation registered for it (`document_mount`).
    """
    out: list[Served] = []
    for route in routes:
        if isinstance(route, Route):
            endpoint: Any = route.endpoint
            methods = sorted(set(route.methods or ()) - {"HEAD"})
            path = route.path
        elif isinstance(route, Mount):
            endpoint, methods, path = route.app, ["GET"], route.path + "/{path}"
        else:
            raise TypeError(f"undocumentable route {route!r}")
        operation = _OPERATIONS.get(endpoint)
        if operation is None:
            raise LookupError(f"{path} serves {endpoint!r}, which has no @document(...)")
        name = getattr(endpoint, "__name__", None) or getattr(route, "name", None) or path
        for method in methods:
            out.append(Served(method, _openapi_path(path), name, operation))
    return out


def document_mount(app: Any, operation: Operation) -> None:
    """Declare what a mounted app serves (e.g. the static files)."""
    _OPERATIONS[app] = operation


def _openapi_path(path: str) -> str:
    return re.sub(r"\{(\w+):[^}]*\}", r"{\1}", path)  # `{path:path}` -> `{path}`


def _path_names(path: str) -> list[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{")]


# -- the document ---------------------------------------------------------------------------


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _schema_of(models: type[BaseModel] | Sequence[type[BaseModel]]) -> dict[str, Any]:
    if isinstance(models, type):
        return _ref(models)
    return {"oneOf": [_ref(model) for model in models]}


def _models(models: type[BaseModel] | Sequence[type[BaseModel]] | None) -> list[type[BaseModel]]:
    if models is None:
        return []
    return [models] if isinstance(models, type) else list(models)


def _query_params(model: type[Query]) -> list[dict[str, Any]]:
    schema = _clean(model.model_json_schema())
    required = set(schema.get("required", ()))
    params = []
    for name, prop in schema["properties"].items():
        prop = dict(prop)
        description = prop.pop("description", "")
        options = prop.pop("anyOf", None)
        if options:  # `str | None`: a parameter is absent or a string, never `null`
            [prop_type] = [option for option in options if option.get("type") != "null"]
            prop.update(prop_type)
        params.append(
            {
                "name": name,
                "in": "query",
                "required": name in required,
                "description": description,
                "schema": prop,
            }
        )
    return params


def _header_param(header: Header) -> dict[str, Any]:
    return {
        "name": header.name,
        "in": "header",
        "required": header.required,
        "description": header.description,
        "schema": dict(header.schema),
    }


def _reply(reply: Reply) -> dict[str, Any]:
    out: dict[str, Any] = {"description": reply.description}
    content: dict[str, Any] = {}
    if reply.model is not None:
        schema = _schema_of(reply.model)
        content[reply.media] = {
            "schema": {"type": "array", "items": schema} if reply.array else schema
        }
    elif reply.media != "application/json":
        content[reply.media] = {"schema": {"type": "string"}}
    for media, model in reply.more.items():
        content[media] = {"schema": _ref(model) if model is not None else {"type": "string"}}
    if content:
        out["content"] = content
    if reply.headers:
        out["headers"] = {
            name: {"description": text, "schema": {"type": "string"}}
            for name, text in reply.headers.items()
        }
    return out


def _error_reply(status: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "description": _error_description(status),
        "content": {"application/json": {"schema": _ref(Error)}},
    }
    if status in (429, 503):
        out["headers"] = {"Retry-After": {"schema": {"type": "integer"}}}
    return out


def _operation_id(name: str, path: str, used: set[str]) -> str:
    head, *rest = name.split("_")
    candidate = head + "".join(part.title() for part in rest)
    if candidate in used:  # one endpoint at several paths: name it by its last segment
        candidate += "".join(p.title() for p in path.rstrip("/").split("/")[-1:] if "{" not in p)
    while candidate in used:
        candidate += "_"
    used.add(candidate)
    return candidate


def _operation(entry: Served, used: set[str]) -> dict[str, Any]:
    op = entry.operation
    params: list[dict[str, Any]] = []
    for name in _path_names(entry.path):
        description, schema = _PATH_PARAMS.get(name, ("", {"type": "string"}))
        params.append(
            {
                "name": name,
                "in": "path",
                "required": True,
                "description": description,
                "schema": dict(schema),
            }
        )
    params.extend(_header_param(header) for header in op.headers)
    if op.query is not None:
        params.extend(_query_params(op.query))
    if op.who == "subscriber":
        params.append(dict(_ACCESS_TOKEN))
    out: dict[str, Any] = {
        "operationId": _operation_id(entry.name, entry.path, used),
        "summary": op.summary,
        "security": list(_SECURITY[op.who]),
    }
    if op.description:
        out["description"] = op.description
    if params:
        out["parameters"] = params
    if op.body is not None or op.streamed_body is not None:
        content: dict[str, Any] = {}
        if op.body is not None:
            content["application/json"] = {"schema": _schema_of(op.body)}
        if op.streamed_body is not None:
            content["application/x-ndjson"] = {
                "schema": _ref(op.streamed_body),
                "x-stream": "one JSON object per line (docs/protocol.md 3.3)",
            }
        out["requestBody"] = {"required": op.body_required, "content": content}
    responses = {str(status): _reply(reply) for status, reply in op.replies.items()}
    for status in op.errors:
        responses.setdefault(str(status), _error_reply(status))
    out["responses"] = responses
    return out


def _clean(schema: Any) -> Any:
    """The schema without pydantic's generated `title`s of properties (noise in a document
    whose properties are named already)."""
    if isinstance(schema, dict):
        out = {}
        for key, value in schema.items():
            if key == "properties":
                out[key] = {
                    name: {k: _clean(v) for k, v in prop.items() if k != "title"}
                    for name, prop in value.items()
                }
            else:
                out[key] = _clean(value)
        return out
    if isinstance(schema, list):
        return [_clean(item) for item in schema]
    return schema


def _components(entries: Sequence[Served]) -> dict[str, Any]:
    models: dict[type[BaseModel], None] = {Error: None}
    for entry in entries:
        op = entry.operation
        for model in (*_models(op.body), *_models(op.streamed_body)):
            models[model] = None
        for reply in op.replies.values():
            for model in (*_models(reply.model), *(m for m in reply.more.values() if m)):
                models[model] = None
    _, defs = models_json_schema(
        [(model, "validation") for model in models],
        ref_template="#/components/schemas/{model}",
    )
    return {name: _clean(schema) for name, schema in sorted(defs.get("$defs", {}).items())}


def openapi_document(routes: Iterable[BaseRoute]) -> dict[str, Any]:
    """The document for a route table (`create_app(...).routes`)."""
    generated = openapi_document_from(served(routes))
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "gateway",
            "version": "0.1.0",
            "description": "Resumable SSE streaming gateway for agent runs. See docs/api.md.",
        },
        "paths": generated["paths"],
        "components": {
            "schemas": generated["components"]["schemas"],
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "accessToken": {"type": "apiKey", "in": "query", "name": "access_token"},
            },
        },
    }


def openapi_document_from(entries: Sequence[Served]) -> dict[str, Any]:
    """The paths and schemas of the served routes."""
    paths: dict[str, dict[str, Any]] = {}
    used: set[str] = set()
    for entry in entries:
        paths.setdefault(entry.path, {})[entry.method.lower()] = _operation(entry, used)
    return {"paths": paths, "components": {"schemas": _components(entries)}}


# -- docs/api.md ----------------------------------------------------------------------------

BEGIN: Final = "<!-- BEGIN generated by scripts/gen-api-docs: edit gateway/http/schemas.py -->"
END: Final = "<!-- END generated requests -->"
API_MD: Final = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def _type_text(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> str:
    if "$ref" in schema:
        return f"`{schema['$ref'].rsplit('/', 1)[-1]}`"
    if "anyOf" in schema:
        kinds = [_type_text(option, defs) for option in schema["anyOf"]]
        return " or ".join(kinds)
    if "enum" in schema:
        return " \\| ".join(f"`{value}`" for value in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    kind = schema.get("type")
    if kind == "array":
        return f"list of {_type_text(schema.get('items', {}), defs)}"
    if kind == "object":
        return "object"
    if kind is None:
        return "any JSON"
    return {
        "string": "string",
        "number": "number",
        "integer": "integer",
        "boolean": "boolean",
        "null": "null",
    }.get(kind, str(kind))


def _bounds(schema: Mapping[str, Any]) -> str:
    notes: list[str] = []
    if "anyOf" in schema:
        for option in schema["anyOf"]:
            notes.extend(filter(None, [_bounds(option)]))
    for key, text in (
        ("minimum", ">= {}"),
        ("exclusiveMinimum", "> {}"),
        ("maximum", "<= {}"),
        ("minItems", "at least {}"),
        ("pattern", "`{}`"),
    ):
        if key in schema:
            value = schema[key]
            notes.append(text.format(value.strip("^$") if key == "pattern" else value))
    return ", ".join(notes)


def _field_rows(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> list[str]:
    required = set(schema.get("required", ()))
    rows = []
    for name, prop in schema.get("properties", {}).items():
        default = "" if name in required else orjson.dumps(prop.get("default")).decode()
        bounds = _bounds(prop)
        meaning = prop.get("description", "")
        if bounds:
            meaning = f"{meaning} ({bounds})" if meaning else bounds
        rows.append(
            f"| `{name}` | {_type_text(prop, defs)} | {'yes' if name in required else 'no'} "
            f"| {'' if name in required else f'`{default}`'} | {meaning} |"
        )
    return rows


def markdown(routes: Iterable[BaseRoute]) -> str:
    """The generated part of docs/api.md: the route index and each route's request."""
    entries = served(routes)
    document = openapi_document_from(entries)
    defs = document["components"]["schemas"]
    lines = [
        "| method | path | who | success | what |",
        "|---|---|---|---|---|",
    ]
    for entry in entries:
        statuses = ", ".join(str(s) for s in entry.operation.replies if s < 400)
        lines.append(
            f"| `{entry.method}` | `{entry.path}` | {entry.operation.who} | {statuses} "
            f"| {entry.operation.summary} |"
        )
    for entry in entries:
        op = document["paths"][entry.path][entry.method.lower()]
        # (every subscriber route takes `access_token`: said once, above the tables)
        params = [
            p
            for p in op.get("parameters", ())
            if p["in"] != "path" and p["name"] != _ACCESS_TOKEN["name"]
        ]
        body = op.get("requestBody")
        if not params and not body:
            continue
        lines += ["", f"#### `{entry.method} {entry.path}`", ""]
        if params:
            lines += [
                "| parameter | in | type | required | default | meaning |",
                "|---|---|---|---|---|---|",
            ]
            for p in params:
                schema = p["schema"]
                default = schema.get("default")
                lines.append(
                    f"| `{p['name']}` | {p['in']} | {_type_text(schema, defs)} "
                    f"| {'yes' if p['required'] else 'no'} "
                    f"| {'' if default is None else f'`{orjson.dumps(default).decode()}`'} "
                    f"| {p.get('description', '')}"
                    f"{f' ({_bounds(schema)})' if _bounds(schema) else ''} |"
                )
        if body:
            for media, content in body["content"].items():
                ref = content["schema"]
                names = [r["$ref"] for r in ref.get("oneOf", [ref])]
                models = " or ".join(f"`{name.rsplit('/', 1)[-1]}`" for name in names)
                need = "required" if body["required"] else "optional"
                per_line = ", one per line" if media == "application/x-ndjson" else ""
                if lines[-1]:
                    lines.append("")
                lines.append(f"Body ({need}, `{media}`{per_line}): {models}.")
        for name in _body_models(op):
            schema = defs[name]
            if not schema.get("properties"):
                lines += ["", f"`{name}`: {schema.get('description', '').splitlines()[0]}"]
                continue
            lines += [
                "",
                f"`{name}`: {schema.get('description', '').splitlines()[0]}",
                "",
                "| field | type | required | default | meaning |",
                "|---|---|---|---|---|",
                *_field_rows(schema, defs),
            ]
    return "\n".join(lines) + "\n"


def _body_models(op: Mapping[str, Any]) -> list[str]:
    names: list[str] = []
    for content in op.get("requestBody", {}).get("content", {}).values():
        ref = content["schema"]
        for item in ref.get("oneOf", [ref]):
            name = item["$ref"].rsplit("/", 1)[-1]
            if name not in names:
                names.append(name)
    return names


def with_generated(text: str, generated: str) -> str:
    """`text` (docs/api.md) with the part between the markers replaced."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n\n" + generated + "\n" + text[end:]


def _app_routes() -> list[BaseRoute]:
    from ..settings import Settings
    from .app import create_app

    return list(create_app(Settings.model_validate({})).routes)


def main(argv: Sequence[str] | None = None) -> int:
    """`scripts/gen-api-docs`: rewrite (or `--check`) docs/api.md, or print the document."""
    parser = argparse.ArgumentParser(prog="scripts/gen-api-docs")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true", help="exit 1 if docs/api.md is stale")
    group.add_argument("--openapi", action="store_true", help="print the OpenAPI document")
    args = parser.parse_args(argv)
    routes = _app_routes()
    if args.openapi:
        sys.stdout.buffer.write(orjson.dumps(openapi_document(routes), option=orjson.OPT_INDENT_2))
        return 0
    current = API_MD.read_text(encoding="utf-8")
    wanted = with_generated(current, markdown(routes))
    if args.check:
        if wanted != current:
            print("docs/api.md is out of date: run scripts/gen-api-docs")
            return 1
        return 0
    if wanted != current:
        API_MD.write_text(wanted, encoding="utf-8")
    return 0
