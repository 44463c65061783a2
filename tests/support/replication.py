"""A real replica of a test's `RedisServer` (`--replicaof`), and faults on it.

    replica = start_replica(master)        # a RedisServer replicating master, in sync
    with stopped(replica): ...             # SIGSTOP: connected, but it acknowledges nothing
    detach(replica)                        # REPLICAOF a closed port: it stops replicating
    promote(replica)                       # REPLICAOF NO ONE: a primary of its own

The caller closes the replica (`replica.close()`), as any `RedisServer`.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

from tests.support.redis_servers import HOST, RedisServer, _deadline_poll, free_port

SYNC_TIMEOUT = 20.0


def start_replica(master: RedisServer, *extra_args: str) -> RedisServer:
    """A new redis-server replicating `master`, returned once the master counts it as an
    online replica (its first sync done)."""
    replica = RedisServer("--replicaof", HOST, str(master.port), *extra_args).start()
    try:
        wait_in_sync(master, replica)
    except BaseException:
        replica.close()
        raise
    return replica


def wait_in_sync(master: RedisServer, replica: RedisServer) -> None:
    """Until `master` lists `replica` online and at the master's offset."""
    with master.client() as primary:

        def synced() -> bool:
            info = primary.info("replication")
            offset = info.get("master_repl_offset")
            replicas = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
            return any(
                v.get("port") == replica.port
                and v.get("state") == "online"
                and v.get("offset") == offset
                for v in replicas
            )

        _deadline_poll(f"replica {replica.port} in sync", synced, SYNC_TIMEOUT, replica.log_tail)


@contextlib.contextmanager
def stopped(replica: RedisServer) -> Iterator[None]:
    """The replica's process stopped (SIGSTOP): its link stays up as the master sees it,
    but it applies and acknowledges nothing until the block ends (SIGCONT)."""
    proc = replica.proc
    assert proc is not None, "the replica is not running"
    proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        proc.send_signal(signal.SIGCONT)


def detach(replica: RedisServer) -> None:
    """The replica stops replicating (it follows a port where nothing listens), as after
    a partition: what the master writes from now on never reaches it."""
    with replica.client() as raw:
        raw.execute_command("REPLICAOF", HOST, str(free_port()))


def promote(replica: RedisServer) -> None:
    """The replica becomes a primary (what Sentinel does on failover)."""
    with replica.client() as raw:
        raw.execute_command("REPLICAOF", "NO", "ONE")
