"""A TCP relay that loses requests and replies on purpose, in front of Redis or a gateway.

    relay = FaultRelay(("127.0.0.1", port), marker=b"EVALSHA")
    await tg.start(relay.serve)          # then connect to 127.0.0.1:relay.port
    relay.armed = True                   # the next request's reply is lost

A request is a chunk from the client that contains `marker` (`EVALSHA` for a Redis
script, `/events HTTP/1.1` for a gateway append). For each one the relay decides:

- `PASS`: forward it and its reply;
- `DROP_REPLY`: forward it, then cut both connections when the reply starts: the server
  ran it, the client never learns (the case a blind retry must not duplicate);
- `DROP_REQUEST`: cut both connections before forwarding it: it never ran;
- `REPLY_503`: answer it with an HTTP 503 (`Retry-After: 0`, then close) without
  forwarding it, as a proxy whose backend is away does.

`armed = True` makes the next request `DROP_REPLY` once; `plan(n)` decides for the n-th
request (from 0) otherwise. `cut` counts lost replies, `refused` lost requests,
`unavailable` the 503s.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable
from typing import Final

import anyio
import anyio.abc


class Fault(enum.Enum):
    PASS = "pass"
    DROP_REPLY = "drop_reply"
    DROP_REQUEST = "drop_request"
    REPLY_503 = "reply_503"


UNAVAILABLE: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 0\r\nContent-Length: 0\r\n"
    b"Connection: close\r\n\r\n"
)


class FaultRelay:
    def __init__(
        self,
        target: tuple[str, int],
        *,
        marker: bytes = b"EVALSHA",
        plan: Callable[[int], Fault] | None = None,
    ) -> None:
        self.target = target
        self.marker = marker
        self.plan = plan
        self.armed = False
        self.requests = 0  # requests seen (chunks with the marker)
        self.cut = 0  # replies lost
        self.refused = 0  # requests lost
        self.unavailable = 0  # requests answered 503
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        task_status.started()
        async with listener:  # serve() returns on cancellation without closing it
            await listener.serve(self._relay)

    def _decide(self) -> Fault:
        n = self.requests
        self.requests += 1
        if self.armed:
            self.armed = False
            return Fault.DROP_REPLY
        return self.plan(n) if self.plan is not None else Fault.PASS

    async def _relay(self, client: anyio.abc.SocketStream) -> None:
        swallow = anyio.Event()  # set: the next reply is dropped with the connections
        try:
            server = await anyio.connect_tcp(*self.target)
        except OSError:
            await client.aclose()
            return
        async with client, server, anyio.create_task_group() as tg:

            async def up() -> None:
                with contextlib.suppress(*_GONE):
                    async for chunk in client:
                        if self.marker in chunk:
                            fault = self._decide()
                            if fault is Fault.DROP_REQUEST:
                                self.refused += 1
                                break
                            if fault is Fault.REPLY_503:
                                self.unavailable += 1
                                await client.send(UNAVAILABLE)
                                break
                            if fault is Fault.DROP_REPLY:
                                swallow.set()
                        await server.send(chunk)
                tg.cancel_scope.cancel()  # one side closed or was cut: so is the other

            async def down() -> None:
                with contextlib.suppress(*_GONE):
                    async for chunk in server:
                        if swallow.is_set():  # the server ran it; the client never hears
                            self.cut += 1
                            break
                        await client.send(chunk)
                tg.cancel_scope.cancel()

            tg.start_soon(up)
            tg.start_soon(down)


_GONE = (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream)
