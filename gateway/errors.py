"""The gateway's exception tree, drawn whole: every exception that leaves the module raising it.

Exception
├── GatewayError               raised on purpose by the library (this module)
│   ├── InvalidInput           bad run id, event name, status, cursor, payload; also a ValueError
│   │   ├── PayloadTooLarge    an event or batch over the configured limits
│   │   ├── ReservedEventName  an event named like one of the gateway's own frames
│   │   └── MalformedCursor    a cursor that is not `<ms>-<seq>` (gateway.cursor)
│   ├── RunNotFound            no record of the run
│   ├── ProducerFenced         stale/wrong producer token or expired lease
│   ├── RunOwned               claim refused: a live lease is held elsewhere
│   ├── SessionMismatch        claim naming a session the run is not in
│   ├── TurnExists             claim whose idempotency key already started a turn (`run_id`)
│   ├── StreamEnded            write after END
│   │   └── RunEndedOnClaim    claim of a run whose log already ends (gateway.http.edge.errors)
│   ├── SequenceRefused        a numbered batch that cannot be applied as numbered
│   │   ├── SequenceGap        it starts past the next expected number (`expected`)
│   │   └── SequenceConflict   it overlaps applied events whose ids the log no longer has
│   ├── SessionActive          clear (retire=false) refused: a turn is still running
│   ├── BodyIdle               a streamed append's body sent nothing for a whole lease
│   ├── BridgeClosed           the bridge was closed
│   ├── BackendUnavailable     Redis unreachable or failing
│   │   └── NotReplicated      a write fewer replicas confirmed than `min_replicas_acked`
│   ├── Unauthorized           missing or invalid credentials
│   │   └── TokenExpired       a subscriber token past its `exp`
│   ├── Forbidden              valid credentials that do not cover this run/session
│   ├── TooManyStreams         a reader at its share of the open streams, or a key at its
│   │                          limit of open streamed appends (gateway.http)
│   ├── Overloaded             streamed appends past the process's budget of bytes received
│   │                          but not yet appended (gateway.http)
│   └── RequestRefused         an error answer the producer client has no narrower type
│                              for (gateway.client.producer)
├── HttpError                  an HTTP-level problem with its own status and code, such as
│                              invalid JSON or a missing header (gateway.http.edge.errors)
└── ConfigError                a startup configuration problem: one line, exit code 2 (gateway.cli)

Each class's `code` is the `error` field of its HTTP response body. The HTTP status of a
`GatewayError` comes from one table, `gateway.http.edge.errors.RULES`, looked up along the
class's MRO, so a new subclass answers like its parent until it gets a row of its own.
Exceptions private to one module (control flow that never leaves it) are not drawn.
"""

from __future__ import annotations


class GatewayError(Exception):
    """Base of every error the gateway raises on purpose."""

    code = "gateway_error"

    def details(self) -> dict[str, object]:
        """Fields an error response carries besides `error` and `detail`."""
        return {}


class InvalidInput(GatewayError, ValueError):
    code = "invalid_input"


class PayloadTooLarge(InvalidInput):
    code = "too_large"


class ReservedEventName(InvalidInput):
    code = "reserved_event_name"


class RunNotFound(GatewayError):
    code = "run_not_found"


class ProducerFenced(GatewayError):
    code = "fenced"


class RunOwned(GatewayError):
    code = "run_owned"


class SessionMismatch(GatewayError):
    """A claim named a session the run does not belong to (a run's session is fixed)."""

    code = "session_mismatch"

    @classmethod
    def of(cls, run_id: str, current: str | None) -> SessionMismatch:
        where = f"session {current!r}" if current else "no session"
        return cls(f"run {run_id} belongs to {where}; a claim cannot move it")


class TurnExists(GatewayError):
    """A claim whose idempotency key already started a turn in its session; `run_id` is
    that turn's run (gateway.bridge.turn_keys)."""

    code = "turn_exists"

    def __init__(self, run_id: str) -> None:
        super().__init__(f"this idempotency key already started run {run_id} in this session")
        self.run_id = run_id

    def details(self) -> dict[str, object]:
        return {"run_id": self.run_id}


class StreamEnded(GatewayError):
    code = "ended"


class SequenceRefused(GatewayError):
    """A numbered batch refused without being applied; `expected` is the next number."""

    code = "sequence_refused"

    def __init__(self, message: str, expected: int) -> None:
        super().__init__(message)
        self.expected = expected

    def details(self) -> dict[str, object]:
        return {"expected_seq": self.expected}


class SequenceGap(SequenceRefused):
    code = "sequence_gap"


class SequenceConflict(SequenceRefused):
    code = "sequence_conflict"


class SessionActive(GatewayError):
    code = "session_active"


class BodyIdle(GatewayError):
    code = "body_idle"


class BridgeClosed(GatewayError):
    code = "bridge_closed"


class BackendUnavailable(GatewayError):
    code = "backend_unavailable"


class NotReplicated(BackendUnavailable):
    """Its text names no server, so clients are told it: why the write is in doubt."""


class Unauthorized(GatewayError):
    code = "unauthorized"


class TokenExpired(Unauthorized):
    code = "token_expired"


class Forbidden(GatewayError):
    code = "forbidden"


class TooManyStreams(GatewayError):
    """A reader (token subject or API key) holds its whole share of this process's open
    streams and `/wait` calls (`Settings.subject_stream_share`), or an API key holds
    `max_append_streams_per_key` open streamed appends."""

    code = "too_many_streams"


class Overloaded(GatewayError):
    """The process's streamed appends hold `max_inflight_append_bytes` received but not
    yet appended: a stream that needs more is refused (its lines from there on are not
    appended; the producer sends them again later)."""

    code = "overloaded"
