"""A small SSE client for tests: httpx streaming plus a byte-level frame parser.

Frames keep the raw bytes of their `data:` lines, so tests can compare the payload with
the producer's encoding byte for byte. Comments (`: heartbeat`) and `retry:` hints are
frames too, in order, so tests can assert what comes first: the gateway writes them as
lone lines (no blank line after them, so no client dispatches an empty event), and a
lone line at the start of a frame is reported as its own frame here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

TERMINAL = frozenset({"end", "gap", "unavailable"})


@dataclass
class Frame:
    id: str | None = None
    event: str | None = None
    data_lines: list[bytes] = field(default_factory=list)
    retry: int | None = None
    comments: list[bytes] = field(default_factory=list)

    @property
    def data(self) -> bytes:
        return b"\n".join(self.data_lines)

    def json(self) -> Any:
        return orjson.loads(self.data)

    @property
    def data_id(self) -> str | None:
        """The id of a data event (a cursor); None for every other frame."""
        return None if self.event in TERMINAL else self.id

    @property
    def is_event(self) -> bool:
        return bool(self.data_lines) or self.event is not None


class SSEParser:
    """Feed raw bytes; get complete frames back (a blank line ends a frame)."""

    def __init__(self) -> None:
        self._buffer = b""
        self._frame = Frame()
        self._touched = False

    def feed(self, chunk: bytes) -> list[Frame]:
        self._buffer += chunk
        frames: list[Frame] = []
        while True:
            index = self._buffer.find(b"\n")
            if index < 0:
                return frames
            line, self._buffer = self._buffer[:index], self._buffer[index + 1 :]
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self._touched:
                    frames.append(self._frame)
                self._frame, self._touched = Frame(), False
                continue
            if line.startswith(b":"):
                if not self._touched:
                    frames.append(Frame(comments=[line[1:].strip()]))
                    continue
                self._frame.comments.append(line[1:].strip())
                continue
            name, _, value = line.partition(b":")
            if value.startswith(b" "):
                value = value[1:]
            if name == b"retry" and not self._touched:
                frames.append(Frame(retry=int(value)))
                continue
            self._touched = True
            if name == b"id":
                self._frame.id = value.decode()
            elif name == b"event":
                self._frame.event = value.decode()
            elif name == b"data":
                self._frame.data_lines.append(value)
            elif name == b"retry":
                self._frame.retry = int(value)


@dataclass
class SSEResult:
    status: int
    headers: httpx.Headers
    frames: list[Frame]
    body: bytes = b""

    @property
    def events(self) -> list[Frame]:
        """Data events (frames with an id, other than the terminal `end`/`gap`)."""
        return [f for f in self.frames if f.id is not None and f.event not in TERMINAL]

    @property
    def terminal(self) -> Frame | None:
        last = [f for f in self.frames if f.event in TERMINAL]
        return last[-1] if last else None


async def iter_frames(response: httpx.Response) -> AsyncIterator[Frame]:
    parser = SSEParser()
    async for chunk in response.aiter_raw():
        for frame in parser.feed(chunk):
            yield frame


async def read_stream(
    client: httpx.AsyncClient,
    url: str,
    *,
    headers: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
    stop: Callable[[Frame], bool] | None = None,
) -> SSEResult:
    """Read an SSE response until it ends (or `stop(frame)` says so, then disconnect)."""
    async with client.stream("GET", url, headers=headers, params=params) as response:
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            frames: list[Frame] = []
            async for frame in iter_frames(response):
                frames.append(frame)
                if stop is not None and stop(frame):
                    break
            return SSEResult(response.status_code, response.headers, frames)
        body = await response.aread()
        return SSEResult(response.status_code, response.headers, [], body)
