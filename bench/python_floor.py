"""bench/token_stream.py's `python-floor`: not a product, the least a CPython process does per
streamed token for the socket work the sweep asks of the gateway, to tell what is reachable.

    python bench/python_floor.py --port P --redis-url redis://127.0.0.1:6379[/db]

Just what token_load's `stream` kind drives, on uvloop + httptools + hiredis + orjson:
- POST /v1/runs {"run_id"}: HSET of the run's token and status, then 201 {"producer_token"}.
- GET /v1/runs/{id}/stream: SSUBSCRIBE to the run's channel (once per run per process), then
  200 text/event-stream (chunked); each notification is written as it comes, one SSE frame.
- POST /v1/runs/{id}/events, chunked ndjson: per line, orjson-checked and re-encoded as the
  gateway does, one EVALSHA of SCRIPT (fence read, XADD, SPUBLISH of the ready SSE frame),
  pipelined on one connection; an ack line per reply, then the done line.
Not done (the gateway does): leases, seq numbering, trimming, Last-Event-ID resume, auth,
backpressure, limits, logging, metrics. Anything else is answered 404.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import secrets
from collections import deque
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import hiredis
import httptools
import orjson
import uvloop

# The fenced append, and the notification as the SSE frame itself: the subscriber only adds
# the chunk framing, so no per-token parsing or formatting is left to Python on that side.
SCRIPT = b"""
local fence = redis.call('HMGET', KEYS[1], 'token', 'status')
if fence[1] ~= ARGV[1] then return redis.error_reply('fenced') end
if fence[2] ~= 'running' then return redis.error_reply('ended') end
local id = redis.call('XADD', KEYS[2], '*', 'e', ARGV[2], 'd', ARGV[3])
redis.call('SPUBLISH', KEYS[2], 'id: ' .. id .. '\\nevent: ' .. ARGV[2] .. '\\ndata: '
  .. ARGV[3] .. '\\n\\n')
return id
"""
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
    b"Cache-Control: no-cache, no-transform\r\nTransfer-Encoding: chunked\r\n\r\n"
)
NDJSON_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
)
NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"


class Redis(asyncio.Protocol):
    """One raw connection. Commands are queued and written once per loop pass (one write for
    all the tokens that came in that pass), never waiting on a reply; replies come back in
    order, so a FIFO of callbacks matches them. `push`: every reply goes there (pub/sub)."""

    def __init__(self, push: Callable[[Any], None] | None = None) -> None:
        self.reader = hiredis.Reader()
        self.waiting: deque[Callable[[Any], None]] = deque()
        self.out: list[bytes] = []
        self.push = push
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()  # (made on the loop; not looked up per token)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        raise SystemExit(f"redis connection lost: {exc}")  # a floor: no reconnecting

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            (self.push or self.waiting.popleft())(reply)

    def call(self, done: Callable[[Any], None] | None, *args: bytes | str) -> None:
        if done is not None:  # (None: a pub/sub command, whose replies go to `push`)
            self.waiting.append(done)
        if not self.out:
            self.loop.call_soon(self.flush)
        self.out.append(hiredis.pack_command(args))

    def flush(self) -> None:
        assert self.transport is not None
        self.transport.write(b"".join(self.out))
        self.out.clear()


class App:
    cmd: Redis  # the appends and claims
    sub: Redis  # the notifications
    sha = b""  # SCRIPT's

    def __init__(self) -> None:
        self.followers: dict[bytes, list[asyncio.Transport]] = {}  # channel -> SSE sockets
        self.pending: dict[bytes, list[asyncio.Transport]] = {}  # until SSUBSCRIBE confirms

    def follow(self, channel: bytes, transport: asyncio.Transport) -> None:
        if channel in self.followers:
            self.followers[channel].append(transport)
            transport.write(SSE_HEAD)
        elif channel in self.pending:
            self.pending[channel].append(transport)
        else:
            self.pending[channel] = [transport]
            self.sub.call(None, b"SSUBSCRIBE", channel)

    def unfollow(self, channel: bytes, transport: asyncio.Transport) -> None:
        for table in (self.followers, self.pending):
            if transport in table.get(channel, ()):
                table[channel].remove(transport)  # (the channel stays subscribed)

    def notified(self, reply: list[Any]) -> None:
        kind, channel, payload = reply
        if kind == b"smessage":
            chunk = b"%x\r\n%s\r\n" % (len(payload), payload)
            for transport in self.followers.get(channel, ()):
                transport.write(chunk)
        elif kind == b"ssubscribe":  # subscribed: the followers waiting for it start now
            waiting = self.pending.pop(channel, [])
            self.followers.setdefault(channel, []).extend(waiting)
            for transport in waiting:
                transport.write(SSE_HEAD)


class Http(asyncio.Protocol):
    """One client connection: claims (keep-alive), a follower, or one streamed append."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url, self.token, self.body, self.rest = b"", b"", b"", b""
        self.keys: tuple[bytes, bytes] | None = None  # a streamed append's (meta, log) keys
        self.channel = b""  # a follower's
        self.in_flight = self.count = 0
        self.last_id = b""
        self.body_done = self.failed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.channel:
            self.app.unfollow(self.channel, self.transport)  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()  # type: ignore[union-attr]

    def on_message_begin(self) -> None:
        self.url, self.body = b"", b""

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"x-producer-token":
            self.token = value

    def on_headers_complete(self) -> None:
        transport, method = self.transport, self.parser.get_method()
        assert transport is not None
        parts = self.url.split(b"/")  # b"", b"v1", b"runs", run_id, b"stream" | b"events"
        if len(parts) != 5 or parts[:3] != [b"", b"v1", b"runs"]:
            return
        tag = b"floor:{%s}" % parts[3]  # its own keys, a run's in one slot as the gateway's
        if method == b"GET" and parts[4] == b"stream":
            self.channel = tag + b":log"
            self.app.follow(self.channel, transport)
        elif method == b"POST" and parts[4] == b"events":
            self.keys = (tag + b":meta", tag + b":log")
            transport.write(NDJSON_HEAD)

    def on_body(self, body: bytes) -> None:
        if self.keys is None:
            self.body += body
            return
        *lines, self.rest = (self.rest + body).split(b"\n")
        for line in lines:
            if line.strip() and not self.failed:
                self.append(line)

    def append(self, line: bytes) -> None:
        try:  # the gateway's line check: a JSON object with an event name; data re-encoded
            doc = orjson.loads(line)
            event, data = doc["event"].encode(), orjson.dumps(doc["data"])
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
            self.fail(b"invalid_event")
            return
        assert self.keys is not None
        self.in_flight += 1
        app = self.app
        app.cmd.call(self.appended, b"EVALSHA", app.sha, b"2", *self.keys, self.token, event, data)

    def appended(self, reply: Any) -> None:
        self.in_flight -= 1
        if self.failed:
            return
        if isinstance(reply, hiredis.ReplyError):
            self.fail(str(reply).split()[-1].encode())  # (Redis may prefix `ERR `)
            return
        self.count += 1
        self.last_id = reply
        self.write_line(b'{"ids":["%s"],"cancel_requested":false}\n' % reply)
        if self.body_done and not self.in_flight:
            self.finish()

    def write_line(self, line: bytes, last: bool = False) -> None:
        end = b"0\r\n\r\n" if last else b""
        self.transport.write(b"%x\r\n%s\r\n%s" % (len(line), line, end))  # type: ignore[union-attr]

    def finish(self) -> None:
        done = b'{"done":true,"count":%d,"last_id":"%s"}\n' % (self.count, self.last_id)
        self.write_line(done, last=True)
        self.keys = None  # (the connection may carry another request)

    def fail(self, code: bytes) -> None:
        self.failed = True
        error = orjson.dumps({"error": code.decode(), "applied": self.count})
        self.write_line(error + b"\n", last=True)
        self.transport.close()  # type: ignore[union-attr]

    def on_message_complete(self) -> None:
        transport = self.transport
        assert transport is not None
        if self.keys is not None:
            self.body_done = True
            if not self.in_flight and not self.failed:
                self.finish()
        elif self.url == b"/v1/runs" and self.parser.get_method() == b"POST":
            run_id = orjson.loads(self.body)["run_id"].encode()
            token = secrets.token_hex(16).encode()

            def claimed(_: Any) -> None:
                body = b'{"run_id":"%s","producer_token":"%s"}' % (run_id, token)
                transport.write(
                    b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                )

            meta = b"floor:{%s}:meta" % run_id
            self.app.cmd.call(claimed, b"HSET", meta, b"token", token, b"status", b"running")
        elif not self.channel:
            transport.write(NOT_FOUND)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # a socket per follower/producer
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    url = urlsplit(args.redis_url)
    loop = asyncio.get_running_loop()
    host, port = url.hostname or "127.0.0.1", url.port or 6379
    app = App()
    _, app.cmd = await loop.create_connection(Redis, host, port)
    _, app.sub = await loop.create_connection(lambda: Redis(app.notified), host, port)
    loaded: asyncio.Future[Any] = loop.create_future()
    if url.path.strip("/") not in ("", "0"):  # (streams live in a db; pub/sub has none)
        app.cmd.call(loaded.set_result, b"SELECT", url.path.strip("/"))
        await loaded
        loaded = loop.create_future()
    app.cmd.call(loaded.set_result, b"SCRIPT", b"LOAD", SCRIPT)
    app.sha = await loaded
    server = await loop.create_server(lambda: Http(app), "127.0.0.1", args.port, backlog=4096)
    await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(main())
