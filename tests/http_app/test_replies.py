"""Each reply model is what the document says and, for a value type's reply, what its route
sends (fast: no server, no Redis).

- every reply model of `schemas.py` is in the OpenAPI document with exactly its fields,
  and the same ones required;
- every `ValueReply` is its value type's fields: `of(value)`, for a value with every field
  set (generated from the dataclass's annotations, so a field added there is in the
  sample), gives the model's fields in their order, each the value's own, and reads back
  as the model from JSON, strictly;
- a model that leaves a value field out without a reason, sends one it calls hidden or
  names one the value type does not have cannot be made;
- the routes answer with those bodies: a run claimed, appended to, renewed, ENDed and
  read over the in-process app (memory bridge) answers each with exactly its model's
  fields, in order.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from starlette.testclient import TestClient

from gateway import values
from gateway.http import schemas
from gateway.http.app import create_app
from gateway.http.openapi import openapi_document
from gateway.http.schemas import Reply, ValueReply
from gateway.settings import Settings


def _reply_models(base: type[Reply] = Reply) -> Iterator[type[Reply]]:
    for model in base.__subclasses__():
        if model.__module__ == schemas.__name__:
            yield model
        yield from _reply_models(model)


REPLY_MODELS = [model for model in _reply_models() if model is not ValueReply]
VALUE_REPLIES = [model for model in REPLY_MODELS if issubclass(model, ValueReply)]


def _sample_of(kind: Any, name: str) -> Any:
    """A value of the annotated type, distinct per field (the first choice of a union or
    a literal)."""
    origin = typing.get_origin(kind)
    if origin is typing.Literal:
        return typing.get_args(kind)[0]
    if origin in (typing.Union, types.UnionType):
        return _sample_of(next(a for a in typing.get_args(kind) if a is not type(None)), name)
    if origin is tuple:
        return (f"{name}-1", f"{name}-2")
    if kind is typing.Any:
        return {"field": name}
    samples: dict[Any, Any] = {str: f"{name}-value", bool: True, int: 7, float: 1.5}
    if kind in samples:
        return samples[kind]
    raise AssertionError(f"no sample for {name}: {kind!r} (teach _sample_of the type)")


def _sample(value_type: type[Any]) -> Any:
    hints = typing.get_type_hints(value_type)
    return value_type(
        **{
            field.name: _sample_of(hints[field.name], field.name)
            for field in dataclasses.fields(value_type)
            if field.init
        }
    )


def test_the_five_value_replies_are_found() -> None:
    names = {model.__name__ for model in VALUE_REPLIES}
    assert names == {"Claim", "PublishResult", "EndResult", "LeaseState", "Run"}


def test_every_reply_model_is_in_the_document_with_its_fields() -> None:
    app = create_app(Settings.model_validate({}))
    components = openapi_document(app.routes)["components"]["schemas"]
    for model in REPLY_MODELS:
        schema = components[model.__name__]
        assert list(schema["properties"]) == list(model.model_fields), model.__name__
        required = [name for name, field in model.model_fields.items() if field.is_required()]
        assert schema.get("required", []) == required, model.__name__


@pytest.mark.parametrize("model", VALUE_REPLIES, ids=lambda model: model.__name__)
def test_a_value_reply_is_every_field_of_its_value(model: type[ValueReply]) -> None:
    value = _sample(model.value_type)
    reply = model.of(value)
    assert list(reply) == list(model.model_fields)
    for name, sent in reply.items():
        assert sent is getattr(value, model.renamed.get(name, name)), name
    sent_fields = {model.renamed.get(name, name) for name in reply}
    all_fields = {field.name for field in dataclasses.fields(model.value_type)}
    assert sent_fields | set(model.hidden) == all_fields
    assert not sent_fields & set(model.hidden)
    read = model.model_validate_json(orjson.dumps(reply), strict=True)
    assert orjson.loads(orjson.dumps(read.model_dump())) == orjson.loads(orjson.dumps(reply))


def test_a_model_that_misses_a_value_field_cannot_be_made() -> None:
    with pytest.raises(TypeError, match=r"neither sent nor hidden \['cancel_requested'\]"):

        class LeaseOnly(ValueReply):
            value_type = values.LeaseState

            lease_expires_at: float


def test_a_hidden_field_that_is_sent_or_unknown_cannot_be_made() -> None:
    with pytest.raises(TypeError, match=r"hidden but sent or unknown \['cancel_requested'\]"):

        class Both(ValueReply):
            value_type = values.LeaseState
            hidden = {"cancel_requested": "a reason"}

            lease_expires_at: float
            cancel_requested: bool

    with pytest.raises(TypeError, match=r"hidden but sent or unknown \['epoch'\]"):

        class Stale(ValueReply):
            value_type = values.LeaseState
            hidden = {"epoch": "not a field of LeaseState"}

            lease_expires_at: float
            cancel_requested: bool


def test_a_reply_field_the_value_does_not_have_cannot_be_made() -> None:
    # `Claim` sends the value's `token` as `producer_token`; without saying so:
    wanted = r"not value fields \['producer_token'\], neither sent nor hidden \['token'\]"
    with pytest.raises(TypeError, match=wanted):

        class Unrenamed(ValueReply):
            value_type = values.Claim

            run_id: str
            session_id: str | None
            producer_token: str
            epoch: int
            lease_expires_at: float


def _keys(response: Any, status: int, model: type[Reply]) -> None:
    assert response.status_code == status, response.text
    assert list(response.json()) == list(model.model_fields)
    model.model_validate_json(response.content, strict=True)


def test_the_routes_answer_with_their_value_replies() -> None:
    app = create_app(Settings.model_validate({}))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        claimed = client.post("/v1/runs", json={"session_id": "s1"})
        _keys(claimed, 201, schemas.Claim)
        run_id = claimed.json()["run_id"]
        producer = {"X-Producer-Token": claimed.json()["producer_token"]}
        appended = client.post(f"/v1/runs/{run_id}/events", json={"event": "t"}, headers=producer)
        _keys(appended, 200, schemas.PublishResult)
        renewed = client.post(f"/v1/runs/{run_id}/lease", json={}, headers=producer)
        _keys(renewed, 200, schemas.LeaseState)
        ended = client.post(f"/v1/runs/{run_id}/end", json={"status": "success"}, headers=producer)
        _keys(ended, 200, schemas.EndResult)
        _keys(client.get(f"/v1/runs/{run_id}"), 200, schemas.Run)
