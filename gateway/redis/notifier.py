"""The process's change notifications: sharded pub/sub listeners and the registry of feeds.

Every write script SPUBLISHes on the run's channel (the log key's name, so in the run's
slot). A shard channel is delivered only by the node that owns its slot, and costs one
cluster bus message per replica of that shard (a classic PUBLISH is copied to every node
of the cluster). A standalone server has one "shard", itself.

So the notifier keeps one listener connection per node that owns the slot of a
subscribed feed (`_Listener`), plus one to the owner of a private channel, so that a
process with no feeds still holds a connection (and notices outages). (A feed whose
readers only read an ended log is not subscribed: `Notifier.attach`.) Where a channel
lives comes from the `Router`: on a cluster, the command client's slot map. That map may
be stale, and slots move (resharding, failover); the node that no longer owns a channel
says so, and the listener follows:

- a SSUBSCRIBE refused with MOVED: the channels of that slot move to the named node;
- a `sunsubscribe` the node sent on its own (it lost the slot): the channel is subscribed
  again on the same connection shortly, which answers MOVED, or accepts it (the slot came back,
  or the node is now a replica in that slot's shard, which receives its messages too);
- a lost connection: the listener reconnects with backoff, first moving every channel
  whose slot the router now places elsewhere (after a failed attempt, having asked the
  router to learn the slots again: the node may have died and its replica taken over).

Whenever a channel is subscribed again (a reconnect, a move, a retried SSUBSCRIBE), its
feed is marked stale, so its readers read the log once: notifications sent meanwhile are
never missed silently.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from typing import Any, Final, Protocol

import anyio
from anyio.abc import TaskGroup, TaskStatus
from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.crc import key_slot

from ..timing.deadlines import Deadlines
from .fanout import RunFeed
from .keys import RunKeys
from .replies import as_text

# A (un)subscribe on a listener's connection that its listener task is dropping at that
# moment fails with a RedisError or OSError, or, when the drop lands while redis-py is
# writing the command, with an AttributeError from inside redis-py (its writer is gone).
# Either way the listener reconnects and subscribes what its channels are then.
_CONNECTION_LOST: Final = (redis_errors.RedisError, OSError, AttributeError)

log = logging.getLogger(__name__)

NOTIFIER_CHANNEL = "gateway:notifier"
# A channel whose SSUBSCRIBE failed (the connection was down), was cancelled mid-way, or
# was refused mid-migration, or that its node dropped (`sunsubscribe`), is subscribed
# again within this, by one task per listener (`_retry_later`).
RETRY_SUBSCRIBE_SECONDS = 0.5


async def _as_it_came(message: Any) -> Any:
    """The pub/sub connection's handler of each message it parses: hands it on as it came.
    (redis-py's default renders every message as text for a debug log line, even with
    debug logging off: a visible share of the cost of a notification.)"""
    return message


class Router(Protocol):
    """Where shard channels live: node names, and a pub/sub client for each."""

    def locate(self, channel: str) -> str:
        """The node that owns the channel's slot, as far as we know (a wrong guess is
        corrected by the node's MOVED reply)."""
        ...

    def connect(self, node: str) -> Redis:
        """A client for `node` ("host:port", as a MOVED reply names it)."""
        ...

    async def refresh(self) -> None:
        """Learn again where slots live (a node could not be reached: it may have failed
        over)."""
        ...


class OneServer:
    """A standalone Redis server: every channel lives on it."""

    def __init__(self, connect: Callable[[], Redis]) -> None:
        self._connect = connect

    def locate(self, channel: str) -> str:
        return ""

    def connect(self, node: str) -> Redis:
        return self._connect()

    async def refresh(self) -> None:
        pass


def _by_slot(channels: Iterable[str]) -> list[list[str]]:
    """One SSUBSCRIBE per slot: a cluster node refuses one that spans slots (CROSSSLOT)."""
    groups: defaultdict[int, list[str]] = defaultdict(list)
    for channel in channels:
        groups[key_slot(channel.encode())].append(channel)
    return list(groups.values())


class _Listener:
    """One node's pub/sub connection and the channels it should deliver."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.channels: set[str] = set()
        self.pubsub: Any = None  # while connected
        self.retry: set[str] = set()  # channels to SSUBSCRIBE again shortly
        self.retry_scheduled = False  # a `_retry_soon` task will subscribe them
        self.connected_before = False


class Notifier:
    """Owns the process's pub/sub listeners and the registry of live feeds."""

    def __init__(
        self,
        router: Router,
        window: int,
        on_reconnect: Callable[[], None] | None = None,
    ) -> None:
        self._router = router
        self._window = window
        self._on_reconnect = on_reconnect  # told each time a connection is re-established
        self._feeds: dict[str, RunFeed] = {}
        self._listeners: dict[str, _Listener] = {}
        self._where: dict[str, str] = {}  # channel -> the node whose listener has it
        self._task_group: TaskGroup | None = None
        self._tried = anyio.Event()  # the first listener made its first attempt
        self._closed = False
        self._deadlines: Deadlines | None = None  # the feeds' readers' heartbeat deadlines

    @asynccontextmanager
    async def attach(
        self, keys: RunKeys, start: str | None, *, subscribe: bool = True
    ) -> AsyncIterator[RunFeed]:
        """Share the run's feed (created at `start`, the log's current tail, if new; None:
        not known yet, see `RunFeed.start_at`).

        `subscribe=False` is for a reader that does not know yet whether it will wait: its
        first read is shared with the feed's other readers and, if the log ends with its
        END (nothing can follow it), costs no SSUBSCRIBE and SUNSUBSCRIBE. A reader that
        finds something to wait for calls `follow` first.
        """
        feed = self._feeds.get(keys.log)
        if feed is None or feed.removed:
            if self._deadlines is None:  # made on the loop of the first reader
                self._deadlines = Deadlines(asyncio.get_running_loop())
            feed = RunFeed(keys, start, self._window, self._deadlines)
            feed.closed = self._closed
            self._feeds[keys.log] = feed
        elif start is not None:
            feed.start_at(start)  # a feed still waiting for its first reader's read
        feed.users += 1
        try:
            if subscribe:
                await self.follow(feed)
            yield feed
        finally:
            feed.users -= 1
            if feed.users == 0 and self._feeds.get(keys.log) is feed:
                del self._feeds[keys.log]
                if keys.log in self._where:
                    with anyio.CancelScope(shield=True):
                        await self._remove(keys.log)

    def feed_of(self, keys: RunKeys) -> RunFeed | None:
        """The run's feed in this process, if any of its readers holds it."""
        return self._feeds.get(keys.log)

    async def follow(self, feed: RunFeed) -> None:
        """Subscribe the feed's channel unless it is, marking the feed stale once
        subscribed: what its readers read meanwhile (joining while this subscribes, or
        reading an ended log unsubscribed) may be older than the subscription."""
        if feed.keys.log not in self._where:
            await self._add(feed.keys.log, self._router.locate(feed.keys.log), wake=True)

    def watch(self, channel: str) -> AbstractAsyncContextManager[RunFeed]:
        """Follow the notifications of a channel that carries no run log (a session's
        turn list): a feed nobody reads entries into (so it stays `stale`, and `push`
        takes every message as a change), shared by every local watcher of `channel`,
        whose `changes` counts notifications (and resubscriptions, which may have lost
        some) and whose `wait` wakes on each."""
        return self.attach(RunKeys(meta=channel, log=channel, turn=channel, text=channel), "0-0")

    # -- where channels are subscribed ------------------------------------------

    def _listener(self, node: str) -> _Listener:
        listener = self._listeners.get(node)
        if listener is None:
            listener = self._listeners[node] = _Listener(node)
            if self._task_group is not None:
                self._task_group.start_soon(self._listen, listener)
        return listener

    async def _add(self, channel: str, node: str, *, wake: bool) -> None:
        """Put the channel on `node`'s listener and subscribe it there (now, if it is
        connected; else when it connects). `wake`: mark the feed stale once subscribed."""
        listener = self._listener(node)
        listener.channels.add(channel)
        self._where[channel] = node
        if listener.pubsub is None:
            return  # the listener subscribes all its channels when it (re)connects
        try:
            await listener.pubsub.ssubscribe(channel)
        except BaseException as exc:
            # The connection is down (its listener reconnects), or this was cancelled
            # mid-way while the channel counts as subscribed for the feed's other readers:
            # either way it is subscribed again (and they are woken) shortly.
            self._retry_later(listener, [channel])
            if not isinstance(exc, _CONNECTION_LOST):
                raise
            log.debug("subscribe to %s deferred", channel)
            return
        if wake:
            self._wake([channel])

    async def _remove(self, channel: str) -> None:
        listener = self._listeners.get(self._where.pop(channel, ""))
        if listener is None:
            return
        listener.channels.discard(channel)
        listener.retry.discard(channel)
        if listener.pubsub is not None:
            with suppress(*_CONNECTION_LOST):
                await listener.pubsub.sunsubscribe(channel)

    async def _move(self, listener: _Listener, channels: Iterable[str], node: str) -> None:
        for channel in channels:
            listener.channels.discard(channel)
            listener.retry.discard(channel)
            await self._add(channel, node, wake=True)

    def _wake(self, channels: Iterable[str]) -> None:
        for channel in channels:
            feed = self._feeds.get(channel)
            if feed is not None:
                feed.mark_stale()  # notifications may have been missed meanwhile

    # -- the listeners ----------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the listeners until cancelled; started once the first has tried to connect."""
        async with anyio.create_task_group() as tg:
            self._task_group = tg
            try:
                for listener in self._listeners.values():  # feeds attached before we ran
                    tg.start_soon(self._listen, listener)
                # A private channel keeps a connection subscribed while no run is.
                await self._add(NOTIFIER_CHANNEL, self._router.locate(NOTIFIER_CHANNEL), wake=False)
                await self._tried.wait()
                task_status.started()
                await anyio.sleep_forever()
            finally:
                self._task_group = None

    async def _listen(self, listener: _Listener) -> None:
        """Deliver one node's notifications while it has channels, reconnecting on failure."""
        backoff = 0.05
        while listener.channels:
            client = self._router.connect(listener.node)
            pubsub = client.pubsub(push_handler_func=_as_it_came)
            reached = False
            try:
                await self._connect(listener, pubsub)
                reached = True
                backoff = 0.05
                connection = pubsub.connection  # (its first SSUBSCRIBE made it)
                if connection is None:
                    raise redis_errors.ConnectionError("the pub/sub connection is gone")
                while listener.channels:
                    try:
                        # Off the connection itself: PubSub.parse_response adds a health
                        # check and a retry layer per message, both unused here. No
                        # timeout (`math.inf`; one would cost a timeout context per
                        # message): channels to subscribe again are retried by
                        # `_retry_soon`.
                        response = await connection.read_response(
                            timeout=math.inf, disconnect_on_error=False, push_request=True
                        )
                    except redis_errors.AskError as refused:  # MovedError is one too
                        await self._refused(listener, refused)
                        continue
                    if isinstance(response, list) and response[0] == b"smessage":
                        # Nearly every message: straight to its feed (redis-py's message
                        # dict keeps no state for these).
                        feed = self._feeds.get(as_text(response[1]))
                        if feed is not None:
                            feed.push(response[2])
                    elif response is not None:  # (un)subscribe replies keep its state
                        message = await pubsub.handle_message(response)
                        if message is not None:
                            self._dispatch(listener, message)
            except (redis_errors.RedisError, OSError) as exc:
                # a standalone server's listener has no node name ("")
                where = listener.node or "the Redis server"
                log.warning("change notifications from %s interrupted: %s", where, exc)
            finally:
                listener.pubsub = None
                with anyio.CancelScope(shield=True):
                    with suppress(redis_errors.RedisError, OSError):
                        await pubsub.aclose()
                        await client.aclose()
                self._tried.set()
            # The node may have lost its slots (a failover): channels the router now
            # places elsewhere move there; the rest wait for this node to come back.
            # (A node that answers redirects by itself; one that cannot be reached
            # leaves the router to ask the others.)
            if not reached:
                with suppress(redis_errors.RedisError, OSError):
                    await self._router.refresh()
            for channel in list(listener.channels):
                node = self._router.locate(channel)
                if node != listener.node:
                    await self._move(listener, [channel], node)
            if listener.channels:
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
        if self._listeners.get(listener.node) is listener:
            del self._listeners[listener.node]

    async def _connect(self, listener: _Listener, pubsub: Any) -> None:
        channels = set(listener.channels)
        for group in _by_slot(channels):
            await pubsub.ssubscribe(*group)
        listener.pubsub = pubsub  # from now on, a channel added here subscribes itself
        # Channels added while we were connecting had no connection to subscribe on:
        # without this they would hear nothing until the next reconnect.
        for group in _by_slot(listener.channels - channels):
            await pubsub.ssubscribe(*group)
        listener.retry.clear()  # every channel is subscribed now
        self._wake(listener.channels)
        if listener.connected_before and self._on_reconnect is not None:
            self._on_reconnect()
        listener.connected_before = True
        self._tried.set()

    def _dispatch(self, listener: _Listener, message: dict[str, Any]) -> None:
        """A message other than a notification (those go straight to their feed)."""
        channel = as_text(message["channel"])
        if message["type"] == "sunsubscribe" and channel in listener.channels:
            # Not ours (we drop a channel before unsubscribing it): the node lost the
            # channel's slot. Asking again gets MOVED to its new owner.
            self._retry_later(listener, [channel])

    async def _refused(self, listener: _Listener, refused: redis_errors.AskError) -> None:
        """A SSUBSCRIBE the node refused: its slot's channels go where the node says
        (MOVED), or are retried shortly (ASK: the slot is being migrated)."""
        slot = refused.slot_id
        channels = [c for c in listener.channels if key_slot(c.encode()) == slot]
        if isinstance(refused, redis_errors.MovedError):
            await self._move(listener, channels, f"{refused.host}:{refused.port}")
        else:
            self._retry_later(listener, channels)

    def _retry_later(self, listener: _Listener, channels: Iterable[str]) -> None:
        """SSUBSCRIBE `channels` on the listener's connection again within
        `RETRY_SUBSCRIBE_SECONDS` (a reconnect in between subscribes them all anyway)."""
        listener.retry.update(channels)
        if not listener.retry_scheduled and self._task_group is not None:
            listener.retry_scheduled = True
            self._task_group.start_soon(self._retry_soon, listener)

    async def _retry_soon(self, listener: _Listener) -> None:
        await anyio.sleep(RETRY_SUBSCRIBE_SECONDS)
        listener.retry_scheduled = False
        pubsub = listener.pubsub
        if pubsub is not None and listener.retry:
            try:
                await self._subscribe_retries(listener, pubsub)
            except _CONNECTION_LOST:
                # Tried again shortly; a reconnect meanwhile subscribes them all instead.
                self._retry_later(listener, ())

    async def _subscribe_retries(self, listener: _Listener, pubsub: Any) -> None:
        channels = [channel for channel in listener.retry if channel in listener.channels]
        listener.retry.clear()
        try:
            for group in _by_slot(channels):
                await pubsub.ssubscribe(*group)
        except BaseException:
            listener.retry.update(channels)
            raise
        self._wake(channels)

    def close(self) -> None:
        """Wake every subscriber so it notices the bridge is closed."""
        self._closed = True
        for feed in self._feeds.values():
            feed.closed = True
            feed.wake()
