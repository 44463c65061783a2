"""The console page (`/`) and `/static/gateway-client.js` in real headless Chromium.

Debian's chromium (`/usr/bin/chromium`, installed by scripts/bootstrap) is driven by the
PyPI `playwright` package with `executable_path`; playwright's own browser download is
never used. The tests skip only when that binary is missing.

Each test runs a real uvicorn server on the memory bridge (tests/support/http_server.py) and
drives the producer itself over the HTTP API, so it controls the pacing: publish, wait
until the page shows it (playwright waits on DOM conditions, never sleeps), publish more.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from playwright.async_api import Page

from tests.support.browser import ARTIFACTS, chromium, skip_without_chromium
from tests.support.http_server import ProducerClient, RunningServer, make_settings, serve

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

WAIT_MS = 10_000
WORDS = [f"w{i} " for i in range(40)]

skip_without_chromium()


@asynccontextmanager
async def console(**settings: Any) -> AsyncIterator[tuple[RunningServer, httpx.AsyncClient, Page]]:
    """A gateway (memory bridge), an HTTP client for the producer side, a fresh page."""
    with serve(make_settings("memory", None, "console:", **settings)) as srv:
        async with (
            httpx.AsyncClient(base_url=srv.base_url, timeout=10) as client,
            chromium() as browser,
        ):
            context = await browser.new_context(viewport={"width": 1280, "height": 900})
            page = await context.new_page()
            page.set_default_timeout(WAIT_MS)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            yield srv, client, page
            await context.close()
            assert errors == [], f"JavaScript errors on the page: {errors}"


async def rendered_tokens(page: Page) -> list[tuple[str, str]]:
    rows = await page.eval_on_selector_all(
        "#answer .token", "els => els.map(e => [e.dataset.id, e.textContent])"
    )
    return [(str(i), str(t)) for i, t in rows]


async def wait_token(page: Page, event_id: str) -> None:
    await page.wait_for_selector(f'#answer .token[data-id="{event_id}"]', state="attached")


async def wait_status(page: Page, status: str) -> None:
    await page.wait_for_selector(f'#run-status[data-status="{status}"]', state="attached")


async def publish_words(producer: ProducerClient, words: list[str]) -> list[tuple[str, str]]:
    out = []
    for word in words:
        (event_id,) = await producer.publish(("token", {"text": word}))
        out.append((event_id, word))
    return out


async def test_tokens_appear_incrementally_with_their_ids() -> None:
    async with console() as (srv, client, page):
        producer = await ProducerClient.claim(client, session_id="incremental")
        await page.goto(f"{srv.base_url}/?run={producer.run_id}")
        published: list[tuple[str, str]] = []
        for index, word in enumerate(WORDS[:6]):
            published += await publish_words(producer, [word])
            await wait_token(page, published[-1][0])
            # Each token is on screen while the run is still running (nothing buffered
            # until the END): the page and the gateway both say so.
            assert await page.text_content("#run-status") == "running"
            run = (await client.get(f"/v1/runs/{producer.run_id}")).json()
            assert run["status"] == "running"
            assert await rendered_tokens(page) == published
            assert await page.text_content("#cursor") == published[-1][0]
            if index == 0:
                assert await page.locator("#events tbody tr").count() == 1
        await producer.end()
        await wait_status(page, "success")
        assert await rendered_tokens(page) == published
        rows = await page.eval_on_selector_all(
            "#events tbody tr", "trs => trs.map(tr => tr.cells[0].textContent)"
        )
        assert rows == [event_id for event_id, _ in published] + [""]  # END carries no id


async def test_reload_mid_stream_resumes_exactly() -> None:
    async with console() as (srv, client, page):
        producer = await ProducerClient.claim(client, session_id="reload")
        await page.goto(f"{srv.base_url}/?run={producer.run_id}")
        published = await publish_words(producer, WORDS[:3])
        await wait_token(page, published[-1][0])
        # One more in flight while the page reloads: either the old page rendered it
        # (and stored it with its cursor) or the new one gets it from the cursor.
        published += await publish_words(producer, WORDS[3:4])
        await page.reload()
        published += await publish_words(producer, WORDS[4:6])
        resumed_from = await page.wait_for_function(
            "() => document.querySelector('#connection').dataset.resumedFrom"
        )
        assert await resumed_from.json_value() in {published[2][0], published[3][0]}
        await wait_token(page, published[-1][0])

        # A second reload, this time between tokens, then the rest of the run.
        await page.reload()
        published += await publish_words(producer, WORDS[6:10])
        await wait_token(page, published[-1][0])
        await producer.end()
        await wait_status(page, "success")
        assert await rendered_tokens(page) == published
        assert await page.text_content("#answer") == "".join(WORDS[:10])
        # A reload after the END shows the finished run from storage, without a stream.
        await page.reload()
        await wait_status(page, "success")
        assert await rendered_tokens(page) == published
        await anyio.to_thread.run_sync(srv.wait_open_sse, 0)


async def test_gap_is_recovered_from_durable_state() -> None:
    # Only 4 events per run are retained: the page's cursor falls out of retention
    # while it is away.
    async with console(max_events_per_run=4) as (srv, client, page):
        producer = await ProducerClient.claim(client, session_id="gappy")
        url = f"{srv.base_url}/?run={producer.run_id}"
        await page.goto(url)
        seen = await publish_words(producer, WORDS[:2])
        await wait_token(page, seen[-1][0])

        await page.goto("about:blank")
        await anyio.to_thread.run_sync(srv.wait_open_sse, 0)
        missed = await publish_words(producer, WORDS[2:10])  # retained: the last 4

        await page.goto(url)  # rejoins after seen[-1], which is trimmed -> gap
        notice = page.locator('#gap-notice[data-recovered="true"]')
        await notice.wait_for(state="visible")
        assert await notice.get_attribute("data-reason") == "trimmed"
        notice_text = await notice.text_content() or ""
        assert "run running" in notice_text and "turn running" in notice_text
        assert missed[-1][0] in notice_text  # rejoined at latest_available_event_id
        # The session's turn record restored the whole answer so far.
        recovered = page.locator("#answer .recovered")
        assert await recovered.text_content() == "".join(WORDS[:10])
        assert await recovered.get_attribute("data-id") == missed[-1][0]
        await page.wait_for_selector('#connection[data-state="live"]', state="attached")

        after = await publish_words(producer, WORDS[10:13])
        await wait_token(page, after[-1][0])
        await producer.end()
        await wait_status(page, "success")
        assert await rendered_tokens(page) == after
        assert await page.text_content("#answer") == "".join(WORDS[:13])
        # The turns panel was refreshed from the same reload.
        assert await page.text_content("#turns-session") == "gappy"


async def test_sessions_listed_on_a_fresh_profile() -> None:
    async with console() as (srv, client, page):
        turns = [("alpha", WORDS[:3]), ("beta", WORDS[3:5]), ("alpha", WORDS[5:6])]
        for session_id, words in turns:
            producer = await ProducerClient.claim(client, session_id=session_id)
            await publish_words(producer, words)
            await producer.end()
        await page.goto(f"{srv.base_url}/")
        assert await page.evaluate("localStorage.length") == 0  # nothing stored: fresh
        await page.wait_for_selector('#sessions[data-loaded="true"]', state="attached")
        ids = await page.eval_on_selector_all(
            "#sessions li", "lis => lis.map(li => li.dataset.sessionId)"
        )
        assert ids == ["alpha", "beta"]  # newest activity first
        assert "2 turns" in (await page.text_content('#sessions li[data-session-id="alpha"]') or "")
        await page.click('#sessions li[data-session-id="alpha"]')
        await page.wait_for_function("document.querySelectorAll('#turns li').length === 2")
        texts = await page.eval_on_selector_all(
            "#turns li .text", "els => els.map(e => e.textContent)"
        )
        assert sorted(texts) == sorted(["".join(WORDS[:3]), "".join(WORDS[5:6])])
        assert await page.text_content("#run-id") == "\u2013"  # no run followed yet


async def test_demo_turn_from_the_page_survives_reload_and_screenshot() -> None:
    """The page's own demo producer: start, reload mid-stream, finish; save a screenshot."""
    async with console() as (srv, client, page):
        await page.goto(f"{srv.base_url}/?demo_delay=30")
        await page.click("#start-demo")
        await page.wait_for_function("document.querySelectorAll('#answer .token').length >= 5")
        await page.reload()  # the viewer and the page-hosted producer both resume
        await wait_status(page, "success")
        demo_text = await page.evaluate(
            "() => 'Hello! This answer is streamed token by token through the gateway. '"
        )
        answer = await page.text_content("#answer") or ""
        assert answer.startswith(demo_text)
        assert answer.endswith("without losing or repeating a word.")
        tokens = await rendered_tokens(page)
        assert len({event_id for event_id, _ in tokens}) == len(tokens)  # nothing twice
        run_id = await page.text_content("#run-id")
        turns = (await client.get("/v1/sessions/console/turns")).json()["turns"]
        (turn,) = [t for t in turns if t["run_id"] == run_id]
        assert turn["state"] == "success" and turn["text"] == answer  # no repeated word
        await page.wait_for_selector('#sessions li[data-session-id="console"]', state="attached")
        ARTIFACTS.mkdir(exist_ok=True)
        await page.screenshot(path=str(ARTIFACTS / "console.png"), full_page=True)
        assert (ARTIFACTS / "console.png").stat().st_size > 10_000


async def test_the_console_opens_on_the_demo_session_with_its_turn_streaming() -> None:
    """A newcomer's first minute: the demo streams, the page at `/` shows it, nothing to
    copy from a log line; the session's next turn opens by itself."""
    from gateway.client.demo import DEMO_SESSION, run_demo

    async with console() as (srv, client, page), anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_demo(srv.base_url, token_delay=0.03, pause=0.3, max_runs=3))
        await page.goto(f"{srv.base_url}/")
        await page.wait_for_selector(f'#run[data-session="{DEMO_SESSION}"]', state="attached")
        await page.wait_for_selector("#answer .token", state="attached")
        first_run = await page.text_content("#run-id")
        assert first_run is not None and first_run.startswith("demo-")
        run = (await client.get(f"/v1/runs/{first_run}")).json()
        assert run["session_id"] == DEMO_SESSION
        # Streaming: tokens keep arriving while the run is running.
        count = len(await rendered_tokens(page))
        await page.wait_for_function(
            f"document.querySelectorAll('#answer .token').length > {count}", timeout=WAIT_MS
        )
        assert "session=demo" in page.url
        # The next turn of the session opens here when it starts.
        await page.wait_for_function(
            f"document.querySelector('#run-id').textContent !== {first_run!r}"
            " && document.querySelector('#run-id').textContent.startsWith('demo-')",
            timeout=WAIT_MS,
        )
        await wait_status(page, "running")
        tg.cancel_scope.cancel()


async def test_selected_session_follows_every_turn_on_one_stream() -> None:
    """Selecting a session follows it live through the session feed: new turns appear
    and stream in the turns panel, with one SSE response open for all of them (beside
    the run panel's stream of the turn it follows)."""
    async with console() as (srv, client, page):
        first = await ProducerClient.claim(client, session_id="chat")
        await publish_words(first, WORDS[:2])
        await first.end()
        await page.goto(f"{srv.base_url}/")
        await page.wait_for_selector('#sessions li[data-session-id="chat"]', state="attached")
        await page.click('#sessions li[data-session-id="chat"]')
        await page.wait_for_selector('#turns[data-feed="live"]', state="attached")
        await page.wait_for_function("document.querySelectorAll('#turns li').length === 1")
        for words in (WORDS[2:5], WORDS[5:7]):
            producer = await ProducerClient.claim(client, session_id="chat")
            row = f'#turns li[data-run-id="{producer.run_id}"]'
            await page.wait_for_selector(f'{row}[data-state="running"]', state="attached")
            for index in range(len(words)):
                await publish_words(producer, words[index : index + 1])
                expected = "".join(words[: index + 1])
                await page.wait_for_function(
                    "([sel, text]) => document.querySelector(sel + ' .text').textContent === text",
                    arg=[row, expected],
                )
            # One response follows the whole session in the turns panel: no stream per
            # run there. The page opened on this session (the newest), so its run panel
            # follows the running turn too, which the feed opened at once.
            await page.wait_for_selector(f'#run:has(#run-id:text-is("{producer.run_id}"))')
            await page.wait_for_selector('#connection[data-state="live"]', state="attached")
            assert await anyio.to_thread.run_sync(srv.open_sse) == 2
            await producer.end()
            await page.wait_for_selector(f'{row}[data-state="success"]', state="attached")
        assert await page.locator("#turns li").count() == 3
        await client.delete("/v1/sessions/chat")
        await page.wait_for_selector('#turns[data-feed="retired"]', state="attached")
        await anyio.to_thread.run_sync(srv.wait_open_sse, 0)
