"""The clients' HTTP call boundary: which answers are retried, how an error answer maps to
a gateway error, and `Calls`, the requests of one run's producer (every one re-sent
after a connection error, a timeout or a 429/502/503/504, with exponential backoff, for
up to `retry_timeout` seconds: the gateway applies each numbered event once, and a
claim, a lease renewal and an END are idempotent, so a blind retry is safe).

The reader client (`reader.py`) uses the status set, the `Retry-After` parser and
`error_from`; the producer and its senders use `Calls`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Final, TypeVar

import anyio
import httpx
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_delay,
    wait_exponential_jitter,
)

from ..errors import (
    BackendUnavailable,
    Forbidden,
    GatewayError,
    InvalidInput,
    PayloadTooLarge,
    ProducerFenced,
    RunNotFound,
    RunOwned,
    SequenceConflict,
    SequenceGap,
    StreamEnded,
    TokenExpired,
    TurnExists,
    Unauthorized,
)

T = TypeVar("T")

# Answers after which a request may be re-sent: the gateway or a proxy in front of it
# could not serve it now (a numbered append may have been applied; the retry says so).
RETRY_STATUSES: Final = frozenset({429, 502, 503, 504})
MAX_RETRY_AFTER: Final = 5.0  # seconds; a longer Retry-After is capped to this

_ERRORS_BY_CODE: Final[dict[str, type[GatewayError]]] = {
    "fenced": ProducerFenced,
    "ended": StreamEnded,
    "run_ended": StreamEnded,
    "run_owned": RunOwned,
    "run_not_found": RunNotFound,
    "too_large": PayloadTooLarge,
    "unauthorized": Unauthorized,
    "token_expired": TokenExpired,
    "forbidden": Forbidden,
}


class RequestRefused(GatewayError):
    """The gateway answered with an error this client has no narrower type for."""

    code = "request_refused"

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(f"{status} {code}: {detail}")
        self.status = status
        self.code = code


class Retryable(Exception):
    """A response that asks for the request again (a 503 and its kin)."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"{response.status_code} {response.text[:200]}")
        self.status = response.status_code
        self.retry_after = retry_after_seconds(response.headers.get("retry-after", ""))


class StreamInterrupted(Exception):
    """A streamed append ended early in a way that asks for it again (an error line such
    as `backend_unavailable`, or a reply cut before its last line)."""


def retry_after_seconds(value: str) -> float:
    """A `Retry-After` of delay-seconds; anything else (an HTTP date, garbage, a digit
    that is not ASCII such as U+0661 or "²", which `str.isdigit` accepts) is 0: the normal
    backoff applies."""
    value = value.strip()
    if value.isascii() and value.isdigit() and len(value) <= 9:
        return float(value)
    return 0.0


def _retryable(exc: BaseException) -> bool:
    # Every transport failure: the request may not have arrived, or its reply was lost.
    return isinstance(exc, Retryable | StreamInterrupted | httpx.TransportError) and not isinstance(
        exc, httpx.UnsupportedProtocol | httpx.LocalProtocolError
    )


def error_from(response: httpx.Response) -> GatewayError:
    """The gateway error an error response stands for."""
    try:
        body = response.json()
        code, detail = str(body["error"]), str(body.get("detail", ""))
    except (ValueError, KeyError, TypeError, AttributeError):  # not the gateway's error body
        body, code, detail = {}, "http_error", response.text[:200]
    return error_of_body(response.status_code, code, detail, body)


def error_of_body(status: int, code: str, detail: str, body: dict[str, Any]) -> GatewayError:
    """The gateway error an error body (an answer's, or a streamed append's error line)
    stands for."""
    if code == "sequence_gap":
        return SequenceGap(detail, int(body.get("expected_seq", 0)))
    if code == "sequence_conflict":
        return SequenceConflict(detail, int(body.get("expected_seq", 0)))
    if code == "turn_exists":
        return TurnExists(str(body.get("run_id", "")))
    kind = _ERRORS_BY_CODE.get(code)
    if kind is not None:
        return kind(detail or code)
    if status in (400, 422) or code in ("invalid_input", "invalid_json"):
        return InvalidInput(detail or code)
    return RequestRefused(status, code, detail)


class Calls:
    """The requests of one run's producer: the base URL and the headers every request
    carries, the producer token once the claim gave one, the retry policy and its count."""

    _backoff: Final = wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.05)

    def __init__(
        self,
        base_url: str,
        run_id: str,
        *,
        api_key: str | None,
        client: httpx.AsyncClient | None,
        request_timeout: float,
        retry_timeout: float,
    ) -> None:
        self.run_id = run_id
        self.run_path = f"/v1/runs/{run_id}"
        self.retry_timeout = retry_timeout
        self.retries = 0  # re-sent requests (all kinds)
        self.token = ""  # the producer token, set by the claim
        self._base_url = base_url.rstrip("/")
        # Every request is a POST with a JSON body (or none): the gateway asks for the type.
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._client = client
        self._own_client = client is None
        self._request_timeout = request_timeout

    def open(self) -> None:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self._request_timeout)

    async def close(self) -> None:
        """Close the client this object made (one passed in is the caller's)."""
        if self._own_client and self._client is not None:
            with anyio.CancelScope(shield=True):
                await self._client.aclose()
            self._client = None

    def producer_headers(self) -> dict[str, str]:
        return {"X-Producer-Token": self.token}

    async def retried(self, call: Callable[[], Awaitable[T]]) -> T:
        """`call` until it returns, again after what asks for it, for up to
        `retry_timeout` seconds; then `BackendUnavailable`."""
        try:
            async for attempt in self._retrying():
                with attempt:
                    return await call()
        except (Retryable, StreamInterrupted, httpx.TransportError) as exc:
            raise BackendUnavailable(
                f"gateway unavailable for {self.retry_timeout} s: {exc}"
            ) from exc
        raise AssertionError("unreachable")  # AsyncRetrying either returns or raises

    async def request(
        self, path: str, body: bytes | Callable[[], bytes], headers: dict[str, str]
    ) -> dict[str, Any]:
        """POST with retries (safe: every request this client sends is idempotent)."""
        make = body if callable(body) else lambda: body
        return await self.retried(lambda: self._post(path, make(), headers))

    def stream(
        self, path: str, content: Any, headers: dict[str, str]
    ) -> AbstractAsyncContextManager[httpx.Response]:
        """One POST whose body is written as it comes and whose reply is read as a stream
        (no retries: the caller re-sends through `retried`)."""
        assert self._client is not None
        return self._client.stream(
            "POST", self._base_url + path, content=content, headers={**self._headers, **headers}
        )

    def _retrying(self) -> AsyncRetrying:
        return AsyncRetrying(
            retry=retry_if_exception(_retryable),
            wait=self._wait,
            stop=stop_after_delay(self.retry_timeout),
            sleep=anyio.sleep,
            before_sleep=self._count_retry,
            reraise=True,
        )

    def _wait(self, state: RetryCallState) -> float:
        backoff = float(self._backoff(state))
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, Retryable):
            return max(backoff, min(exc.retry_after, MAX_RETRY_AFTER))
        return backoff

    def _count_retry(self, state: RetryCallState) -> None:
        self.retries += 1

    async def _post(self, path: str, body: bytes, headers: dict[str, str]) -> dict[str, Any]:
        assert self._client is not None
        response = await self._client.post(
            self._base_url + path, content=body, headers={**self._headers, **headers}
        )
        if response.status_code in RETRY_STATUSES:
            raise Retryable(response)
        if response.status_code >= 400:
            raise error_from(response)
        try:
            reply = response.json()
        except ValueError:
            reply = None
        if not isinstance(reply, dict):  # not the gateway answering (a proxy's page?)
            raise RequestRefused(response.status_code, "bad_reply", response.text[:200])
        return reply
