"""What an operator reads when the Redis a gateway points at is down: a named server."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.test_cli import Server, free_port, start_server, wait_for

pytestmark = pytest.mark.timeout(30)
__all__ = ["start_server"]


def test_notification_warning_names_the_server(start_server: Callable[..., Server]) -> None:
    closed = free_port()  # nothing listens there
    server = start_server("--redis-url", f"redis://127.0.0.1:{closed}/0")
    line = wait_for(
        lambda: next(
            (ln for ln in server.log().splitlines() if "change notifications from" in ln), None
        ),
        20,
        "the notifier's warning",
    )
    assert "change notifications from the Redis server interrupted" in line, line
    assert f"127.0.0.1:{closed}" in line  # redis-py's reason names the address
