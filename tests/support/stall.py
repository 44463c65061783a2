"""A Redis the test started, blocked in `DEBUG SLEEP` (it needs `--enable-debug-command
yes`): what a stalled server looks like to the gateway, for as long as the test says."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.redis_servers import HOST, RedisServer


def wait_until_stalled(probe: socket.socket, within: float) -> None:
    """Until a PING on `probe` (connected beforehand) goes unanswered for 0.1 s: the
    DEBUG SLEEP has reached the server. A bare socket, so no client retries stretch
    the wait into the stall."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        probe.sendall(b"PING\r\n")
        if not select.select([probe], [], [], 0.1)[0]:
            return
        assert probe.recv(64).startswith(b"+PONG"), "unexpected reply to PING"
    raise AssertionError("Redis never stalled")


@contextmanager
def stalled(server: RedisServer, seconds: float) -> Iterator[None]:
    """`server` blocked in DEBUG SLEEP for `seconds` (from a thread: it blocks), entered
    once the sleep has begun; leaving waits for it to end."""

    sending = threading.Event()

    def sleep() -> None:
        with server.client(socket_timeout=seconds + 5) as raw:
            raw.ping()  # connected: what follows goes straight out
            sending.set()
            raw.execute_command("DEBUG", "SLEEP", str(seconds))

    with socket.create_connection((HOST, server.port), timeout=5) as probe:
        thread = threading.Thread(target=sleep, daemon=True)
        thread.start()
        # A PING can miss its timeout on a loaded machine too: it counts only once the
        # DEBUG SLEEP is on its way.
        assert sending.wait(seconds / 2), "the DEBUG SLEEP was never sent"
        wait_until_stalled(probe, seconds / 2)
    try:
        yield
    finally:
        thread.join(seconds + 10)
