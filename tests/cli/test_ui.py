"""`flowtide ui`: the web UI over the local store, as a user runs it: `flowtide run` makes
executions, `flowtide ui` prints a URL, the browser opens it. Its API answers only its
token and only its own Host; the page signs in with the URL's fragment."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from browser import SEEN_MS, chromium, needs_chromium, shot

from .helpers import Flowtide, LocalUi, local_ui

FLOW = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: ui_local, path: tests/ui/local}
workload: {fail: false}
workflow:
  - step: start
    tool: {kind: python, code: "result = {'numbers': list(range(5))}"}
    next:
      arcs:
        - {step: broken, when: "{{ fail }}"}
        - {step: each}
  - step: each
    loop: {in: "{{ start.numbers }}", iterator: item, spec: {mode: parallel}}
    tool: {kind: python, input: {i: "{{ item }}"}, code: "result = {'i': i}"}
    next: [end]
  - step: broken
    tool: {kind: python, code: "raise ValueError('no such sensor')"}
  - step: end
    tool: {kind: noop}
"""


@pytest.fixture
def two_runs(ft: Flowtide, tmp_path: Path) -> Iterator[tuple[LocalUi, dict[str, str]]]:
    """Two runs (one completed, one failed) and `flowtide ui` over them."""
    playbook = tmp_path / "flow.yaml"
    playbook.write_text(FLOW)
    ids = {}
    for name, workload in (("done", "{}"), ("failed", '{"fail": true}')):
        run = ft("run", playbook, "--payload", workload, "--json")
        assert run.returncode in (0, 1), run.stderr
        ids[name] = str(json.loads(run.stdout)["execution_id"])
    with local_ui(ft, tmp_path / "ui.out") as ui:
        assert "2 executions in" in (tmp_path / "ui.out").read_text()
        yield ui, ids


def test_the_local_api_answers_its_token_and_its_host_only(
    two_runs: tuple[LocalUi, dict[str, str]], ft: Flowtide
) -> None:
    ui, ids = two_runs
    assert httpx.get(f"{ui.base}/api/executions", timeout=30).status_code == 401
    bad = {"authorization": "Bearer " + "x" * len(ui.token)}
    assert httpx.get(f"{ui.base}/api/executions", headers=bad, timeout=30).status_code == 401
    api = ui.api
    items = api.get("/api/executions").json()["items"]
    assert {i["execution_id"]: i["status"] for i in items} == {
        ids["done"]: "completed",
        ids["failed"]: "failed",
    }
    summary = api.get(f"/api/executions/{ids['done']}/summary").json()
    assert summary["progress"]["iterations_done"] == 5
    assert summary["steps"]["broken"]["status"] == "pending"
    assert summary["graph"]["nodes"][0]["name"] == "start"
    failed = api.get(f"/api/executions/{ids['failed']}/summary").json()
    assert "no such sensor" in failed["steps"]["broken"]["error"]["message"]
    timeline = api.get(f"/api/executions/{ids['failed']}/timeline").json()
    broken = next(s for s in timeline["steps"] if s["step"] == "broken")
    assert [c["status"] for c in broken["commands"]] == ["failed"]
    events = api.get(f"/api/executions/{ids['done']}/events", params={"limit": 3}).json()
    assert [e["type"] for e in events][0] == "playbook.initialized" and len(events) == 3
    # `flowtide run` kept each run's summary as it ended; the page reads it as it would
    # the one folded from the log.
    with sqlite3.connect(ft.home / "flowtide.db") as db:
        kept = {str(r[0]) for r in db.execute("SELECT execution_id FROM execution_summary")}
        assert kept == set(ids.values())
        db.execute("DELETE FROM execution_summary")
    assert api.get(f"/api/executions/{ids['done']}/summary").json() == summary
    refused = api.post(f"/api/executions/{ids['done']}/cancel", json={})
    assert refused.status_code == 409 and "already completed" in refused.text
    # A page of another site rebinding its name to loopback sends its own Host.
    rebound = api.get("/api/executions", headers={"host": "attacker.example"})
    assert rebound.status_code == 403
    page = httpx.get(ui.url, timeout=30)
    assert (
        page.status_code == 200 and "script-src 'self'" in page.headers["content-security-policy"]
    )


@needs_chromium
def test_the_printed_url_opens_the_runs_in_a_browser(
    two_runs: tuple[LocalUi, dict[str, str]],
) -> None:
    ui, ids = two_runs
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        page = context.new_page()
        page.set_default_timeout(SEEN_MS)
        ui.sign_in(page)
        page.locator(f'[data-testid="exec-row"][data-id="{ids["failed"]}"]').wait_for()
        # Signed in by the fragment, which is gone from the address bar.
        assert "token" not in page.url
        assert page.get_by_test_id("exec-row").count() == 2
        shot(page, "local-executions")
        page.locator(f'[data-testid="exec-row"][data-id="{ids["failed"]}"] a').first.click()
        node = page.locator('[data-testid="graph-node"][data-step="broken"]')
        node.and_(page.locator('[data-status="failed"]')).wait_for()
        node.click()
        assert "no such sensor" in page.get_by_test_id("step-error").inner_text()
        shot(page, "local-execution-failed")
        page.goto(f"{ui.url}/executions/{ids['done']}")
        page.locator('[data-testid="detail-status"][data-status="completed"]').wait_for()
        bar = page.get_by_test_id("progress-bar")
        assert (bar.get_attribute("data-done"), bar.get_attribute("data-total")) == ("5", "5")
        shot(page, "local-execution-graph")
        # No workers here: embedded runs use threads.
        page.goto(f"{ui.url}/workers")
        page.get_by_test_id("workers-none").wait_for()
        context.close()
