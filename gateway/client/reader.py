"""An async reader for one run over HTTP: the producer client's twin.

    async for item in follow("http://127.0.0.1:8000", run_id, token=token):
        match item:
            case Event(id=id, event="token", data=data):
                print(data["text"], end="")
                cursor = id  # keep it to resume later: follow(..., cursor=cursor)
            case Gap() as gap:
                reload_durable_state()  # GET /v1/runs/{id}, the session's turns
                ...  # then follow again from gap.latest_available_event_id
            case Ended(status=status):
                print("\\n", status)

`follow` yields the run's events from `cursor` on (from the start without one), then
one `Ended` or one `Gap`, and stops. The three are plain values: an app never has to
tell a finished stream from a broken one by catching exceptions. Wrap it in
`contextlib.aclosing(...)` when leaving the loop early, so the connection closes at once.

Whatever breaks the connection (a network drop, a gateway that restarts or drains on
SIGTERM, a 502/503/504 or 429 from it or a proxy, a token that expired while streaming)
is resumed from the last event it yielded, with `Last-Event-ID`, so the events it yields
are exactly the log's, each once, in order. So is the gateway's `unavailable` frame (its
own backend failed): it is never handed to the app. A drop costs nothing but a
reconnect; it raises `BackendUnavailable` only after `retry_timeout` seconds of failing
to get the stream going again. That outage clock starts when a stream breaks, not at the
last event: a run may be quiet for as long as it likes before a gateway restarts. A
stream that is open for at least `HEALTHY_SECONDS` counts as going again; one that a
gateway opens and ends at once (its backend down) does not, so the clock keeps running.

`token` is a subscriber token or an API key (sent as `Authorization: Bearer`), or a
callable returning one, which is called again when the gateway answers `token_expired`
(a stream opened with a token ends when the token expires: the reader reconnects with a
fresh one and its cursor). Errors that a retry cannot fix are raised as the gateway's
types (`gateway.errors`): `RunNotFound`, `Unauthorized`, `TokenExpired` (with a fixed
token), `Forbidden`, `InvalidInput`.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import anyio
import httpx
import orjson
from httpx_sse import SSEError, aconnect_sse

from ..errors import BackendUnavailable, InvalidInput, TokenExpired
from .calls import RETRY_STATUSES, error_from, retry_after_seconds

__all__ = ["Ended", "Event", "Gap", "follow"]

# backoff between reconnects: from FIRST_BACKOFF doubling to MAX_BACKOFF, jittered
FIRST_BACKOFF: Final = 0.1
MAX_BACKOFF: Final = 5.0
# A stream open this long was going again: an outage that follows it is a new one.
HEALTHY_SECONDS: Final = MAX_BACKOFF
# Frames the gateway sends about the stream itself, never events of the log. (httpx-sse
# keeps the last `id:` for a frame without one, as the SSE standard says: such a frame
# must not be taken for an event by its id.)
RECONNECT_FRAMES: Final = frozenset({"unavailable"})


@dataclass(frozen=True, slots=True)
class Event:
    """One event of the run's log; `id` is the cursor to resume after it."""

    id: str
    event: str
    data: Any


@dataclass(frozen=True, slots=True)
class Gap:
    """The reader's position is no longer retained: reload durable state, then follow again
    from `latest_available_event_id` (or from the start when it is None)."""

    requested_event_id: str | None
    earliest_available_event_id: str | None
    latest_available_event_id: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class Ended:
    """The run's END: `success`, `error`, `cancelled`, `interrupted` or `producer_lost`."""

    status: str
    error: Any = None


Item = Event | Gap | Ended
Credential = str | Callable[[], str | Awaitable[str]] | None


class _Reconnect(Exception):
    """The stream broke or closed before END or a gap: open it again from the cursor."""

    def __init__(self, wait: float = 0.0) -> None:
        super().__init__()
        self.wait = wait


async def _credential(token: Credential) -> str | None:
    if token is None or isinstance(token, str):
        return token
    value = token()
    return await value if inspect.isawaitable(value) else value


def _item(name: str, data: str, event_id: str, cursor: str | None) -> Item | None:
    """The value a frame stands for (None for one that carries nothing for the app).
    `cursor`: the last event's id; a frame that repeats it is not a new event (ids are
    never reused), whatever its name."""
    if name in RECONNECT_FRAMES:
        raise _Reconnect()
    payload = orjson.loads(data) if data else None
    if name == "end":
        body = payload if isinstance(payload, dict) else {}
        return Ended(str(body.get("status", "")), body.get("error"))
    if name == "gap":
        body = payload if isinstance(payload, dict) else {}
        return Gap(
            body.get("requested_event_id"),
            body.get("earliest_available_event_id"),
            body.get("latest_available_event_id"),
            str(body.get("reason", "")),
        )
    if not event_id or event_id == cursor:
        return None
    return Event(event_id, name, payload)


async def follow(
    base_url: str,
    run_id: str,
    *,
    cursor: str | None = None,
    token: Credential = None,
    client: httpx.AsyncClient | None = None,
    retry_timeout: float = 60.0,
    connect_timeout: float = 10.0,
) -> AsyncIterator[Item]:
    """The run's events after `cursor`, then `Ended` or `Gap` (see the module docstring)."""
    owned = client is None
    http = client or httpx.AsyncClient(timeout=httpx.Timeout(connect_timeout, read=None))
    url = f"{base_url.rstrip('/')}/v1/runs/{run_id}/stream"
    backoff = FIRST_BACKOFF
    outage: float | None = None  # when the current outage began (None: none is going on)
    refreshed = False  # a fresh token was fetched for the current attempt
    try:
        while True:
            headers = {"Accept": "text/event-stream"}
            credential = await _credential(token)
            if credential:
                headers["Authorization"] = f"Bearer {credential}"
            if cursor is not None:
                headers["Last-Event-ID"] = cursor
            try:
                async with aconnect_sse(http, "GET", url, headers=headers) as source:
                    response = source.response
                    if response.status_code == 204:  # nothing more for this cursor
                        return
                    if response.status_code in RETRY_STATUSES:
                        wait = retry_after_seconds(response.headers.get("retry-after", ""))
                        raise _Reconnect(min(wait, MAX_BACKOFF))
                    if response.status_code != 200:
                        await response.aread()
                        error = error_from(response)
                        if isinstance(error, TokenExpired) and callable(token) and not refreshed:
                            refreshed = True
                            continue
                        raise error
                    refreshed = False
                    opened = anyio.current_time()
                    try:
                        async for frame in source.aiter_sse():
                            item = _item(frame.event, frame.data, frame.id, cursor)
                            if item is None:
                                continue
                            backoff, outage = FIRST_BACKOFF, None  # progress
                            yield item
                            if isinstance(item, Event):
                                cursor = item.id
                            else:
                                return
                    finally:
                        if anyio.current_time() - opened >= HEALTHY_SECONDS:
                            backoff, outage = FIRST_BACKOFF, None  # it was going again
                    raise _Reconnect()  # closed without END or gap: drain, token expiry
            except _Reconnect as again:
                wait = again.wait
            except (httpx.TransportError, SSEError):
                wait = 0.0
            except orjson.JSONDecodeError as exc:
                raise InvalidInput(f"the gateway sent a frame that is not JSON: {exc}") from exc
            now = anyio.current_time()
            if outage is None:
                outage = now
            deadline = outage + retry_timeout
            if now >= deadline:
                raise BackendUnavailable(
                    f"the stream did not get going again in {retry_timeout:g} s of reconnecting"
                )
            delay = max(wait, backoff * (0.5 + random.random() / 2))
            backoff = min(backoff * 2, MAX_BACKOFF)
            await anyio.sleep(min(delay, max(0.0, deadline - now)))
    finally:
        if owned:
            with anyio.CancelScope(shield=True):
                await http.aclose()
