"""The Schedules pages of `flowtide ui` in a real Chromium: a schedule firing every second
while the UI runs shows its next fire times and its runs as squares; its page pauses,
resumes, runs it now and backfills; the executions list says which schedule started a
run and filters by it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from browser import SEEN_MS, chromium, needs_chromium, shot

from .helpers import Flowtide, LocalUi, local_ui, wait_until

TICK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: tick, path: tests/ui/tick}
workflow:
  - step: start
    tool: {kind: noop}
"""


@pytest.fixture
def scheduled_ui(ft: Flowtide, tmp_path: Path) -> Iterator[LocalUi]:
    (tmp_path / "tick.yaml").write_text(TICK)
    ft.ok("catalog", "register", tmp_path / "tick.yaml")
    ft.ok(
        "schedule",
        "add",
        "every-second",
        "tests/ui/tick",
        "--every",
        "1s",
        "--description",
        "ticks",
    )
    ft.ok(
        "schedule",
        "add",
        "nightly",
        "tests/ui/tick",
        "--cron",
        "0 2 * * *",
        "--timezone",
        "Europe/Berlin",
        "--overlap",
        "allow",
    )
    with local_ui(ft, tmp_path / "ui.out") as ui:
        yield ui


@needs_chromium
def test_the_schedules_pages(scheduled_ui: LocalUi) -> None:
    ui = scheduled_ui
    wait_until(
        lambda: (
            len(ui.get("/api/executions", params={"trigger": "schedule:every-second"})["items"])
            >= 2
        ),
        timeout=20,
        what="two scheduled runs",
    )
    with chromium() as browser:
        page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
        page.set_default_timeout(SEEN_MS)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        ui.sign_in(page)
        page.get_by_test_id("nav-schedules").click()
        row = page.locator('[data-testid="schedule-row"][data-name="every-second"]')
        row.wait_for()
        row.locator('[data-testid="square"][data-status="completed"]').first.wait_for()
        nightly = page.locator('[data-testid="schedule-row"][data-name="nightly"]')
        # In the schedule's zone (02:00 Berlin) and the viewer's (UTC here).
        shown = nightly.get_by_test_id("schedule-next").inner_text()
        assert "02:00:00" in shown and "01:00:00" in shown and "here" in shown, shown
        shot(page, "local-schedules")

        nightly.get_by_role("link", name="nightly").click()
        page.wait_for_url(re.compile(r"/ui/schedules/nightly$"))
        page.get_by_test_id("next-times").locator("li").nth(4).wait_for()
        assert page.get_by_test_id("next-times").locator("li").count() == 5
        page.get_by_test_id("pause").click()
        page.get_by_test_id("resume").wait_for()
        assert ui.get("/api/schedules/nightly")["paused"] is True
        page.get_by_test_id("resume").click()
        page.get_by_test_id("pause").wait_for()
        page.get_by_test_id("trigger").click()
        page.locator('[data-testid="firing-row"][data-status="started"]').first.wait_for()
        page.get_by_test_id("backfill-from").fill("2026-01-01T00:00")
        page.get_by_test_id("backfill-to").fill("2026-01-03T23:59")
        page.get_by_test_id("backfill-go").click()
        page.get_by_test_id("message").get_by_text(re.compile(r"Backfill: 3 started")).wait_for()
        shot(page, "local-schedule")

        page.goto(f"{ui.url.removesuffix('/ui')}/ui/executions?trigger=schedule")
        page.get_by_test_id("trigger-badge").first.wait_for()
        assert page.get_by_test_id("trigger-select").input_value() == "schedule"
        badges = page.get_by_test_id("trigger-badge").all_inner_texts()
        assert badges and all("schedule" in b for b in badges)
        shot(page, "local-executions-by-schedule")
        assert errors == []
