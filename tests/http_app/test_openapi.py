"""The OpenAPI document and docs/api.md come from the route table and the declared models.

- every (method, path) the app serves is in the document, and nothing else is: a route
  added without `@document(...)` fails here (and the app refuses to describe itself);
- `/openapi.json` serves exactly what the generator builds;
- docs/api.md's generated tables are up to date (`scripts/gen-api-docs` rewrites them);
- the append route's hand parser (kept for speed) accepts and refuses what its declared
  models `Event` / `EventBatch` do, so the document describes what the route does.
"""

from __future__ import annotations

import gc
import re
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.testclient import TestClient

from gateway.errors import GatewayError
from gateway.http.app import create_app
from gateway.http.openapi import API_MD, markdown, openapi_document, with_generated
from gateway.http.routes.producer import parse_events
from gateway.http.schemas import ClaimRequest, Event, EventBatch, LimitQuery
from gateway.settings import Settings


def _app() -> Any:
    return create_app(Settings.model_validate({}))


def _served(routes: list[Any]) -> set[tuple[str, str]]:
    """(method, path) of every route, walked independently of the generator."""
    out: set[tuple[str, str]] = set()
    for route in routes:
        if isinstance(route, Route):
            path = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)
            out |= {(method, path) for method in route.methods or () if method != "HEAD"}
        elif isinstance(route, Mount):
            out.add(("GET", route.path + "/{path}"))
        else:
            raise AssertionError(f"a route the test does not know: {route!r}")
    return out


def test_the_document_lists_every_route_the_app_serves_and_nothing_else() -> None:
    app = _app()
    document = openapi_document(app.routes)
    documented = {
        (method.upper(), path) for path, item in document["paths"].items() for method in item
    }
    assert documented == _served(app.routes)
    for path in (
        "/v1/sessions",
        "/v1/sessions/{session_id}/turns",
        "/v1/sessions/{session_id}/ui-messages",
        "/v1/sessions/{session_id}/ui-stream",
        "/v1/sessions/{session_id}/stream",
    ):
        assert path in document["paths"], path


def test_a_route_without_a_declaration_cannot_be_documented() -> None:
    async def undocumented(_request: Request) -> Response:
        return Response()

    with pytest.raises(LookupError, match="/v1/new"):
        openapi_document([*_app().routes, Route("/v1/new", undocumented, methods=["GET"])])


def test_the_served_document_is_the_generated_one() -> None:
    app = _app()
    served = TestClient(app).get("/openapi.json")
    assert served.status_code == 200
    assert served.json() == openapi_document(app.routes)


def test_media_types_of_the_streams_and_the_streamed_append() -> None:
    paths = openapi_document(_app().routes)["paths"]
    events = paths["/v1/runs/{run_id}/events"]["post"]
    assert set(events["requestBody"]["content"]) == {"application/json", "application/x-ndjson"}
    assert "application/x-ndjson" in events["responses"]["200"]["content"]
    for path in (
        "/v1/runs/{run_id}/stream",
        "/threads/{session_id}/runs/{run_id}/stream",
        "/threads/{session_id}/runs/{run_id}/join",
        "/v1/sessions/{session_id}/stream",
        "/v1/sessions/{session_id}/ui-stream",
    ):
        assert "text/event-stream" in paths[path]["get"]["responses"]["200"]["content"], path
    assert "text/plain" in paths["/metrics"]["get"]["responses"]["200"]["content"]
    limit = next(
        p
        for p in paths["/v1/sessions/{session_id}/ui-messages"]["get"]["parameters"]
        if p["name"] == "limit"
    )
    assert limit["schema"] == {"type": "integer", "minimum": 1, "maximum": 200, "default": 50}


def test_docs_api_md_is_up_to_date() -> None:
    current = API_MD.read_text(encoding="utf-8")
    assert with_generated(current, markdown(_app().routes)) == current, (
        "docs/api.md is out of date: run scripts/gen-api-docs"
    )


_STATE: Any = SimpleNamespace(settings=SimpleNamespace(max_batch_events=3))


def _outcome(parse: Any) -> str:
    try:
        parse()
    except GatewayError as exc:
        return exc.code
    return "ok"


@pytest.mark.parametrize(
    "body",
    [
        {"event": "token", "data": {"text": "hé"}},
        {"event": "token"},
        {"event": "token", "data": None},
        {"event": "token", "data": 2**63},
        {"event": "token", "data": [1, {"a": []}]},
        {"data": 1},
        {"event": 1, "data": 1},
        {"event": "has space"},
        {"event": "a:b"},
        {"event": "x" * 65},
        {"event": "end"},
        {"event": "turn_end", "data": {}},
        {"event": "token", "evnt": 1},
        {"events": [{"event": "a"}, {"event": "b", "data": 2}]},
        {"events": []},
        {"events": {}},
        {"events": "a"},
        {"events": [1]},
        {"events": [{"event": "a", "x": 1}]},
        {"events": [{"event": "gap"}]},
        {"events": [{"event": "a"}], "event": "b"},
        {},
    ],
)
def test_the_hand_parsed_append_matches_its_declared_models(body: dict[str, Any]) -> None:
    declared = _outcome(lambda: (EventBatch if "events" in body else Event).parse(body))
    assert _outcome(lambda: parse_events(body, _STATE)) == declared


def test_a_batch_over_the_limit_is_too_large_before_anything_else() -> None:
    body = {"events": [{"event": "a"}] * 4}
    assert _outcome(lambda: parse_events(body, _STATE)) == "too_large"


def test_declared_bodies_answer_as_the_gateway_always_did() -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"evnt": 1}, "unexpected field(s): evnt"),
        ({"run_id": 3}, "run_id must be a string"),
        ({"takeover": 1}, "takeover must be a boolean"),
        ({"input_message": []}, "input_message must be a JSON object"),
        ({"lease_seconds": 0}, "lease_seconds must be a finite number > 0"),
        ({"lease_seconds": 10_000}, "lease_seconds must be at most 3600"),
        ({"lease_seconds": "5"}, "lease_seconds must be a number"),
    ]
    for body, detail in cases:
        with pytest.raises(GatewayError) as caught:
            ClaimRequest.parse(body, max_lease_seconds=3600.0)
        assert (caught.value.code, str(caught.value)) == ("invalid_input", detail), body
    claim = ClaimRequest.parse({"run_id": "r1", "takeover": None, "lease_seconds": 5})
    assert (claim.run_id, claim.takeover, claim.lease_seconds) == ("r1", None, 5.0)
    assert LimitQuery.parse({"limit": "7", "access_token": "t"}).limit == 7
    with pytest.raises(GatewayError, match="limit must be an integer between 1 and 200"):
        LimitQuery.parse({"limit": "+7"})


def test_the_error_table_is_derived_from_the_error_classes_and_http_codes() -> None:
    """A new error class appears under its status (its row in RULES, by its MRO) and
    every code the HTTP layer declares under its own, with nobody editing a table."""
    from gateway.errors import SessionActive
    from gateway.http.edge.errors import HTTP_CODES
    from gateway.http.openapi import error_codes

    class ProbeRefusal(SessionActive):
        code = "probe_refusal"

    try:
        codes = error_codes()
        assert "probe_refusal" in codes[409]
        for code, status in HTTP_CODES.items():
            assert code in codes[status]
        assert "turn_exists" in codes[409] and "too_many_streams" in codes[429]
        assert 500 not in codes
    finally:
        del ProbeRefusal
        gc.collect()  # (__subclasses__ holds weak references: the probe is gone)
    assert "probe_refusal" not in error_codes()[409]
