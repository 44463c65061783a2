"""Worker processes that share one listening socket, started and stopped together.

`gateway serve --workers N` (`gateway.cli`) binds the socket here, then `supervise`
starts N processes with multiprocessing's "spawn" method (a fresh interpreter each:
no event loop, thread or connection is inherited from the parent) and hands each one
the socket and its arguments explicitly, pickled. It then only watches:

- SIGTERM or SIGINT: every worker gets SIGTERM (its graceful shutdown), and one still
  running after `stop_timeout` seconds gets SIGKILL. The exit code is 0 when every
  worker exited 0 (or died of the SIGTERM sent to it before it could catch one).
- A worker that ends on its own (a crash, a startup failure): the others are stopped
  the same way and the parent exits non-zero (the worker's code, 128 + signal for a
  signal), so the service manager restarts the whole set. Workers are not restarted
  one by one.
- The parent killed outright (SIGKILL): each worker notices (`parent_process()`'s
  sentinel) and sends itself SIGTERM, so no worker outlives the parent.

The module knows nothing of the gateway: the worker function is any picklable
module-level callable, called as `target(*args, sock)` in each worker.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any, Final

log: Final = logging.getLogger("gateway.supervisor")

STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)


def bind_listener(host: str, port: int, backlog: int) -> socket.socket:
    """The listening TCP socket the workers share; IPv6 when the host has a colon (as
    uvicorn's own `--workers` binds). Raises OSError (e.g. address in use)."""
    address = host.strip("[]")
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


class _Wakeup:
    """SIGTERM/SIGINT handler of the parent: records the signal and wakes its wait."""

    def __init__(self) -> None:
        self.signalled = False
        self.read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        os.set_blocking(self.read_fd, False)

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.signalled = True
        with contextlib.suppress(BlockingIOError):  # already awake: the pipe is full
            os.write(self._write_fd, b"\0")

    def clear(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self.read_fd, 4096)

    def close(self) -> None:
        os.close(self.read_fd)
        os.close(self._write_fd)


@contextlib.contextmanager
def _signals_to(handler: _Wakeup) -> Iterator[None]:
    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _exit_code(code: int | None) -> int:
    """A worker's exit status as a shell reports it (128 + N for signal N)."""
    if code is None:
        return 1
    return 128 - code if code < 0 else code


def supervise(
    target: Callable[..., None],
    args: tuple[Any, ...],
    sock: socket.socket,
    workers: int,
    *,
    stop_timeout: float,
) -> int:
    """Run `target(*args, sock)` in `workers` spawned processes until SIGTERM/SIGINT or
    until one of them ends; returns the exit code for the parent. Closes `sock`."""
    ctx = multiprocessing.get_context("spawn")
    wakeup = _Wakeup()
    procs: list[BaseProcess] = []
    try:
        with _signals_to(wakeup):
            try:
                for index in range(workers):
                    if wakeup.signalled:
                        break
                    proc = ctx.Process(
                        target=_worker_main,
                        args=(target, args, sock),
                        name=f"gateway-worker-{index + 1}",
                    )
                    proc.start()
                    procs.append(proc)
                    log.info(
                        "worker started",
                        extra={"event": "worker_started", "worker": index + 1, "pid": proc.pid},
                    )
            finally:
                # Each started worker holds its own copy; the parent accepts nothing.
                sock.close()
            return _watch(procs, wakeup, stop_timeout)
    finally:
        for leftover in procs:  # still running only if the parent itself failed
            if leftover.exitcode is None:
                leftover.kill()
                leftover.join()
        wakeup.close()


def _watch(procs: list[BaseProcess], wakeup: _Wakeup, stop_timeout: float) -> int:
    failed: int | None = None  # exit code of the first worker that ended on its own
    exited: set[int] = set()  # indexes of workers whose exit is logged
    kill_at: float | None = None  # set when SIGTERM went to the workers still running
    sent_term: set[int] = set()
    killed = False
    while True:
        # One reading of the exit codes per round: a worker ending meanwhile is still
        # counted alive, so its sentinel wakes the next round and its exit is logged.
        codes = [proc.exitcode for proc in procs]
        for index, (proc, code) in enumerate(zip(procs, codes, strict=True)):
            if index in exited or code is None:
                continue
            exited.add(index)
            log.log(
                logging.INFO if code == 0 else logging.WARNING,
                "worker exited",
                extra={"event": "worker_exited", "pid": proc.pid, "exit_code": code},
            )
            if failed is None and kill_at is None and not wakeup.signalled:
                failed = _exit_code(code) or 1  # even a clean exit was not asked for
        alive = [proc for proc, code in zip(procs, codes, strict=True) if code is None]
        if not alive:
            break
        if kill_at is None and (wakeup.signalled or failed is not None):
            for index, proc in enumerate(procs):
                if proc.exitcode is None:
                    sent_term.add(index)
                    proc.terminate()
            kill_at = time.monotonic() + stop_timeout
        timeout = None
        if kill_at is not None and not killed:
            timeout = kill_at - time.monotonic()
            if timeout <= 0:
                killed, timeout = True, None
                for proc in alive:
                    log.warning(
                        "worker did not stop in time, killed",
                        extra={"event": "worker_killed", "pid": proc.pid},
                    )
                    proc.kill()
        wait([wakeup.read_fd, *(proc.sentinel for proc in alive)], timeout)
        wakeup.clear()
    if failed is not None:
        return failed
    for index, proc in enumerate(procs):
        # A worker still starting up dies of the SIGTERM (its handlers are not in place yet).
        stopped_by_us = index in sent_term and proc.exitcode == -signal.SIGTERM
        if proc.exitcode != 0 and not stopped_by_us:
            return _exit_code(proc.exitcode)
    return 0


def _worker_main(target: Callable[..., None], args: tuple[Any, ...], sock: socket.socket) -> None:
    threading.Thread(target=_stop_with_parent, name="gateway-parent-watch", daemon=True).start()
    target(*args, sock)


def _stop_with_parent() -> None:
    """In a worker: SIGTERM to itself once the parent is gone (killed without stopping
    its workers), so the worker shuts down as if the parent had stopped it."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    wait([parent.sentinel])
    os.kill(os.getpid(), signal.SIGTERM)
