"""The Notifications panel of an execution's page in `flowtide ui`, in a real Chromium: a
failed run notifies a webhook (down once, then sent) and a Slack webhook that refuses it
for good; the page open while they are owed shows them retried, then sent and failed,
with attempts and errors, and never the query token or the Slack path."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from browser import SEEN_MS, chromium, needs_chromium, shot

from .helpers import Flowtide, LocalUi, local_ui, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stubs"))

from notify_target import Target, notify_target  # noqa: E402

QUERY_TOKEN = "query-tok-5f1e2d"
SLACK_TOKEN = "Zq9SlackT0kenAbCdEfGhIj"
PLAYBOOK = """\
metadata: {{name: notified, path: tests/ui/notified}}
notify:
  - on: [failed, completed]
    webhook: {{url: "{ops}/hook?token={token}"}}
  - on: [failed]
    slack: {{url: "{gone}/services/T0AB/B0CD/{slack}"}}
workflow:
  - step: start
    tool: {{kind: python, code: "raise ValueError('boom')"}}
"""


class NotifyingFlowtide(Flowtide):
    """The CLI with notifications allowed to loopback targets, retried after 1 s."""

    @property
    def env(self) -> dict[str, str]:
        return {
            **super().env,
            "FLOWTIDE_NOTIFY_ALLOW_HOSTS": "127.0.0.1",
            "FLOWTIDE_NOTIFY_BACKOFF": "1",
        }


@pytest.fixture
def notifying_ui(ft: Flowtide, tmp_path: Path) -> Iterator[tuple[LocalUi, Target, Target]]:
    with (
        notify_target() as ops,
        notify_target() as gone,
        local_ui(NotifyingFlowtide(ft.home, ft.cwd), tmp_path / "ui.out") as ui,
    ):
        yield ui, ops, gone


@needs_chromium
def test_an_executions_notifications(notifying_ui: tuple[LocalUi, Target, Target]) -> None:
    ui, ops, gone = notifying_ui
    ops.script = [503, 503]  # down twice: retried 1 s, then 2 s later
    gone.script = [404]  # a 404 is final
    execution_id = ui.start(
        PLAYBOOK.format(ops=ops.url, gone=gone.url, token=QUERY_TOKEN, slack=SLACK_TOKEN)
    )
    with chromium() as browser:
        page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
        page.set_default_timeout(SEEN_MS)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        ui.sign_in(page)
        page.goto(f"{ui.url}/executions/{execution_id}")
        page.get_by_test_id("detail-status").get_by_text("failed").wait_for()
        panel = page.get_by_test_id("notifications")
        hook = panel.locator('[data-testid="notification-row"][data-target="webhook"]')
        slack = panel.locator('[data-testid="notification-row"][data-target="slack"]')
        # The page, open before the deliveries end, reads them until none is owed.
        hook.and_(page.locator('[data-status="retrying"]')).wait_for()
        shot(page, "local-notifications-retrying")
        hook.and_(page.locator('[data-status="sent"]')).wait_for()
        assert slack.get_attribute("data-status") == "failed"
        assert hook.get_attribute("data-on") == "failed"
        cells = hook.locator("td").all_inner_texts()
        assert cells[3] == f"{ops.url}/hook" and cells[5] == "3", cells
        assert "HTTP 200" in cells[6]
        shown = slack.locator("td").all_inner_texts()
        assert shown[3] == f"{gone.url}/services/…" and shown[5] == "1", shown
        assert "HTTP 404" in shown[6]
        page.get_by_test_id("notifications-owed").wait_for(state="detached")
        assert re.search(r"Notifications \(2\)", panel.inner_text(), re.I)
        html = page.content()
        assert QUERY_TOKEN not in html and SLACK_TOKEN not in html
        shot(page, "local-notifications")
        page.set_viewport_size({"width": 720, "height": 900})
        assert page.evaluate("document.documentElement.scrollWidth <= innerWidth")
        shot(page, "local-notifications-narrow")
        assert errors == []
    wait_until(lambda: len(ops.posts) == 3, timeout=5, what="three posts")
    assert all(QUERY_TOKEN in path for path, _h, _b in ops.posts)

    # A run without notify: no panel.
    quiet = ui.start("workflow:\n  - step: start\n    tool: {kind: noop}\n")
    wait_until(lambda: ui.status(quiet) == "completed", timeout=20, what="the quiet run")
    summary = ui.get(f"/api/executions/{quiet}/summary")
    assert summary["notifications"] == [] and summary["notifications_owed"] == 0
    with chromium() as browser:
        page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
        page.set_default_timeout(SEEN_MS)
        ui.sign_in(page)
        page.goto(f"{ui.url}/executions/{quiet}")
        page.get_by_test_id("detail-status").get_by_text("completed").wait_for()
        assert page.get_by_test_id("notifications").is_hidden()
