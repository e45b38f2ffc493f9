"""Pages that show one state, in a browser: a cancelled execution is cancelled in its
badge, its banner, its graph and its timeline (never failed, never running); a run whose
process was killed is `interrupted` (its clock stopped, Resume offered) and, resumed from
its page, ends completed with a note that follows it; a step whose task was retried
says how many attempts and retries it took, and the timeline draws each try.

Screenshots: build/screenshots/states-*.png."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from browser import SEEN_MS, chromium, needs_chromium, shot

from .helpers import PLAYBOOKS, Flowtide, LocalUi, local_ui, wait_until

pytestmark = needs_chromium

SLOW = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: slow, path: tests/ui/slow}
workload: {n: 400, pause: 0.05}
workflow:
  - step: start
    tool: {kind: python, code: "result = {'numbers': list(range(n))}", input: {n: "{{ n }}"}}
    next: [each]
  - step: each
    loop: {in: "{{ start.numbers }}", iterator: item, spec: {mode: sequential}}
    tool:
      kind: python
      input: {i: "{{ item }}", pause: "{{ pause }}"}
      code: |
        import time
        time.sleep(pause)
        result = {"i": i}
    next: [end]
  - step: end
    tool: {kind: noop}
"""

#: Fails twice, then succeeds: three attempts, two retries, 0.3 s of backoff each.
FLAKY = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: flaky, path: tests/ui/flaky}
workload: {marks: /dev/null}
workflow:
  - step: flaky
    tool:
      - name: call
        kind: python
        input: {marks: "{{ marks }}"}
        code: |
          with open(marks, "a+", encoding="utf-8") as f:
              f.seek(0)
              tries = len(f.read().split())
              f.write("x\\n")
          if tries < 2:
              raise RuntimeError(f"try {tries + 1} fails")
          result = {"tries": tries + 1}
        spec:
          policy:
            rules:
              - when: "{{ output.status == 'error' }}"
                then: {do: retry, attempts: 3, delay: 0.3}
"""


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").split()) if path.exists() else 0


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalUi]:
    """A run killed mid-loop (`interrupted`), a retried step, and `flowtide ui` over them
    (the cancelled run is started and cancelled from the UI)."""
    root = tmp_path_factory.mktemp("ui_states")
    (root / "cwd").mkdir()
    ft = Flowtide(root / "home", root / "cwd")
    flaky = root / "flaky.yaml"
    flaky.write_text(FLAKY)
    done = ft.run(flaky, "--set", f"marks={root / 'marks.txt'}")
    assert done["status"] == "completed", done
    out_file = root / "iterations.txt"
    with (root / "run.log").open("wb") as log:
        proc = ft.popen(
            "run", PLAYBOOKS / "slow_sequential.yaml", "--set", f"out_file={out_file}",
            "--set", "count=200", stdout=log, stderr=log,
        )  # fmt: skip
        try:
            wait_until(lambda: _lines(out_file) >= 3, timeout=30, what="3 iterations", proc=proc)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    rows = {r["playbook"]: r["execution_id"] for r in ft.executions()}
    with local_ui(ft, root / "ui.out") as ui:
        ui.ids = {"flaky": rows["tests/ui/flaky"], "killed": rows["tests/cli/slow_sequential"]}
        yield ui


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser: Any, ui: LocalUi) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(SEEN_MS)
    ui.sign_in(page)
    page.get_by_test_id("exec-row").first.wait_for()
    yield page
    context.close()


def _colour(page: Any, testid: str) -> str:
    return str(page.eval_on_selector(f'[data-testid="{testid}"]', "n => getComputedStyle(n).color"))


def _statuses(page: Any, testid: str) -> set[str]:
    return set(
        page.eval_on_selector_all(
            f'[data-testid="{testid}"]', "nodes => nodes.map(n => n.dataset.status)"
        )
    )


def test_a_cancelled_execution_shows_one_state(page: Any, ui: LocalUi) -> None:
    eid = ui.start(SLOW)
    wait_until(
        lambda: ui.get(f"/api/executions/{eid}/summary")["progress"]["iterations_done"] > 2,
        timeout=30,
        what="iterations",
    )
    r = ui.api.post(f"/api/executions/{eid}/cancel", json={"reason": "enough of this"})
    assert r.status_code == 200, r.text
    wait_until(lambda: ui.status(eid) == "cancelled", timeout=30, what="cancelled")
    page.goto(f"{ui.url}/executions/{eid}")
    page.locator('[data-testid="detail-status"][data-status="cancelled"]').wait_for()
    banner = page.get_by_test_id("detail-error")
    banner.wait_for()
    assert banner.get_attribute("data-status") == "cancelled"
    text = banner.inner_text()
    assert text.startswith("Cancelled") and "enough of this" in text
    assert "failed" not in text.lower()
    assert _colour(page, "detail-error") == _colour(page, "detail-status")  # one colour
    # The step it was running was stopped with it: cancelled, not running.
    page.locator('[data-testid="graph-node"][data-step="each"][data-status="cancelled"]').wait_for()
    assert "running" not in _statuses(page, "graph-node")
    assert page.get_by_test_id("cancel-button").is_hidden()
    shot(page, "states-cancelled")
    page.get_by_test_id("tab-timeline").click()
    page.locator('[data-testid="timeline"][data-status="cancelled"]').wait_for()
    runs = page.locator(
        '[data-testid="timeline-lane"][data-step="each"] [data-testid="timeline-run"]'
    )
    assert runs.first.get_attribute("data-status") == "cancelled"
    assert "running" not in _statuses(page, "timeline-run")
    assert "running" not in _statuses(page, "timeline-command")
    # An ended run's log is closed: cancel refuses it and writes nothing.
    every = {"limit": 10_000}
    log = ui.get(f"/api/executions/{eid}/events", params=every)
    again = ui.api.post(f"/api/executions/{eid}/cancel", json={})
    assert again.status_code == 409 and "already cancelled" in again.text
    assert ui.get(f"/api/executions/{eid}/events", params=every) == log


def test_a_killed_run_is_interrupted_until_resumed(page: Any, ui: LocalUi) -> None:
    eid = ui.ids["killed"]
    page.goto(f"{ui.url}/executions?status=interrupted")
    row = page.locator('[data-testid="exec-row"][data-status="interrupted"]')
    row.first.wait_for()
    assert row.count() == 1
    page.goto(f"{ui.url}/executions/{eid}")
    page.locator('[data-testid="detail-status"][data-status="interrupted"]').wait_for()
    banner = page.get_by_test_id("detail-error")
    assert banner.get_attribute("data-status") == "interrupted"
    assert "Interrupted" in banner.inner_text() and "failed" not in banner.inner_text()
    assert _colour(page, "detail-error") == _colour(page, "detail-status")
    page.locator(
        '[data-testid="graph-node"][data-step="work"][data-status="interrupted"]'
    ).wait_for()
    assert "running" not in _statuses(page, "graph-node")
    summary = ui.get(f"/api/executions/{eid}/summary")
    assert summary["status"] == "interrupted" and summary["run_here"] is False
    shot(page, "states-interrupted")
    resume = page.get_by_test_id("resume-button")
    assert resume.is_visible()
    resume.click()
    page.locator('[data-testid="detail-status"][data-status="completed"]').wait_for(timeout=60_000)
    # The note follows the run: it says how it ended, not "running".
    note = page.get_by_test_id("action-message")
    page.wait_for_function(
        "() => document.querySelector('[data-testid=action-message]').textContent"
        ".includes('completed')"
    )
    assert "running" not in note.inner_text()
    assert page.get_by_test_id("detail-error").is_hidden()


def test_retries_are_counted_and_drawn(page: Any, ui: LocalUi) -> None:
    eid = ui.ids["flaky"]
    step = ui.get(f"/api/executions/{eid}/steps/flaky")
    assert (step["runs"], step["attempts"], step["retries"]) == (1, 3, 2)
    page.goto(f"{ui.url}/executions/{eid}?step=flaky")
    attempts = page.get_by_test_id("step-attempts")
    attempts.wait_for()
    assert attempts.inner_text() == "3 attempts, 2 retries"
    timeline = ui.get(f"/api/executions/{eid}/timeline")
    (lane,) = [s for s in timeline["steps"] if s["step"] == "flaky"]
    tries = lane["commands"][0]["tries"]
    assert [t["attempt"] for t in tries] == [1, 2, 3]
    assert [t["status"] for t in tries] == ["failed", "failed", "completed"]
    # The backoff is the gap between one try's end and the next one's start.
    assert all(b["started"] - a["ended"] >= 0.25 for a, b in zip(tries, tries[1:], strict=False))
    page.get_by_test_id("tab-timeline").click()
    drawn = page.locator('[data-testid="timeline-try"]')
    drawn.first.wait_for()
    assert drawn.count() == 3
    assert page.locator('[data-testid="timeline-try"].retry').count() == 2
    shot(page, "states-retries")
    doc = json.loads(json.dumps(ui.get(f"/api/executions/{eid}")))
    assert doc["steps"]["flaky"]["attempts"] == 3 and doc["steps"]["flaky"]["retries"] == 2
