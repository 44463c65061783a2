"""The session side of a run's writes: a claim's place in its session's order, and the
session hints that follow a turn (its feeds woken, the session index, the parked
listing), which the bridge calls after the run's own writes.

The turn record itself moves in the run's write (its slot: `claim.lua`, `publish.lua`);
these are separate steps in the session's slot (`session_keys.py` says why that order).
The hints are verified by every reader (`sessions.py`), so a failed hint is logged,
never the write's failure.
"""

from __future__ import annotations

import logging
from typing import Any

from redis.commands.core import AsyncScript

from ..errors import GatewayError
from ..names import check_session_id
from ..sessions.shaping import shape_input_message
from ..sessions.turns import PARKED_STATES
from ..settings import Settings
from ..values import encode_json
from . import turn_fields as F
from .calls import Calls
from .connect import RedisClient
from .keys import run_keys
from .replies import as_text, ceil_ms
from .scripts import lua_source
from .session_keys import index_keys, session_keys

log = logging.getLogger(__name__)

SCRIPTS = ("session_claim", "session_index", "session_touch")


class SessionHints:
    def __init__(self, settings: Settings, calls: Calls, client: RedisClient, prefix: str) -> None:
        self._settings = settings
        self._calls = calls
        self._redis = client
        self._prefix = prefix
        self._scripts: dict[str, AsyncScript] = {
            name: client.register_script(lua_source(name)) for name in SCRIPTS
        }

    @property
    def scripts(self) -> list[AsyncScript]:
        return list(self._scripts.values())

    async def claim_order(
        self, session_id: str, run_id: str, input_message: Any
    ) -> tuple[str, bytes, bool, str] | None:
        """A claim's first step: the session's next order for `run_id` (idempotent per
        run), with the input message shaped for the record, whether the claim opens a
        new turn, and the claim's time (Redis's clock); None when the session refused
        (retired: the run's claim then says why)."""
        turn = await self._calls.script(
            self._scripts["session_claim"],
            session_keys(self._prefix, check_session_id(session_id)).lists,
            run_id,
            self.ttl_ms(),
            resend=True,  # idempotent per run
        )
        if as_text(turn[0]) != "ok":
            return None
        message = shape_input_message(input_message)
        shaped = b"" if message is None else encode_json(message)
        return str(int(turn[1])), shaped, turn[2] == 1, as_text(turn[3])

    def ttl_ms(self) -> int:
        """How long a session's own keys live at least after a claim or a turn's move
        (none while a turn is parked): as long as a turn record can (session_ttl.lua)."""
        return ceil_ms(self._settings.stream_ttl_seconds) + ceil_ms(
            self._settings.ended_ttl_seconds
        )

    async def opened(self, session_id: str, stamp: str) -> None:
        """After a claim opened a turn: wake the session's feeds again, now that its
        record is written (`session_claim.lua` announced the turn in its own step, which
        no crash can lose; a feed that read between the two steps looks again shortly),
        and put the session on top of the session index (at the claim's time, Redis's
        clock). Both are hints readers verify, so a failure here is logged, never the
        claim's."""
        session = session_keys(self._prefix, session_id)
        try:
            await self._calls.call(lambda: self._redis.spublish(session.feed, b""))
            await self._touch_index(session_id, stamp, parked=False)
        except GatewayError as exc:
            log.warning("session %s: new turn not announced: %s", session_id, exc)

    async def moved(self, session_id: str, run_id: str) -> None:
        """After a write that may have moved a turn's state (parked, unparked, ended; the
        record itself moved in the write's own step): the session's hints follow it (its
        activity time, the parked listing, no TTL while parked). Logged on failure."""
        keys = run_keys(self._prefix, run_id)
        try:
            state, updated, owner = await self._calls.call(
                lambda: self._redis.hmget(keys.turn, [F.STATE, F.UPDATED, F.SESSION])
            )
            if state is None or owner is None or as_text(owner) != session_id:
                return
            stamp = f"{int(as_text(updated or b'0')) / 1000:.6f}"
            parked = as_text(state) in PARKED_STATES
            session = session_keys(self._prefix, session_id)
            noted = await self._calls.script(
                self._scripts["session_touch"],
                session.lists,
                stamp,
                "1" if parked else "0",
                run_id,
                self.ttl_ms(),
                resend=True,
                acknowledged=False,
            )
            if noted == 1:
                await self._touch_index(session_id, stamp, parked=parked)
        except GatewayError as exc:
            log.warning("session %s: turn %s state not noted: %s", session_id, run_id, exc)

    async def _touch_index(self, session_id: str, stamp: str, *, parked: bool) -> None:
        await self._calls.script(
            self._scripts["session_index"],
            index_keys(self._prefix).both,
            "touch",
            session_id,
            stamp,
            "1" if parked else "0",
            resend=True,
            acknowledged=False,
        )
