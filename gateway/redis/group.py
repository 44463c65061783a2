"""Group commit: scripts that arrive while others are on the wire go out together, in
one write per server: on one server, on one connection, their replies read in order; on
a cluster, as the cluster client's pipeline (one write per node, the nodes at once).

Appends of many runs (a hundred chats streaming at once) each used to take a pass and a
round trip of their own: a `send` and a `recv` in the gateway and in Redis per token.
Here scripts queue, and at most `MAX_FLIGHTS` flyer tasks (in the bridge's task group,
started as load needs them) each take the whole queue as one batch, send it in one
write and read its replies; what arrives meanwhile leaves with the next flight. A
script that finds nothing on the wire is sent at once by its caller, as before grouping
(no hand-off: a lone chat pays nothing for it).

What each caller gets is what it got alone: its own reply, or its own error. The
scripts in a batch run one after another in Redis (each atomic, as always); a run's own
appends are never in flight twice (its producer awaits each ack), so per-run order and
each write's fencing are unchanged. A connection failure fails every script of its
batch as it failed one before: it may or may not have run (`calls.py`). A script Redis
lacks (NOSCRIPT: flushed, restarted) did not run: it is loaded and sent again in the
same flight. A caller cancelled while queued is taken out (its script never leaves);
once sent, its script runs and the reply is dropped, as for a cancelled lone call. The
flyers are never cancelled by a caller: one caller's cancellation cannot fail another's
write.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

from anyio.abc import TaskGroup
from redis import exceptions as redis_errors
from redis.commands.core import AsyncScript

from ..errors import BridgeClosed
from ..timing.deadlines import CallDeadlines
from .connect import RedisClient
from .pool import Held, PoolGate
from .wire import pack

# Each fills the server's identity in the scripts that take it (`server_at`): on one
# server the connection's; on a cluster `ASK_SERVER`, the script asks (calls.py).
ASK_SERVER: Final = "?"

# Batches on the wire at once (flyer tasks). Few, so that a load that keeps them busy
# groups its scripts (the point); more than one, so that one slow script (a large
# append) does not hold every other run's write behind it.
MAX_FLIGHTS: Final = 2


class _Script:
    """One script call; `future` holds its reply when it waits for a flyer (a lone
    call sent by its caller has none: it gets its reply as the call's result)."""

    __slots__ = ("args", "future", "keys", "script", "server_at")

    def __init__(
        self,
        script: AsyncScript,
        keys: Sequence[str],
        args: Sequence[bytes | str | int],
        server_at: int | None,
        future: asyncio.Future[Any] | None,
    ) -> None:
        self.script = script
        self.keys = keys
        self.args = args
        self.server_at = server_at
        self.future = future

    def settle(self, reply: Any) -> None:
        """Hand the waiting caller its reply, or its refusal raised (a caller that was
        cancelled meanwhile is gone: nothing to hand)."""
        if self.future is None or self.future.done():
            return
        if isinstance(reply, redis_errors.ResponseError):
            self.future.set_exception(reply)
        else:
            self.future.set_result(reply)

    def fail(self, error: BaseException) -> None:
        if self.future is not None and not self.future.done():
            self.future.set_exception(error)

    def command(self, server: str) -> tuple[bytes | str | int, ...]:
        args = self.args
        if self.server_at is not None:
            at = self.server_at
            args = (*args[:at], server, *args[at + 1 :])
        return ("EVALSHA", self.script.sha, len(self.keys), *self.keys, *args)


# Sends a batch: each script's reply, or its refusal as a `ResponseError` value.
Send = Callable[[list[_Script]], Awaitable[list[Any]]]


def _unloaded(replies: list[Any]) -> list[int]:
    """The scripts the server did not know (NOSCRIPT): they did not run."""
    return [i for i, reply in enumerate(replies) if isinstance(reply, redis_errors.NoScriptError)]


def on_one_server(gate: PoolGate) -> Send:
    """A batch in one write on a connection the gate keeps."""

    async def send(batch: list[_Script]) -> list[Any]:
        async with gate.connection() as held:
            if len(batch) == 1:  # the lone write's path: as plain as before grouping
                return [await _one(held, batch[0])]
            return await _on_connection(held, batch)

    return send


async def _one(held: Held, call: _Script) -> Any:
    packed = pack(*call.command(await held.server() if call.server_at is not None else ""))
    try:
        return await held.execute(packed)
    except redis_errors.NoScriptError:  # not run: Redis was flushed or restarted
        await held.execute(pack("SCRIPT", "LOAD", call.script.script))
        return await held.execute(packed)
    except redis_errors.ResponseError as exc:
        return exc  # (the caller's own refusal, raised to it alone)


async def _on_connection(held: Held, batch: list[_Script]) -> list[Any]:
    server = ""
    if any(call.server_at is not None for call in batch):
        server = await held.server()

    def packed(calls: list[_Script]) -> list[bytes]:
        return [pack(*call.command(server)) for call in calls]

    replies = await held.execute_each(packed(batch), len(batch))
    unloaded = _unloaded(replies)
    if unloaded:  # not run: Redis was flushed or restarted
        again = [batch[i] for i in unloaded]
        for script in {call.script.sha: call.script for call in again}.values():
            await held.execute(pack("SCRIPT", "LOAD", script.script))
        retried = await held.execute_each(packed(again), len(again))
        for i, reply in zip(unloaded, retried, strict=True):
            replies[i] = reply
    return replies


def on_a_cluster(gate: PoolGate, client: RedisClient) -> Send:
    """A batch as the cluster client's pipeline: it sends each node its scripts in one
    write, all nodes at once, and follows MOVED and ASK (a script's keys share a slot)."""

    async def run(calls: list[_Script]) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for call in calls:
            pipe.execute_command(*call.command(ASK_SERVER))
        return list(await pipe.execute(raise_on_error=False))

    async def send(batch: list[_Script]) -> list[Any]:
        async with gate:
            replies = await run(batch)
            unloaded = _unloaded(replies)
            if unloaded:  # not run: a node was flushed, restarted or is new
                again = [batch[i] for i in unloaded]
                for script in {call.script.sha: call.script for call in again}.values():
                    await client.script_load(script.script)  # (on every primary)
                for i, reply in zip(unloaded, await run(again), strict=True):
                    replies[i] = reply
            return replies

    return send


class GroupCommit:
    def __init__(self, send: Send, timeout: float) -> None:
        self._send_batch = send
        self._timeout = timeout
        # A batch's bound, as each call's (calls.py): a loop timer per batch, made and
        # cancelled, was a twentieth of a streamed token's CPU at 100 runs.
        self._deadlines = CallDeadlines(timeout)
        self._loop: asyncio.AbstractEventLoop | None = None  # (the getpid each lookup costs)
        self._queue: deque[_Script] = deque()
        self._idle: list[asyncio.Future[None]] = []  # flyers waiting for a script
        self._flyers = 0
        self._on_wire = 0  # batches sent and not yet answered
        self._tasks: TaskGroup | None = None
        # Plain counters for tests and benchmarks: batches flown, scripts in them, and
        # the batches of one that their callers sent themselves.
        self.batches = 0
        self.scripts = 0
        self.alone = 0

    @property
    def running(self) -> bool:
        return self._tasks is not None

    @property
    def on_wire(self) -> int:
        """Batches sent and not yet answered (or given up at their deadline)."""
        return self._on_wire

    def start_in(self, tasks: TaskGroup | None) -> None:
        """The task group the flyers run in (the bridge's); None: no grouping (calls
        go one by one), and the waiting flyers stop."""
        self._tasks = tasks
        if tasks is None:
            for waiter in self._idle:
                if not waiter.done():
                    waiter.set_result(None)  # (they see no task group, and stop)
            self._idle.clear()

    async def run(
        self,
        script: AsyncScript,
        keys: Sequence[str],
        args: Sequence[bytes | str | int],
        server_at: int | None,
    ) -> Any:
        """Run `script` in the next batch: its reply, or its error raised."""
        if not self._on_wire and not self._queue:
            return await self._alone(_Script(script, keys, args, server_at, None))
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        call = _Script(script, keys, args, server_at, future)
        self._queue.append(call)
        while self._idle and self._idle[-1].done():  # (its flyer is stopping)
            self._idle.pop()
        if self._idle:
            self._idle.pop().set_result(None)
        elif self._flyers < MAX_FLIGHTS and self._tasks is not None:
            self._flyers += 1
            self._tasks.start_soon(self._fly)
        try:
            return await future
        except asyncio.CancelledError:
            if call in self._queue:
                self._queue.remove(call)
            raise

    async def _alone(self, call: _Script) -> Any:
        """Nothing on the wire: the caller sends its script itself, at once (a lone
        write pays no hand-off to a flyer); what arrives meanwhile queues for them.
        Its caller's deadline bounds it (`Calls._attempts`): a second timeout context
        here cost a loop timer per write, a third of a lone publish's CPU."""
        self._on_wire += 1
        self.batches += 1
        self.scripts += 1
        self.alone += 1
        try:
            (reply,) = await self._send_batch([call])
        finally:
            self._on_wire -= 1
        if isinstance(reply, redis_errors.ResponseError):
            raise reply
        return reply

    async def _fly(self) -> None:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] | None = None
        try:
            while self._tasks is not None:
                if not self._queue:
                    waiter = loop.create_future()
                    self._idle.append(waiter)
                    await waiter
                    continue
                batch = list(self._queue)
                self._queue.clear()
                await self._send(batch)
        finally:  # (stopped by `start_in(None)`, or the bridge's task group cancelled)
            if waiter is not None and waiter in self._idle:
                self._idle.remove(waiter)
            self._flyers -= 1
            for call in self._queue if self._flyers == 0 else ():
                call.fail(BridgeClosed("the bridge is closed"))

    async def _send(self, batch: list[_Script]) -> None:
        self.batches += 1
        self.scripts += len(batch)
        self._on_wire += 1
        try:
            with self._deadlines.start():
                replies = await self._send_batch(batch)
        except BaseException as exc:
            failure = exc if isinstance(exc, Exception) else BridgeClosed("the bridge is closed")
            for call in batch:
                call.fail(failure)
            if not isinstance(exc, Exception):
                raise
            return
        finally:
            self._on_wire -= 1
        for call, reply in zip(batch, replies, strict=True):
            call.settle(reply)
