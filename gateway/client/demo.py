"""A demo producer: streams a synthetic answer token by token, so streaming is visible at once.

Every few seconds it starts a new turn of the session `demo`: it claims a run
`demo-<hex>` (with an operator message, so the turn reads like a chat), publishes one
`token` event (`{"text": "..."}`) about every 50 ms for a short paragraph, then ENDs the
run with `success`. It logs the console address that shows the session (`/?session=demo`)
once, then one INFO line per run: the curl command that watches it (a run that ends
other than `success` adds a WARNING; the rest is DEBUG, so the hint does not scroll away).

It is a producer like any other: it writes through the HTTP producer API with the
Python producer client (`gateway.client.producer.Producer`), so its turns are recorded in the
session, and a subscriber's `POST /v1/runs/{id}/cancel` ends its run `cancelled`.

- `gateway serve --demo` runs it next to uvicorn, against that server, once the port
  accepts connections (cancelled at shutdown, it ENDs its current run `interrupted`);
  when the gateway requires API keys, `with_demo_key` adds one that only this process
  knows, so the demo needs no configuration. Its requests carry request ids with a
  prefix only this process knows (`DemoRequests`), and a filter on the request log
  writes their successful lines at DEBUG: the demo's own traffic does not fill the log,
  and no other client can quiet its lines by choosing a request id.
- `gateway demo --url ...` runs it against any running gateway.
"""

from __future__ import annotations

import itertools
import logging
import re
import secrets
import uuid
from collections.abc import Iterator
from typing import Any, Final, Literal

import anyio
import httpx

from ..errors import GatewayError
from ..settings import Settings
from .producer import Producer

log = logging.getLogger("gateway.demo")

DEMO_SESSION: Final = "demo"

PARAGRAPH: Final = (
    "Hello! This answer is streamed token by token through the gateway. "
    "Each word you see arrived as its own `token` event in the run's event log, "
    "so a browser that reconnects with Last-Event-ID resumes exactly where it left off, "
    "without losing or repeating a word. When the answer is complete the run ends, "
    "and a new one starts a few seconds later."
)
QUESTION: Final = "Show me a streamed answer."
# Tokens come every `token_delay` seconds; the client batches what arrives within this
# window into one request (a steady demo makes a few requests a second, not twenty;
# the console still shows the answer grow a few words at a time).
BATCH_WINDOW: Final = 0.2
# As the producer client's own default (the client is passed in by `serve --demo`).
REQUEST_TIMEOUT: Final = 10.0


def demo_tokens(text: str = PARAGRAPH) -> Iterator[str]:
    """The text split into word tokens that keep their trailing whitespace."""
    yield from re.findall(r"\S+\s*", text)


def with_demo_key(settings: Settings) -> tuple[Settings, str | None]:
    """Settings with one more API key, known only to this process, for `serve --demo`.

    None when the gateway runs open (no key is needed); otherwise the demo producer
    authenticates like any producer, with a key nobody else has.
    """
    if not settings.authenticated:
        return settings, None
    key = secrets.token_urlsafe(32)
    return settings.model_copy(update={"api_keys": (*settings.api_keys, key)}), key


class DemoRequests:
    """Request ids for the demo's own requests, and the log filter that quiets them.

    `serve --demo` runs the demo in-process, against its own server: each of the demo's
    requests would be an INFO line of `gateway.http.requests` (a few a second). The demo
    sends `X-Request-ID: <prefix><n>`, the prefix random per process (`secrets`), and
    `filter`, installed on the request logger, writes those lines at DEBUG when they
    succeeded (< 400; failures stay visible). Another client cannot guess the prefix, so
    it cannot lower the level of its own lines.
    """

    def __init__(self) -> None:
        self.prefix = f"demo-{secrets.token_hex(16)}-"
        self._numbers = itertools.count(1)

    async def tag(self, request: httpx.Request) -> None:
        """An httpx request hook: the next demo request id."""
        request.headers["X-Request-ID"] = f"{self.prefix}{next(self._numbers)}"

    def client(self) -> httpx.AsyncClient:
        """An HTTP client whose every request carries a demo request id."""
        return httpx.AsyncClient(timeout=REQUEST_TIMEOUT, event_hooks={"request": [self.tag]})

    def filter(self, record: logging.LogRecord) -> bool:
        """A `logging` filter (a callable is enough): demote the demo's successful lines."""
        request_id = getattr(record, "request_id", None)
        status = getattr(record, "status", 500)
        if (
            record.levelno == logging.INFO
            and isinstance(request_id, str)
            and request_id.startswith(self.prefix)
            and isinstance(status, int)
            and status < 400
        ):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            # The logger let the line through at INFO: check DEBUG again here.
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


AuthHint = Literal["none", "api_key", "token"]


def watch_command(base_url: str, run_id: str, *, auth: AuthHint = "none") -> str:
    """The curl command that watches a run, with a credential placeholder when needed."""
    if auth == "api_key":
        header = ' -H "Authorization: Bearer $GATEWAY_API_KEY"'
    elif auth == "token":  # needs GATEWAY_JWT_SECRET in the shell
        header = f' -H "Authorization: Bearer $(gateway token --run {run_id})"'
    else:
        header = ""
    return f"curl -N{header} {base_url.rstrip('/')}/v1/runs/{run_id}/stream"


def console_url(base_url: str, session_id: str = DEMO_SESSION) -> str:
    """The console page, opened on a session (it follows the session's running turn)."""
    return f"{base_url.rstrip('/')}/?session={session_id}"


def _input_message() -> dict[str, Any]:
    return {
        "messageId": f"demo-{uuid.uuid4().hex[:12]}",
        "role": "user",
        "parts": [{"kind": "text", "text": QUESTION}],
    }


def _log_end(run_id: str, outcome: str | None) -> None:
    # A run that streamed to the end is the normal case: its curl line said enough. One
    # interrupted by the demo stopping (shutdown) is routine too; anything else is not.
    if outcome == "success":
        level = logging.DEBUG
    elif outcome == "interrupted":
        level = logging.INFO
    else:
        level = logging.WARNING
    log.log(level, "demo run ended", extra={"run_id": run_id, "outcome": outcome})


async def run_demo(
    base_url: str,
    api_key: str | None = None,
    *,
    display_url: str | None = None,
    auth_hint: AuthHint | None = None,
    stop: anyio.Event | None = None,
    session_id: str = DEMO_SESSION,
    token_delay: float = 0.05,
    pause: float = 3.0,
    max_runs: int | None = None,
    client: httpx.AsyncClient | None = None,
) -> int:
    """Stream demo runs into the gateway at `base_url` until `stop` is set, `max_runs` were
    tried, or cancelled. Returns the number of runs it completed.

    `display_url` is the address the log lines show (default `base_url`); `auth_hint`
    what credential the curl line asks for (default: an API key when one is used).
    Errors of one run are logged and the loop goes on after `pause` (the gateway may be
    restarting). `client`: the HTTP client of every run (the caller closes it); by
    default each run's producer has its own.
    """
    shown = display_url or base_url
    hint: AuthHint = auth_hint or ("api_key" if api_key else "none")
    log.info("demo producer started; open the console: %s", console_url(shown, session_id))
    done = tried = 0
    while (stop is None or not stop.is_set()) and (max_runs is None or tried < max_runs):
        tried += 1
        run_id = f"demo-{uuid.uuid4().hex[:12]}"
        producer = Producer(
            base_url,
            run_id=run_id,
            session_id=session_id,
            api_key=api_key,
            input_message=_input_message(),
            cancelled_status="interrupted",  # cancelled here means: the demo is stopping
            batch_window=BATCH_WINDOW,
            client=client,
        )
        try:
            async with producer as run:
                log.info(
                    "demo run streaming; watch it with: %s",
                    watch_command(shown, run_id, auth=hint),
                    extra={"run_id": run_id, "session_id": session_id},
                )
                for piece in demo_tokens():
                    await run.send("token", {"text": piece})
                    await anyio.sleep(token_delay)
        except GatewayError as exc:
            outcome = producer.end_status
            log.warning("demo run failed: %s", exc, extra={"run_id": run_id, "outcome": outcome})
        except BaseException:  # cancelled (the demo is stopping): its run ENDed `interrupted`
            _log_end(run_id, producer.end_status)
            raise
        else:
            done += 1
            _log_end(run_id, producer.end_status)
        if max_runs is not None and tried >= max_runs:
            break
        with anyio.move_on_after(pause):
            if stop is None:
                await anyio.sleep_forever()
            else:
                await stop.wait()
    return done
