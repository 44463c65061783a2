"""Real Redis Sentinel processes watching a test's master (Debian's `redis-sentinel`).

    with SentinelGroup(master, replicas=2) as sentinels:   # 3 sentinels, quorum 2
        master.kill()
        new = sentinels.wait_promoted(away_from=master.port)  # (host, port)

Each sentinel runs on a free 127.0.0.1 port with its own config file (Sentinel rewrites
it) and log in a temp dir. `down-after-milliseconds` is 1000, so a killed master is
failed over within a few seconds; `failover-timeout` is long (30 s) so that Sentinel
does not re-point a replica a test detached on purpose (`+fix-slave-config` waits that
long) while the test is still using the detachment. Without `redis-sentinel` on PATH,
`redis-server --sentinel` (the same binary in sentinel mode) is used.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path
from types import TracebackType
from typing import Self

import redis

from tests.support.redis_servers import (
    HOST,
    REDIS_SERVER_BIN,
    RedisServer,
    _deadline_poll,
    _pdeathsig,
    free_port,
)

MASTER_NAME = "gw"
START_TIMEOUT = 20.0
FAILOVER_TIMEOUT = 30.0


def _argv(config: Path) -> list[str]:
    binary = shutil.which("redis-sentinel")
    if binary is not None:
        return [binary, str(config)]
    return [REDIS_SERVER_BIN, str(config), "--sentinel"]


class Sentinel:
    """One sentinel process monitoring `master` as `MASTER_NAME`."""

    def __init__(self, master: RedisServer, quorum: int, directory: Path) -> None:
        self.dir = directory
        self.port = free_port()
        self.config = directory / "sentinel.conf"
        self.config.write_text(
            "\n".join(
                [
                    f"port {self.port}",
                    f"bind {HOST}",
                    "daemonize no",
                    f"dir {directory}",
                    f"logfile {directory / 'sentinel.log'}",
                    f"sentinel monitor {MASTER_NAME} {HOST} {master.port} {quorum}",
                    f"sentinel down-after-milliseconds {MASTER_NAME} 1000",
                    f"sentinel failover-timeout {MASTER_NAME} 30000",
                    f"sentinel parallel-syncs {MASTER_NAME} 2",
                    "",
                ]
            )
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        main = threading.current_thread() is threading.main_thread()
        self.proc = subprocess.Popen(
            _argv(self.config),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self.dir,
            preexec_fn=_pdeathsig if main else None,
        )

        def ready() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.log_tail()
            with self.client() as c:
                return bool(c.ping())

        _deadline_poll(f"sentinel on {self.port}", ready, START_TIMEOUT, self.log_tail)
        return self

    def client(self) -> redis.Redis:
        return redis.Redis(host=HOST, port=self.port, socket_timeout=5, decode_responses=True)

    def master_state(self) -> dict[str, str]:
        with self.client() as c:
            raw = c.execute_command("SENTINEL", "MASTER", MASTER_NAME)
        if isinstance(raw, dict):
            return {str(k): str(v) for k, v in raw.items()}
        items = [str(x) for x in raw]
        return dict(zip(items[::2], items[1::2], strict=True))

    def master_address(self) -> tuple[str, int]:
        with self.client() as c:
            host, port = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME)
        return str(host), int(port)

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = (self.dir / "sentinel.log").read_text(errors="replace")
        except OSError:
            return "(no sentinel log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class SentinelGroup:
    """`count` sentinels over `master` and its `replicas`, started once each one knows
    the master, every replica and every other sentinel."""

    def __init__(self, master: RedisServer, *, replicas: int, count: int = 3) -> None:
        self.master = master
        self.replicas = replicas
        self.count = count
        self.quorum = count // 2 + 1
        self.dir = Path(tempfile.mkdtemp(prefix="sentinel-test-"))
        self.sentinels: list[Sentinel] = []

    def start(self) -> Self:
        try:
            for n in range(self.count):
                directory = self.dir / str(n)
                directory.mkdir()
                self.sentinels.append(Sentinel(self.master, self.quorum, directory).start())

            def acquainted() -> bool:
                for sentinel in self.sentinels:
                    state = sentinel.master_state()
                    if int(state["num-slaves"]) != self.replicas:
                        return False
                    if int(state["num-other-sentinels"]) != self.count - 1:
                        return False
                return True

            _deadline_poll("sentinels that know each other", acquainted, START_TIMEOUT, self.logs)
        except BaseException:
            self.close()
            raise
        return self

    def wait_promoted(self, *, away_from: int, timeout: float = FAILOVER_TIMEOUT) -> int:
        """The port of the new master once every sentinel names the same one, other than
        `away_from`, and that server says it is a master."""
        promoted: list[int] = []

        def agreed() -> bool:
            ports = {s.master_address()[1] for s in self.sentinels}
            if len(ports) != 1 or away_from in ports:
                return False
            (port,) = ports
            with redis.Redis(host=HOST, port=port, socket_timeout=5) as c:
                if c.info("replication").get("role") != "master":
                    return False
            promoted[:] = [port]
            return True

        _deadline_poll("a promoted master", agreed, timeout, self.logs)
        return promoted[0]

    def logs(self) -> str:
        return "\n".join(f"--- sentinel {s.port}\n{s.log_tail()}" for s in self.sentinels)

    def close(self) -> None:
        for sentinel in self.sentinels:
            with contextlib.suppress(Exception):
                sentinel.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
