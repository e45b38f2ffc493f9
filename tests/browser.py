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
        except Exception as failure:
            _describe_pages(browser, failure)
            raise
        finally:
            browser.close()


def _describe_pages(browser: Any, failure: Exception) -> None:
    """Add what each open page showed to a failing test's error (CI keeps no screenshots)."""
    for context in browser.contexts:
        for page in context.pages:
            try:
                text = page.inner_text("body", timeout=2_000)
            except Exception as err:  # the page itself may be what failed
                text = f"(its text could not be read: {err})"
            failure.add_note(f"page {page.url} showed:\n{text[:3000]}")


def shot(page: Any, name: str) -> None:
    """Save a screenshot of the whole page as build/screenshots/NAME.png."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True, animations="disabled")
