"""What the routes share, kept on `app.state.gateway`: bridge, settings, registry, auth."""

from __future__ import annotations

from dataclasses import dataclass, field

from starlette.requests import Request

from ..bridge.base import StreamBridge
from ..errors import BridgeClosed
from ..sessions.base import SessionStore
from ..settings import Settings
from .edge.auth import Authenticator
from .metrics import Metrics
from .streaming.liveness import DropWatch
from .streaming.subscriptions import SubscriptionRegistry


@dataclass
class GatewayState:
    settings: Settings
    subscriptions: SubscriptionRegistry
    metrics: Metrics
    auth: Authenticator
    bridge_: StreamBridge | None = None
    sessions_: SessionStore | None = None
    started: bool = field(default=False)
    # streamed appends whose connection dropped (producer_lost after the grace)
    drops: DropWatch | None = None
    # open streamed appends per API key (a digest of it), http/routes/append_stream.py
    append_streams: dict[str, int] = field(default_factory=dict)  # by API key (share_key)
    # bytes all streamed appends hold received but not yet appended (their budget:
    # `max_inflight_append_bytes`), http/routes/append_stream.py
    append_bytes: int = 0

    @property
    def bridge(self) -> StreamBridge:
        if self.bridge_ is None:
            raise BridgeClosed("the gateway is not serving (no bridge open)")
        return self.bridge_

    @property
    def sessions(self) -> SessionStore:
        if self.sessions_ is None:
            raise BridgeClosed("the gateway is not serving (no session store open)")
        return self.sessions_


def gateway_state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state
