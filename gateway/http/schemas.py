"""What each route takes and answers, declared once as pydantic models.

The routes parse their bodies and query parameters with these models
(`ClaimRequest.parse(body, max_lease_seconds=...)`); the OpenAPI document and the
request tables of docs/api.md are generated from them (`openapi.py`). A field's rules
live in one place: its type, its `Field` (default, description, the bounds the
document shows) and, where the gateway's own check says more than a type can (ids,
names, seconds up to a setting), a validator that calls that check, so the error a
client gets is the one it always got.

Errors keep their shapes: a body that is not an object, an unknown field, a missing or
mistyped field or a value out of range is `422 invalid_input` with a `detail` naming
the field; what a check raises itself (`reserved_event_name`, `too_large`) passes
through as it is.

The append route is the one exception: an agent POSTs it once per token, and the
declared form costs there (measured in process: `Event.parse` about 3 us against the
hand parser's 0.75 us, `EventBatch.parse` of 50 events 100-150 us against 45 us, where
the whole append costs about 9 us of CPU per event). So `producer.py` parses
`{"event", "data"}` / `{"events": [...]}` by hand, with the field sets taken from
`Event` and `EventBatch` here (which also give the document), and
`tests/http_app/test_openapi.py` checks that the two accept and refuse the same bodies.
Reply models are not validated on the way out (no cost per reply): the routes send plain
dicts. A reply that is a value type of `values.py` (`ValueReply`: the claim, an append's
and an END's result, the lease, the run record) is built only by its model's `of(value)`,
from the model's fields, and the model is checked against the value type when it is
made: every value field is sent or named in `hidden` with the reason.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, Final, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from .. import values
from ..bridge.turn_keys import KEY_PATTERN
from ..errors import GatewayError, InvalidInput
from ..names import ID_PATTERN, check_event_name, check_run_id, check_session_id
from ..sessions.base import DEFAULT_LIMIT, MAX_LIMIT, parse_flag, parse_limit
from ..values import EndStatus
from .edge.bodies import check_seconds, query_seconds_value

ID_SCHEMA: Final[dict[str, Any]] = {"pattern": f"^{ID_PATTERN}$", "maxLength": 128}
EVENT_NAME_PATTERN: Final = r"^[!-9;-~]{1,64}$"


# -- field types ----------------------------------------------------------------------------


def _lease_seconds(value: float, info: ValidationInfo) -> float:
    maximum = (info.context or {}).get("max_lease_seconds", float("inf"))
    return check_seconds("lease_seconds", value, maximum=maximum)


RunId = Annotated[str, AfterValidator(check_run_id), Field(json_schema_extra=dict(ID_SCHEMA))]
SessionId = Annotated[
    str, AfterValidator(check_session_id), Field(json_schema_extra=dict(ID_SCHEMA))
]
EventName = Annotated[
    str, AfterValidator(check_event_name), Field(json_schema_extra={"pattern": EVENT_NAME_PATTERN})
]
LeaseSeconds = Annotated[
    float,
    AfterValidator(_lease_seconds),
    Field(json_schema_extra={"exclusiveMinimum": 0}),
]
JsonObject = dict[str, Any]
IdempotencyKey = Annotated[
    str,
    Field(json_schema_extra={"pattern": f"^{KEY_PATTERN}$", "maxLength": 200}),
]


# -- parsing --------------------------------------------------------------------------------


_EXPECTED: Final = {
    "string_type": "a string",
    "bool_type": "a boolean",
    "dict_type": "a JSON object",
    "model_type": "a JSON object",
    "float_type": "a number",
    "int_type": "an integer",
    "list_type": "a list",
}


def _where(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "the body"


def input_error(error: ErrorDetails) -> GatewayError:
    """The gateway's error for pydantic's first complaint: a check's own error as it
    was raised, otherwise `invalid_input` naming the field."""
    cause = error.get("ctx", {}).get("error")
    if isinstance(cause, GatewayError):
        return cause
    where = _where(error["loc"])
    kind = error["type"]
    if kind == "missing":
        return InvalidInput(f"{where} is required")
    if kind in _EXPECTED:
        return InvalidInput(f"{where} must be {_EXPECTED[kind]}")
    if kind == "too_short":
        return InvalidInput(f"{where} must not be empty")
    if kind == "literal_error":
        return InvalidInput(f"{where} must be one of {error.get('ctx', {}).get('expected')}")
    return InvalidInput(f"{where}: {error['msg']}")


class Declared(BaseModel):
    """A request body or a set of query parameters: validated strictly (JSON types as
    they are, no coercion: `"1"` is not a number, `1` is not a boolean)."""

    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")

    @classmethod
    def parse(cls, value: Mapping[str, Any], **context: Any) -> Self:
        """`value` validated (a 4xx for anything it does not accept, never a 500)."""
        try:
            return cls.model_validate(
                value if type(value) is dict else dict(value), context=context
            )
        except ValidationError as exc:
            raise input_error(exc.errors()[0]) from None


class Body(Declared):
    """A JSON object body; unknown fields are refused (a typo never passes silently)."""

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        if not isinstance(data, dict):  # (named by its place: the body, `events[3]`)
            raise PydanticCustomError("dict_type", "not a JSON object")
        unknown = sorted(set(data) - set(cls.model_fields))
        if unknown:
            raise InvalidInput(f"unexpected field(s): {', '.join(unknown)[:200]}")
        return data


class Query(Declared):
    """Query parameters, as strings; parameters a model does not name are ignored (the
    credentials, the cursor, what SDKs add)."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")


# -- request bodies -------------------------------------------------------------------------


class ClaimRequest(Body):
    """`POST /v1/runs`: every field optional (an empty body is `{}`)."""

    run_id: RunId | None = Field(None, description="The run to claim; none: a new id")
    session_id: SessionId | None = Field(
        None, description="The session (chat) the run is a turn of; fixed by the first claim"
    )
    lease_seconds: LeaseSeconds | None = Field(
        None, description="Lease length, at most `max_lease_seconds`; none: the default"
    )
    takeover: bool | None = Field(
        None, description="`true` takes a live lease from its holder (fencing it)"
    )
    input_message: JsonObject | None = Field(
        None, description="The turn's input message (stored in the turn record)"
    )
    idempotency_key: IdempotencyKey | None = Field(
        None,
        description="Starts the turn at most once per session (e.g. the client's message "
        "id; needs `session_id`); also the `Idempotency-Key` header. A second claim with "
        "it gets `409 turn_exists` with the first run's `run_id`",
    )
    metadata: JsonObject | None = Field(None, description="Free-form; checked, not stored")


class Event(Body):
    """One event: `POST /v1/runs/{run_id}/events` body, a batch item, a streamed line."""

    event: EventName = Field(
        description="Event name: 1-64 printable ASCII chars, no `:` or space, not reserved"
    )
    data: Any = Field(None, description="Any JSON value, kept exactly (default `null`)")


class EventBatch(Body):
    """Several events, appended atomically in one bridge call."""

    events: list[Event] = Field(
        min_length=1, description="1 to `max_batch_events` events, in order"
    )


class EndRequest(Body):
    """`POST /v1/runs/{run_id}/end`."""

    status: EndStatus = Field(description="How the run ended")
    error: JsonObject | None = Field(None, description="What went wrong (an object), or null")


class LeaseRequest(Body):
    """`POST /v1/runs/{run_id}/lease`: the body is optional."""

    lease_seconds: LeaseSeconds | None = Field(
        None, description="New lease length, as for the claim; none: the default"
    )


class CancelRequest(Declared):
    """`POST /v1/runs/{run_id}/cancel`: no body needed; any JSON object sent is ignored."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"additionalProperties": True})


# -- query parameters -----------------------------------------------------------------------


def _limit(value: Any) -> int:
    return parse_limit(value)


def _flag(name: str) -> BeforeValidator:
    return BeforeValidator(lambda value: parse_flag(value, name))


class LimitQuery(Query):
    """`?limit=`: how many, newest first."""

    limit: Annotated[int, BeforeValidator(_limit)] = Field(
        DEFAULT_LIMIT, ge=1, le=MAX_LIMIT, description="How many, the newest ones"
    )


class SessionsQuery(LimitQuery):
    """`GET /v1/sessions`."""

    parked: Annotated[bool, _flag("parked")] = Field(
        False, description="Only sessions whose newest turn is parked (with its state)"
    )


class DeleteSessionQuery(Query):
    """`DELETE /v1/sessions/{session_id}`."""

    retire: Annotated[bool, _flag("retire")] = Field(
        True, description="`true` retires the session for good; `false` clears its turns"
    )


class WaitQuery(Query):
    """`GET /v1/runs/{run_id}/wait`."""

    timeout: Annotated[
        float, BeforeValidator(lambda raw: query_seconds_value("timeout", raw, 30.0))
    ] = Field(30.0, ge=0, description="Seconds (ASCII digits, optional fraction); above 300: 300")


class StreamQuery(Query):
    """What a reader that cannot set headers passes in the URL (an `EventSource`)."""

    last_event_id: str | None = Field(
        None, description="Reconnect cursor when the `Last-Event-ID` header cannot be set"
    )


# -- replies (the document only) ------------------------------------------------------------


class Reply(BaseModel):
    """A reply body as the routes build it (documented, not validated)."""

    model_config = ConfigDict(extra="allow")


class ValueReply(Reply):
    """A reply that is one value type's fields: `of(value)` builds it from this model's
    fields (in their order, each value as the value type holds it), so a field declared
    here reaches every reply. Each field of `value_type` is a field here (under its own
    name, or the one `renamed` gives it) or is in `hidden` with the reason it is not
    sent; otherwise the class cannot be made, so a field added to the value type cannot
    silently miss the reply (and `tests/http_app/test_replies.py` holds each model to
    the document)."""

    value_type: ClassVar[type[Any]]
    renamed: ClassVar[Mapping[str, str]] = {}  # reply field -> the value's field
    hidden: ClassVar[Mapping[str, str]] = {}  # value field -> why the reply leaves it out
    # `of(value)`: the reply body for `value` (an instance of `value_type`).
    of: ClassVar[Callable[[Any], dict[str, Any]]]

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        names = tuple(cls.model_fields)
        sources = tuple(cls.renamed.get(name, name) for name in names)
        fields = {field.name for field in dataclasses.fields(cls.value_type)}
        unknown = set(sources) - fields
        unsent = fields - set(sources) - set(cls.hidden)
        stale = set(cls.hidden) & (set(sources) | (set(cls.hidden) - fields))
        if unknown or unsent or stale:
            raise TypeError(
                f"{cls.__name__} does not mirror {cls.value_type.__name__}: "
                f"not value fields {sorted(unknown)}, neither sent nor hidden "
                f"{sorted(unsent)}, hidden but sent or unknown {sorted(stale)}"
            )
        cls.of = staticmethod(_builder(names, sources))


def _builder(names: tuple[str, ...], sources: tuple[str, ...]) -> Callable[[Any], dict[str, Any]]:
    """`value -> {"<name>": value.<source>, ...}`: one `attrgetter` for every field (the
    append's reply is built once per token)."""
    get = operator.attrgetter(*sources)
    if len(sources) == 1:
        (name,) = names
        return lambda value: {name: get(value)}
    return lambda value: dict(zip(names, get(value), strict=True))


class Error(Reply):
    """Every error: `{"error": "<code>", "detail": "<text>"}`."""

    error: str
    detail: str
    expected_seq: int | None = Field(None, description="sequence_*: the next expected number")


class Claim(ValueReply):
    value_type = values.Claim
    renamed = {"producer_token": "token"}

    run_id: str
    session_id: str | None
    producer_token: str
    epoch: int
    lease_expires_at: float = Field(description="unix seconds")


class PublishResult(ValueReply):
    value_type = values.PublishResult
    hidden = {
        "session_id": "the bridge's, to update the session's turn",
        "already_applied": "the gateway's count: a retry's events answer as they first did",
    }

    ids: list[str]
    cancel_requested: bool


class EndResult(ValueReply):
    value_type = values.EndResult
    hidden = {
        "session_id": "the bridge's, to update the session's turn",
        "applied": "the recovery END's (`streaming/liveness.py`), not the producer's",
        "legacy_scanned": "a cost in Redis, counted by the metrics",
    }

    id: str | None
    deduplicated: bool


class LeaseState(ValueReply):
    value_type = values.LeaseState

    lease_expires_at: float
    cancel_requested: bool


RunStatus = Literal["running", "success", "error", "cancelled", "interrupted", "producer_lost"]


class Run(ValueReply):
    value_type = values.RunInfo
    hidden = {
        "epoch": "the lease is the producer's: readers see the run, not who holds it",
        "lease_expires_at": "the lease is the producer's: readers see the run, not who holds it",
        "log_exists": "the gateway's own (a run without a log answers by its status)",
    }

    run_id: str
    session_id: str | None
    status: RunStatus
    created_at: float
    updated_at: float
    first_event_id: str | None
    last_event_id: str | None
    retained_events: int = Field(ge=0)
    cancel_requested: bool
    error: Any = Field(description="the END's error object, or null")


class WaitDone(Reply):
    status: EndStatus
    last_event_id: str | None


class WaitRunning(Reply):
    status: Literal["running"]


class CancelAccepted(Reply):
    run_id: str
    cancel_requested: bool


class ThreadRun(Reply):
    run_id: str
    thread_id: str
    status: Literal["running", "success", "error", "interrupted"]


class ThreadCancelled(Reply):
    run_id: str
    thread_id: str
    cancel_requested: bool
    status: Literal["running", "success", "error", "interrupted"] | None = Field(
        None, description="`wait=1` only: the run's status when the answer was sent"
    )


class Status(Reply):
    status: str
    warnings: list[JsonObject] | None = Field(None, description="readyz: e.g. eviction policy")


class SessionRow(Reply):
    session_id: str
    last_updated: float
    turn_count: int
    last_state: str | None = Field(None, description="only with `parked=true`")


class SessionList(Reply):
    sessions: list[SessionRow]


class TurnList(Reply):
    turns: list[JsonObject] = Field(description="turn records, oldest first (docs/protocol.md §6)")


class SessionDeleted(Reply):
    session_id: str
    retired: bool
    removed_runs: list[str]


class UIMessage(Reply):
    """An AI SDK `UIMessage`."""

    id: str
    role: Literal["user", "assistant"]
    parts: list[JsonObject]
    metadata: JsonObject | None = None


class AppendAck(Reply):
    """One line of a streamed append's reply (`application/x-ndjson`): an acknowledgement
    `{"ids", "next_seq"?, "cancel_requested"}`, then `{"done", "count", "last_id"}` or an
    error line `{"error", "detail", "applied", "next_seq"?}`."""

    ids: list[str] | None = None
    next_seq: int | None = None
    cancel_requested: bool | None = None
    done: bool | None = None
    count: int | None = None
    last_id: str | None = None
    error: str | None = None
    detail: str | None = None
    applied: int | None = None


REQUEST_MODELS: Final[tuple[type[BaseModel], ...]] = (
    ClaimRequest,
    Event,
    EventBatch,
    EndRequest,
    LeaseRequest,
    CancelRequest,
)
