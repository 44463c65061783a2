"""The gateway's exception tree. The HTTP layer translates it to responses in one place.

GatewayError
├── InvalidInput            bad run id, event name, status, cursor, payload (4xx)
│   ├── PayloadTooLarge     an event or batch over the configured limits
│   └── ReservedEventName   an event named like one of the gateway's own frames
├── RunNotFound             no record of the run
├── ProducerFenced          stale/wrong producer token or expired lease
├── RunOwned                claim refused: a live lease is held elsewhere
├── StreamEnded             write after END (or claim of an ended run)
├── SessionActive           clear (retire=false) refused: a turn is still running (409)
├── BridgeClosed            the bridge was closed
├── BackendUnavailable      Redis unreachable or failing
├── Unauthorized            missing or invalid credentials (401)
│   └── TokenExpired        a subscriber token past its `exp` (401)
└── Forbidden               valid credentials that do not cover this run/session (403)
"""

from __future__ import annotations


class GatewayError(Exception):
    """Base of every error the gateway raises on purpose."""

    code = "gateway_error"


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


class StreamEnded(GatewayError):
    code = "ended"


class SessionActive(GatewayError):
    code = "session_active"


class BridgeClosed(GatewayError):
    code = "bridge_closed"


class BackendUnavailable(GatewayError):
    code = "backend_unavailable"


class Unauthorized(GatewayError):
    code = "unauthorized"


class TokenExpired(Unauthorized):
    code = "token_expired"


class Forbidden(GatewayError):
    code = "forbidden"
