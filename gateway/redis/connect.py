"""Connection setup: the command client (one server or a Redis Cluster) and where the
notifier listens. Nothing here sends a command; `calls.py` is the boundary every call
goes through."""

from __future__ import annotations

import functools
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit

from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.driver_info import DriverInfo

from ..settings import Settings
from .notifier import OneServer, Router
from .wire import CheckedPool

RedisClient = Redis | RedisCluster
CLUSTER_SCHEMES: Final = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def no_retry() -> Retry:
    return Retry(NoBackoff(), 0)


def connect_client(settings: Settings) -> RedisClient:
    """The command client, with redis-py's own retries switched off.

    redis-py (8.x) re-sends a command up to 10 times on a ConnectionError/TimeoutError,
    also when the command may already have run (the reply was lost): for a publish
    script that is a silently duplicated event. So redis-py never retries here; the
    call boundary does (`calls.py`): reads on any backend error, writes only on replies that say
    the server refused the command without running it (CLUSTERDOWN, TRYAGAIN, an
    uncovered slot). Any other failure of a write reaches the caller as
    BackendUnavailable (HTTP 503): the write may or may not have been applied, and the
    producer can find out from the run's `last_event_id`. MOVED/ASK redirections are
    followed by the cluster client itself (the command was not run where it was refused).

    Timeouts: connecting is bounded by `redis_connect_timeout_seconds`; every bridge
    operation by `redis_command_timeout_seconds` (`Calls`, with a `CallDeadline`).
    redis-py's own socket timeout stays off: it wraps each send in `asyncio.wait_for`,
    which on Python 3.11 can drop a cancellation that arrives as the send completes, and
    a response whose client went away must always be stoppable.
    """
    url = settings.redis_url
    assert url is not None
    timeouts: dict[str, Any] = {
        "socket_timeout": None,
        "socket_connect_timeout": settings.redis_connect_timeout_seconds,
    }
    scheme, sep, rest = url.partition("://")
    if scheme in CLUSTER_SCHEMES:
        return RedisCluster.from_url(
            f"{CLUSTER_SCHEMES[scheme]}{sep}{rest}",
            max_connections=settings.redis_max_connections,
            retry=no_retry(),
            **timeouts,
        )
    # A plain pool, never waited on: every caller takes a pass first (`pool.PoolGate`: the
    # bridge's calls and the session store's), and there are as many passes as
    # connections, so a caller with its pass always finds one free. (redis-py's blocking
    # pool would add a condition and a timer to every command.) It checks every
    # connection it hands out.
    pool = CheckedPool.from_url(
        url,
        max_connections=settings.redis_max_connections,
        retry=no_retry(),
        # What CLIENT SETINFO says, made once: redis-py's default looks its own version
        # up in the package metadata for every new connection (~0.5 ms of CPU each; a
        # fresh process's first storm of resumes opens dozens at once).
        driver_info=_driver_info(),
        **timeouts,
    )
    return Redis(connection_pool=pool)


@functools.cache
def _driver_info() -> DriverInfo:
    return DriverInfo()


def notification_router(commands: RedisClient, settings: Settings) -> Router:
    """Where the notifier listens: the server itself, or each channel's slot owner."""
    url = settings.redis_url
    assert url is not None
    # It waits for messages indefinitely by design; only connecting is bounded. redis-py's
    # own reconnect-and-resubscribe is off: the notifier reconnects itself, so that it
    # knows to subscribe every live feed and to mark them stale (notifications may have
    # been lost meanwhile).
    options: dict[str, Any] = {
        "socket_connect_timeout": settings.redis_connect_timeout_seconds,
        "retry": no_retry(),
    }
    if isinstance(commands, Redis):
        return OneServer(lambda: Redis.from_url(url, **options))
    return ClusterRouter(commands, url, options)


class ClusterRouter:
    """Shard channels of a Redis Cluster: located with the command client's slot map (a
    node that no longer owns a slot answers MOVED; one that cannot be reached makes the
    notifier `refresh` the map from the other nodes)."""

    def __init__(self, commands: RedisCluster, url: str, options: dict[str, Any]) -> None:
        scheme, _, rest = url.partition("://")
        self._commands = commands
        self._parts = urlsplit(f"{CLUSTER_SCHEMES[scheme]}://{rest}")
        self._userinfo = self._parts.netloc.rpartition("@")[0]
        # The URL's TLS options (ssl_ca_certs, ssl_certfile, ...) apply to every node;
        # its other options are the cluster client's own, which a node client refuses.
        tls = [(k, v) for k, v in parse_qsl(self._parts.query) if k.startswith("ssl_")]
        self._query = urlencode(tls)
        self._options = options

    def locate(self, channel: str) -> str:
        try:
            node = self._commands.get_node_from_key(channel)
        except redis_errors.SlotNotCoveredError:
            node = None  # mid-failover: any node redirects to the owner once there is one
        return (node or self._commands.get_default_node()).name

    async def refresh(self) -> None:
        # The slot map the command client shares (it does not always re-learn it by
        # itself after a primary died, with its retries off).
        await self._commands.nodes_manager.initialize()

    def connect(self, node: str) -> Redis:
        netloc = f"{self._userinfo}@{node}" if self._userinfo else node
        address = self._parts._replace(netloc=netloc, query=self._query).geturl()
        return Redis.from_url(address, **self._options)
