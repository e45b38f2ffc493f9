"""Debian's Chromium driven by Playwright for Python, for the web UI's browser tests
(tests/distributed/test_ui_browser.py, tests/cli/test_ui.py). Playwright's own browser
download is never used: CI reaches only the package registries."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
#: Where the tests save a screenshot of each page they check.
SHOTS = Path(__file__).resolve().parents[1] / "build" / "screenshots"
#: How long a page may take to show what the server has (its polls are 1-2 s apart).
SEEN_MS = 15_000

needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="Debian's chromium is not installed (make test installs it: scripts/ensure-chromium.sh)",
)


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium, without the background traffic this network refuses."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        try:
            yield browser
        finally:
            browser.close()


def shot(page: Any, name: str) -> None:
    """Save a screenshot of the whole page as build/screenshots/NAME.png."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True, animations="disabled")
