"""What a stream kind is to the SSE response: a `Framing`, passed in, never a subclass.

The response (`sse.SSEResponse`) owns the lifecycle every stream shares (disconnects,
drains, send timeouts, coalesced writes, token expiry); a framing says only what goes
on the wire, with one dispatch over its items (`frame`) and one terminal method for
every ending that is not an item (`closing`). Each kind lives in its own module under
`gateway/http/framings/`: the run stream, the LangGraph routes, the AI SDK UI message
stream, the session feed. A framing's `frame` matches every kind of item its stream
yields and ends in `assert_never`, so a kind it misses is a type error (mypy --strict),
not a malformed stream.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from enum import Enum
from typing import Protocol, TypeVar

ItemT = TypeVar("ItemT")
ItemT_contra = TypeVar("ItemT_contra", contravariant=True)

# One subscription of a stream: batches of its items, everything ready at once.
Steps = Callable[[], AsyncGenerator[Sequence[ItemT], None]]


class Closing(Enum):
    """How a response ends when no item of its stream ended it."""

    SHUTDOWN = "shutdown"  # the server drains: the client should reconnect elsewhere
    TOKEN_EXPIRED = "token_expired"  # the reader's token expired: reconnect with a fresh one
    UNAVAILABLE = "unavailable"  # the subscriber-side backend failed: reconnect later


class Framing(Protocol[ItemT_contra]):
    """How one kind of stream writes its items.

    `terminal`: the item types that end the stream (the response's last write).
    `frame(item)`: the bytes for one item; `b""` leaves the item out of this stream.
    `closing(why, detail)`: the last bytes of a response that ends otherwise; None ends
    it as a dropped connection instead (for a client that would read a clean end as a
    finished answer, and resumes an interrupted one).
    """

    @property
    def terminal(self) -> tuple[type, ...]: ...

    def opening(self) -> bytes: ...

    def frame(self, item: ItemT_contra) -> bytes: ...

    def closing(self, why: Closing, detail: str) -> bytes | None: ...
