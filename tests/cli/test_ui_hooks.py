"""The Webhooks page of `flowtide ui` in a real Chromium: a hook with the URL to POST to,
a signed delivery's run as a square, and a refused delivery with why."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from browser import SEEN_MS, chromium, needs_chromium, shot
from flowtide.triggers.hooks import sign

from .helpers import Flowtide, LocalUi, local_ui, wait_until

SECRET = "ui-hook-secret-5b4a3c2d"
TICK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: tick, path: tests/ui/hooked}
workflow:
  - step: start
    tool: {kind: noop}
"""


@pytest.fixture
def hooked_ui(ft: Flowtide, tmp_path: Path) -> Iterator[LocalUi]:
    (tmp_path / "tick.yaml").write_text(TICK)
    ft.ok("catalog", "register", tmp_path / "tick.yaml")
    secret = tmp_path / "hook.secret"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    ft.ok("hook", "add", "deploy", "tests/ui/hooked", "--secret-file", secret)
    with local_ui(ft, tmp_path / "ui.out") as ui:
        yield ui


@needs_chromium
def test_the_webhooks_page(hooked_ui: LocalUi) -> None:
    ui = hooked_ui
    body = b'{"ref": "main"}'
    url = f"{ui.base}/api/hooks/deploy"
    good = httpx.post(
        url, content=body, headers={"x-flowtide-signature": sign(SECRET.encode(), body)}
    )
    assert good.status_code == 202, good.text
    bad = httpx.post(url, content=body, headers={"x-flowtide-signature": "sha256=" + "0" * 64})
    assert bad.status_code == 401
    wait_until(
        lambda: ui.get("/api/hooks/deploy")["deliveries"][0]["execution_status"] == "completed",
        timeout=20,
        what="the delivery's run",
    )
    with chromium() as browser:
        page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
        page.set_default_timeout(SEEN_MS)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        ui.sign_in(page)
        page.get_by_test_id("nav-hooks").click()
        hook = page.locator('[data-testid="hook"][data-name="deploy"]')
        hook.locator('[data-testid="square"][data-status="completed"]').wait_for()
        assert "/api/hooks/deploy" in hook.inner_text()
        assert SECRET not in page.content()
        refused = hook.get_by_test_id("refused-row")
        refused.first.wait_for()
        assert "401" in refused.first.inner_text()
        shot(page, "local-hooks")
        assert errors == []
