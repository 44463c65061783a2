"""A TCP endpoint that a test moves from one server to another, as a managed Redis
endpoint or a DNS name that follows the primary does after a failover.

    forwarder = TcpForwarder(master.address).start()   # clients use forwarder.url
    forwarder.repoint(new_master.address)              # cuts every open connection
    forwarder.close()

It runs on its own threads (blocking sockets), so a test's event loop blocked in a
synchronous Redis call never stalls the gateway's traffic through it. A connection whose
target refuses it is closed at once, as a connection to a dead server is.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType
from typing import Self

HOST = "127.0.0.1"
CONNECT_TIMEOUT = 2.0
CHUNK = 65536


class TcpForwarder:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._closed = threading.Event()

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}"

    def start(self) -> Self:
        listener = socket.create_server((HOST, 0))
        self.port = int(listener.getsockname()[1])
        self._listener = listener
        threading.Thread(target=self._accept, name="forwarder-accept", daemon=True).start()
        return self

    def repoint(self, target: tuple[str, int]) -> None:
        """New connections go to `target`; every open one is cut (its server is gone)."""
        with self._lock:
            self.target = target
            cut, self._open = self._open, set()
        for sock in cut:
            _close(sock)

    def close(self) -> None:
        self._closed.set()
        if self._listener is not None:
            _close(self._listener)
        self.repoint(self.target)

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        with self._lock:
            target = self.target
        try:
            server = socket.create_connection(target, timeout=CONNECT_TIMEOUT)
        except OSError:
            _close(client)
            return
        server.settimeout(None)
        with self._lock:
            if target != self.target or self._closed.is_set():  # moved meanwhile
                _close(client)
                _close(server)
                return
            self._open.update((client, server))
        for source, sink in ((client, server), (server, client)):
            threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(CHUNK):
                sink.sendall(chunk)
        except OSError:
            pass
        # One side ended or was cut: so is the other, as one TCP connection would be.
        with self._lock:
            self._open.discard(source)
            self._open.discard(sink)
        _close(source)
        _close(sink)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
