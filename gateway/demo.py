"""A demo producer: streams a synthetic answer token by token, so streaming is visible at once.

Every few seconds it starts a new turn of the session `demo`: it claims a run
`demo-<hex>` (with an operator message, so the turn reads like a chat), publishes one
`token` event (`{"text": "..."}`) about every 50 ms for a short paragraph, then ENDs the
run with `success`. It logs the console address that shows the session (`/?session=demo`)
and, per run, the curl command that watches it.

It is a producer like any other: it writes through the HTTP producer API with the
Python producer client (`gateway.producer.Producer`), so its turns are recorded in the
session, and a subscriber's `POST /v1/runs/{id}/cancel` ends its run `cancelled`.

- `gateway serve --demo` runs it next to uvicorn, against that server, once the port
  accepts connections (cancelled at shutdown, it ENDs its current run `interrupted`);
  when the gateway requires API keys, `with_demo_key` adds one that only this process
  knows, so the demo needs no configuration.
- `gateway demo --url ...` runs it against any running gateway.
"""

from __future__ import annotations

import logging
import re
import secrets
import uuid
from collections.abc import Iterator
from typing import Any, Final, Literal

import anyio

from .errors import GatewayError
from .producer import Producer
from .settings import Settings

log = logging.getLogger("gateway.demo")

DEMO_SESSION: Final = "demo"

PARAGRAPH: Final = (
    "Hello! This answer is streamed token by token through the gateway. "
    "Each word you see arrived as its own `token` event on a Redis-backed run log, "
    "so a browser that reconnects with Last-Event-ID resumes exactly where it left off, "
    "without losing or repeating a word. When the answer is complete the run ends, "
    "and a new one starts a few seconds later."
)
QUESTION: Final = "Show me a streamed answer."
# Tokens come every `token_delay` seconds; the client batches what arrives within this
# window into one request (a steady demo makes a few requests a second, not twenty;
# the console still shows the answer grow a few words at a time).
BATCH_WINDOW: Final = 0.2


def demo_tokens(text: str = PARAGRAPH) -> Iterator[str]:
    """The text split into word tokens that keep their trailing whitespace."""
    yield from re.findall(r"\S+\s*", text)


def with_demo_key(settings: Settings) -> tuple[Settings, str | None]:
    """Settings with one more API key, known only to this process, for `serve --demo`.

    None when the gateway runs open (no key is needed); otherwise the demo producer
    authenticates like any producer, with a key nobody else has.
    """
    if not settings.api_keys and settings.jwt_secret is None:
        return settings, None
    key = secrets.token_urlsafe(32)
    return settings.model_copy(update={"api_keys": (*settings.api_keys, key)}), key


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
) -> int:
    """Stream demo runs into the gateway at `base_url` until `stop` is set, `max_runs` were
    tried, or cancelled. Returns the number of runs it completed.

    `display_url` is the address the log lines show (default `base_url`); `auth_hint`
    what credential the curl line asks for (default: an API key when one is used).
    Errors of one run are logged and the loop goes on after `pause` (the gateway may be
    restarting).
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
            log.warning("demo run failed: %s", exc, extra={"run_id": run_id})
        else:
            done += 1
        finally:  # also when the demo is cancelled (its run then ENDed `interrupted`)
            outcome = producer.end_status
            log.info("demo run ended", extra={"run_id": run_id, "outcome": outcome})
        if max_runs is not None and tried >= max_runs:
            break
        with anyio.move_on_after(pause):
            if stop is None:
                await anyio.sleep_forever()
            else:
                await stop.wait()
    return done
