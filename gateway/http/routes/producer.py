"""Producer routes: claim a run, append events (one or a batch), END it, renew the lease.

Writes carry the producer token in `X-Producer-Token`; a missing token is a 422
(`missing_producer_token`), a stale or wrong one the bridge's `409 fenced`. Appends may
be numbered with `X-Producer-Seq` (see `gateway.sequence`), which makes them safe to retry.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Final

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ...errors import InvalidInput, PayloadTooLarge, StreamEnded
from ...names import check_event_name, check_run_id
from ...sequence import HEADER as SEQ_HEADER
from ...sequence import parse_seq_header
from ...values import RawJSON, encode_json
from ..edge import access
from ..edge.bodies import parse_json_object, read_json_object, reject_unknown, req_str
from ..edge.errors import HttpError, RunEndedOnClaim
from ..edge.routing import DirectRoute
from ..openapi import (
    IDEMPOTENCY_KEY,
    PRODUCER_ERRORS,
    PRODUCER_SEQ,
    PRODUCER_TOKEN,
    Operation,
    Reply,
    document,
)
from ..responses import json_response
from ..schemas import (
    AppendAck,
    Claim,
    ClaimRequest,
    EndRequest,
    EndResult,
    Event,
    EventBatch,
    LeaseRequest,
    LeaseState,
    PublishResult,
)
from ..state import GatewayState, gateway_state
from .append_stream import AppendStreamResponse, is_streamed

# The append route parses by hand (an agent POSTs it once per token; `schemas.py`), with
# the fields its declared models name.
_EVENT_FIELDS: Final = frozenset(Event.model_fields)
_BATCH_FIELDS: Final = frozenset(EventBatch.model_fields)


def producer_token(request: Request) -> str:
    token = request.headers.get("x-producer-token")
    if not token:
        raise HttpError("missing_producer_token", "the X-Producer-Token header is required")
    return token


def _run_id(request: Request) -> str:
    return check_run_id(request.path_params["run_id"])


@document(
    Operation(
        "Claim a run (create it, or take over an expired or forced lease)",
        "producer",
        {201: Reply("The producer lease", Claim)},
        PRODUCER_ERRORS,
        body=ClaimRequest,
        headers=(IDEMPOTENCY_KEY,),
    )
)
async def claim_run(request: Request) -> Response:
    access.producer(request)
    state = gateway_state(request)
    body = ClaimRequest.parse(
        await read_json_object(request, state.settings.max_body_bytes, allow_empty=True),
        max_lease_seconds=state.settings.max_lease_seconds,
    )
    run_id = body.run_id if body.run_id is not None else uuid.uuid4().hex
    try:
        claim = await state.bridge.claim(
            run_id,
            session_id=body.session_id,
            lease_seconds=body.lease_seconds,
            takeover=bool(body.takeover),
            input_message=body.input_message,  # the turn opens in the claim's own step
            # a second claim with it gets 409 turn_exists (bridge/turn_keys.py)
            idempotency_key=_idempotency_key(request, body.idempotency_key),
        )
    except StreamEnded as exc:
        raise RunEndedOnClaim(str(exc) or f"run {run_id} has ended") from None
    return json_response(Claim.of(claim), 201)


def _idempotency_key(request: Request, in_body: str | None) -> str | None:
    """The claim's idempotency key: the body field or the `Idempotency-Key` header; both
    may be sent only when they agree (400 otherwise). Its form is checked by the bridge."""
    header = request.headers.get("idempotency-key")
    if header is not None and in_body is not None and header != in_body:
        raise HttpError(
            "invalid_request",
            "the Idempotency-Key header and the idempotency_key field differ; send one",
        )
    return in_body if in_body is not None else header


def _one_event(raw: Any, where: str) -> tuple[str, Any]:
    if not isinstance(raw, dict):
        raise InvalidInput(f'{where} must be a JSON object {{"event", "data"}}')
    reject_unknown(raw, _EVENT_FIELDS)
    return check_event_name(req_str(raw, "event")), raw.get("data")


def parse_events(body: dict[str, Any], state: GatewayState) -> list[tuple[str, Any]]:
    """`{"event", "data"}` or `{"events": [...]}`, within the batch size limit."""
    settings = state.settings
    if "events" not in body:
        return [_one_event(body, "the body")]
    reject_unknown(body, _BATCH_FIELDS)
    raw = body["events"]
    if not isinstance(raw, list) or not raw:
        raise InvalidInput('events must be a non-empty list of {"event", "data"} objects')
    if len(raw) > settings.max_batch_events:
        raise PayloadTooLarge(
            f"a batch holds at most {settings.max_batch_events} events (got {len(raw)})"
        )
    return [_one_event(item, f"events[{i}]") for i, item in enumerate(raw)]


def encode_events(events: list[tuple[str, Any]], limit: int) -> list[tuple[str, Any]]:
    """Each payload encoded once, here, as the bytes every subscriber will receive.

    The size limit applies to those exact bytes (re-encoding parsed JSON can grow it:
    `1e5` becomes `100000.0`); the bridge publishes them as they are (`RawJSON`).
    """
    return [(name, _encoded(data, index, limit)) for index, (name, data) in enumerate(events)]


def _encoded(data: Any, index: int, limit: int) -> RawJSON:
    try:
        payload = encode_json(data)
    except orjson.JSONEncodeError as exc:  # e.g. nesting deeper than orjson encodes
        raise InvalidInput(f"data cannot be encoded as JSON: {exc}") from None
    if len(payload) > limit:
        raise PayloadTooLarge(f"event {index} data is {len(payload)} bytes; the limit is {limit}")
    return RawJSON(payload)


def parse_line(line: bytes, state: GatewayState) -> tuple[str, Any]:
    """One line of a streamed append: (name, encoded payload), checked as an event of a
    batch is (`append_stream.py`)."""
    name, data = _one_event(parse_json_object(line, "the line"), "the line")
    return name, _encoded(data, 0, state.settings.max_event_bytes)


@document(
    Operation(
        "Append one event or a batch (atomically), or stream a turn's events",
        "producer",
        {
            200: Reply(
                "The assigned ids and the cancel flag; for a streamed body, one ack line per "
                "append, then `done` or an error line",
                PublishResult,
                more={"application/x-ndjson": AppendAck},
            )
        },
        (*PRODUCER_ERRORS, 429),
        body=(Event, EventBatch),
        body_required=True,
        streamed_body=Event,
        headers=(PRODUCER_TOKEN, PRODUCER_SEQ),
    )
)
async def publish_events(request: Request) -> Response:
    principal = access.producer(request)
    state = gateway_state(request)
    run_id = _run_id(request)
    token = producer_token(request)
    if is_streamed(request):  # one request for a whole turn (PROTOCOL 3.3)
        seq = parse_seq_header(request.headers.get(SEQ_HEADER))
        return AppendStreamResponse(
            request=request,
            state=state,
            run_id=run_id,
            token=token,
            seq=seq,
            parse=lambda line: parse_line(line, state),
            # whose streams these are: the API key however it was presented (open mode: all)
            holder=principal.share_key or "open",
        )
    body = await read_json_object(request, state.settings.max_body_bytes, allow_empty=False)
    events = parse_events(body, state)
    encoded = encode_events(events, state.settings.max_event_bytes)
    seq = parse_seq_header(request.headers.get(SEQ_HEADER))
    if seq is not None:
        result = await state.bridge.publish_many(run_id, encoded, producer_token=token, seq=seq)
    elif len(encoded) == 1:
        result = await state.bridge.publish(
            run_id, encoded[0][0], encoded[0][1], producer_token=token
        )
    else:
        result = await state.bridge.publish_many(run_id, encoded, producer_token=token)
    if result.appended:  # events applied before were counted the first time
        state.metrics.events_published.inc(result.appended)
    return json_response(PublishResult.of(result))


@document(
    Operation(
        "Append the END (idempotent)",
        "producer",
        {200: Reply("The END's id; deduplicated when it existed", EndResult)},
        PRODUCER_ERRORS,
        body=EndRequest,
        body_required=True,
        headers=(PRODUCER_TOKEN,),
    )
)
async def end_run(request: Request) -> Response:
    access.producer(request)
    state = gateway_state(request)
    run_id = _run_id(request)
    token = producer_token(request)
    body = EndRequest.parse(
        await read_json_object(request, state.settings.max_body_bytes, allow_empty=False)
    )
    started = time.perf_counter()
    try:
        result = await state.bridge.publish_end(
            run_id, body.status, body.error, producer_token=token
        )
    except orjson.JSONEncodeError as exc:
        raise InvalidInput(f"error cannot be encoded as JSON: {exc}") from None
    state.metrics.end_published(result, started)
    return json_response(EndResult.of(result))


@document(
    Operation(
        "Renew the producer lease without writing an event",
        "producer",
        {200: Reply("The new expiry, and the cancel flag", LeaseState)},
        PRODUCER_ERRORS,
        body=LeaseRequest,
        headers=(PRODUCER_TOKEN,),
    )
)
async def renew_lease(request: Request) -> Response:
    access.producer(request)
    state = gateway_state(request)
    run_id = _run_id(request)
    token = producer_token(request)
    body = LeaseRequest.parse(
        await read_json_object(request, state.settings.max_body_bytes, allow_empty=True),
        max_lease_seconds=state.settings.max_lease_seconds,
    )
    lease_state = await state.bridge.renew_lease(
        run_id, producer_token=token, lease_seconds=body.lease_seconds
    )
    return json_response(LeaseState.of(lease_state))


routes: Final = [
    Route("/v1/runs", claim_run, methods=["POST"]),
    # Direct: an agent POSTs here once per token (`routing.py`).
    DirectRoute("/v1/runs/{run_id}/events", publish_events, methods=["POST"]),
    Route("/v1/runs/{run_id}/end", end_run, methods=["POST"]),
    Route("/v1/runs/{run_id}/lease", renew_lease, methods=["POST"]),
]
