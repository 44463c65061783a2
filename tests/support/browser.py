"""Debian's Chromium, headless, driven by Playwright: the browser of the browser tests."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from playwright.async_api import Browser, async_playwright

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def skip_without_chromium() -> None:
    """Skip the calling test module when Chromium is not installed."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(
            f"{CHROMIUM} is not installed (scripts/bootstrap installs Debian's chromium with apt)",
            allow_module_level=True,
        )


@asynccontextmanager
async def chromium(*extra_args: str) -> AsyncIterator[Browser]:
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=CHROMIUM,
            args=[*CHROMIUM_ARGS, *extra_args],
            headless=True,
            timeout=30_000,
        )
        try:
            yield browser
        finally:
            await browser.close()
