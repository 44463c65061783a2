"""The console in a newcomer's first minute, in headless Chromium (tests/support/browser.py).

Against a real `gateway serve --demo` subprocess (tests/test_cli.py's `Server`), the
page at `/?session=demo` says in its fields which session it follows, shows each demo
turn once in the turns panel, and follows each next turn from the session feed without
polling. A second test fills a session past what the turns panel keeps. Screenshots
go to `test-artifacts/console-*.png`.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Page

from tests.support.browser import ARTIFACTS, chromium, skip_without_chromium
from tests.support.http_server import ProducerClient, make_settings, serve
from tests.test_cli import Server

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

WAIT_MS = 15_000
MAX_TURN_ROWS = 20  # console.js

skip_without_chromium()


@pytest.fixture
def demo_server(tmp_path: Path) -> Iterator[Server]:
    """`gateway serve --demo`, a short pause between its turns (each takes ~3 s)."""
    server = Server(tmp_path, "--demo", "--demo-pause", "0.5")
    try:
        server.wait_healthy()
        yield server
    finally:
        server.close()


@asynccontextmanager
async def new_page() -> AsyncIterator[Page]:
    async with chromium() as browser:
        context = await browser.new_context(viewport={"width": 1280, "height": 900})
        page = await context.new_page()
        page.set_default_timeout(WAIT_MS)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        yield page
        await context.close()
        assert errors == [], f"JavaScript errors on the page: {errors}"


async def turn_rows(page: Page) -> list[str]:
    rows = await page.eval_on_selector_all("#turns li", "lis => lis.map(li => li.dataset.runId)")
    return [str(run_id) for run_id in rows]


async def wait_run_other_than(page: Page, seen: list[str]) -> str:
    """The next demo run the run panel opens (one not in `seen`), once it streams."""
    handle = await page.wait_for_function(
        """seen => {
            const id = document.querySelector('#run-id').textContent;
            const streaming = document.querySelector('#run-status').dataset.status === 'running'
                && document.querySelector('#answer .token') !== null;
            return id.startsWith('demo-') && !seen.includes(id) && streaming ? id : null;
        }""",
        arg=seen,
    )
    return str(await handle.json_value())


async def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"console-{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000


def request_lines(log: str, route: str) -> int:
    return len(re.findall(rf"gateway\.http\.requests: GET {re.escape(route)} ", log))


async def test_the_console_follows_the_demo_session_and_lists_each_turn_once(
    demo_server: Server,
) -> None:
    async with new_page() as page:
        await page.goto(f"{demo_server.base}/?session=demo")
        await page.wait_for_selector('#run[data-session="demo"]', state="attached")
        runs = [await wait_run_other_than(page, [])]
        # The fields name the session the page follows, not the demo form's default.
        assert await page.input_value("#session-input") == "demo"
        assert await page.text_content("#run-session") == "demo"
        assert await page.text_content("#turns-session") == "demo"
        await shot(page, "first-turn")

        # Two more turns open by themselves: two whole turns went by.
        runs.append(await wait_run_other_than(page, runs))
        runs.append(await wait_run_other_than(page, runs))
        await page.wait_for_selector(
            f'#turns li[data-run-id="{runs[-1]}"][data-state="running"]', state="attached"
        )
        rows = await turn_rows(page)
        assert len(rows) == len(set(rows)), f"a turn listed twice: {rows}"
        # The next turns came from the session feed, not from polling the turns list:
        # the page read it twice at load (the panel, the running turn), never since.
        assert request_lines(demo_server.log(), "/v1/sessions/{session_id}/turns") <= 2
        async with httpx.AsyncClient(base_url=demo_server.base, timeout=10) as client:
            reply = await client.get("/v1/sessions/demo/turns")
        assert rows == [turn["run_id"] for turn in reply.json()["turns"]]
        assert rows[-3:] == runs
        followed = await page.eval_on_selector_all(
            "#turns li.followed", "lis => lis.map(li => li.dataset.runId)"
        )
        assert followed == [runs[-1]]
        assert await page.input_value("#session-input") == "demo"

        # A reload mid-turn resumes the run and the session, the panel loaded again.
        await page.reload()
        await page.wait_for_selector('#turns[data-feed="live"]', state="attached")
        assert await page.input_value("#session-input") == "demo"
        assert await page.text_content("#turns-session") == "demo"
        runs.append(await wait_run_other_than(page, runs))
        await page.wait_for_selector(f'#turns li[data-run-id="{runs[-1]}"]', state="attached")
        rows = await turn_rows(page)
        assert len(rows) == len(set(rows)) and rows[-4:] == runs
        await shot(page, "after-reload")


async def test_the_turns_panel_keeps_the_newest_turns_each_once() -> None:
    with serve(make_settings("memory", None, "console-turns:")) as srv:
        async with (
            httpx.AsyncClient(base_url=srv.base_url, timeout=10) as client,
            new_page() as page,
        ):

            async def turn() -> str:
                producer = await ProducerClient.claim(client, session_id="busy")
                await producer.publish(("token", {"text": "the same answer"}))
                await producer.end()
                return producer.run_id

            runs = [await turn() for _ in range(MAX_TURN_ROWS + 3)]
            await page.goto(f"{srv.base_url}/?session=busy")
            await page.wait_for_selector('#turns[data-feed="live"]', state="attached")
            await page.wait_for_function(
                "n => document.querySelectorAll('#turns li').length === n", arg=MAX_TURN_ROWS
            )
            assert await turn_rows(page) == runs[-MAX_TURN_ROWS:]
            for _ in range(2):  # live turns from the feed: still the newest, each once
                runs.append(await turn())
                await page.wait_for_selector(
                    f'#turns li[data-run-id="{runs[-1]}"][data-state="success"]', state="attached"
                )
                assert await turn_rows(page) == runs[-MAX_TURN_ROWS:]
            # Rows of the same text are told apart by their start time.
            times = await page.eval_on_selector_all(
                "#turns li time", "ts => ts.map(t => t.dateTime)"
            )
            assert len(times) == MAX_TURN_ROWS and all(times)
            assert await page.input_value("#session-input") == "busy"
