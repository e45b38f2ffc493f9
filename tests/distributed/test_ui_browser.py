"""The web UI in a real browser (Debian's Chromium, driven by Playwright) against a real
`flowtide server` with two workers: sign in, the list and its status tabs, an execution
advancing live to completed on its graph, a failed step in red with its error, a long
run cancelled from the page. Each test saves a screenshot under build/screenshots/."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from browser import SEEN_MS, chromium, needs_chromium, shot

from .stack import Stack
from .test_faults import _wait

pytestmark = needs_chromium

FLOW = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: ui_flow, path: tests/ui/flow}
workload: {pause: 0.0, fail: false, n: 6}
workflow:
  - step: start
    tool: {kind: python, code: "result = {'numbers': list(range(n))}", input: {n: "{{ n }}"}}
    next:
      arcs:
        - {step: broken, when: "{{ fail }}"}
        - {step: each}
  - step: each
    loop: {in: "{{ start.numbers }}", iterator: item, spec: {mode: parallel, max_in_flight: 2}}
    tool:
      kind: python
      input: {i: "{{ item }}", pause: "{{ pause }}"}
      code: |
        import time
        time.sleep(pause)
        result = {"i": i}
    next: [end]
  - step: broken
    tool: {kind: python, code: "raise ValueError('the sensor data is bad')"}
  - step: end
    tool: {kind: python, code: "result = {'done': True}"}
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture
def page_as(browser: Any, stack: Stack) -> Iterator[Any]:
    """Open a page signed in as a role (through the login form)."""
    contexts: list[Any] = []

    def open_as(role: str) -> Any:
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(SEEN_MS)
        page.goto(f"{stack.url}/ui")
        page.get_by_test_id("login-token").fill(stack.tokens[role])
        page.get_by_test_id("login-submit").click()
        page.get_by_test_id("user-name").wait_for()
        return page

    yield open_as
    for context in contexts:
        context.close()


def _start(stack: Stack, **workload: Any) -> str:
    with stack.client(timeout=30) as api:
        r = api.post("/api/execute", json={"playbook": FLOW, "payload": workload})
        assert r.status_code == 201, r.text
        return str(r.json()["execution_id"])


def _node(page: Any, step: str) -> Any:
    return page.locator(f'[data-testid="graph-node"][data-step="{step}"]')


def test_a_bad_token_is_refused_and_the_page_holds_no_data(browser: Any, stack: Stack) -> None:
    context = browser.new_context()
    try:
        page = context.new_page()
        page.set_default_timeout(SEEN_MS)
        page.goto(f"{stack.url}/ui/executions")
        page.get_by_test_id("login-token").fill("ft_not-a-token")
        page.get_by_test_id("login-submit").click()
        page.get_by_test_id("login-error").wait_for()
        assert page.get_by_test_id("exec-row").count() == 0
        # The token is in an HttpOnly cookie only once it verified: none was set.
        assert not [c for c in context.cookies() if c["name"] == "flowtide_session"]
        shot(page, "login")
    finally:
        context.close()


def test_the_list_filters_by_status_and_opens_a_completed_run(page_as: Any, stack: Stack) -> None:
    done = _start(stack)
    failed = _start(stack, fail=True)
    with stack.client(timeout=30) as api:
        _wait(api, done)
        _wait(api, failed)
    page = page_as("reader")
    page.locator(f'[data-testid="exec-row"][data-id="{done}"]').wait_for()
    cookie = [c for c in page.context.cookies() if c["name"] == "flowtide_session"]
    assert cookie and cookie[0]["httpOnly"] and cookie[0]["sameSite"] == "Strict"
    shot(page, "executions")
    page.get_by_test_id("status-tab-failed").click()
    page.locator(f'[data-testid="exec-row"][data-id="{failed}"]').wait_for()
    assert page.locator(f'[data-testid="exec-row"][data-id="{done}"]').count() == 0
    assert "status=failed" in page.url
    page.get_by_test_id("status-tab-all").click()
    page.locator(f'[data-testid="exec-row"][data-id="{done}"] a').first.click()
    page.wait_for_url(re.compile(rf".*/ui/executions/{done}.*"))
    page.locator('[data-testid="detail-status"][data-status="completed"]').wait_for()
    for step in ("start", "each", "end"):
        _node(page, step).and_(page.locator('[data-status="completed"]')).wait_for()
    assert _node(page, "broken").get_attribute("data-status") == "pending"
    taken = page.locator('[data-testid="graph-edge"][data-from="start"][data-to="each"]')
    assert taken.get_attribute("data-taken") == "true"
    untaken = page.locator('[data-testid="graph-edge"][data-from="start"][data-to="broken"]')
    assert untaken.get_attribute("data-taken") == "false"
    bar = page.get_by_test_id("progress-bar")
    assert (bar.get_attribute("data-done"), bar.get_attribute("data-total")) == ("6", "6")
    shot(page, "execution-graph")
    page.get_by_test_id("tab-timeline").click()
    lane = page.locator('[data-testid="timeline-lane"][data-step="each"]')
    lane.wait_for()
    bars = lane.locator('[data-testid="timeline-command"]')
    assert bars.count() == 6
    assert {bars.nth(i).get_attribute("data-status") for i in range(6)} == {"completed"}
    assert "tab=timeline" in page.url
    shot(page, "execution-timeline")
    page.get_by_test_id("tab-events").click()
    page.locator('[data-testid="event-row"][data-type="playbook.completed"]').wait_for()
    shot(page, "execution-events")


def test_a_failed_step_is_red_with_its_error(page_as: Any, stack: Stack) -> None:
    failed = _start(stack, fail=True)
    with stack.client(timeout=30) as api:
        _wait(api, failed)
    page = page_as("reader")
    page.goto(f"{stack.url}/ui/executions/{failed}")
    node = _node(page, "broken")
    node.and_(page.locator('[data-status="failed"]')).wait_for()
    node.click()
    error = page.get_by_test_id("step-error")
    error.wait_for()
    assert "the sensor data is bad" in error.inner_text()
    assert "step=broken" in page.url
    shot(page, "execution-failed-step")


def test_a_running_execution_advances_live_to_completed(page_as: Any, stack: Stack) -> None:
    eid = _start(stack, pause=0.4, n=10)
    page = page_as("reader")
    page.goto(f"{stack.url}/ui/executions/{eid}")
    page.locator('[data-testid="detail-status"][data-status="running"]').wait_for()
    _node(page, "each").and_(page.locator('[data-status="running"]')).wait_for()
    shot(page, "execution-running")
    page.locator('[data-testid="detail-status"][data-status="completed"]').wait_for(timeout=60_000)
    bar = page.get_by_test_id("progress-bar")
    assert (bar.get_attribute("data-done"), bar.get_attribute("data-total")) == ("10", "10")


def test_an_operator_cancels_a_long_run_from_the_page(page_as: Any, stack: Stack) -> None:
    eid = _start(stack, pause=0.5, n=400)
    page = page_as("operator")
    page.goto(f"{stack.url}/ui/executions/{eid}")
    page.locator('[data-testid="detail-status"][data-status="running"]').wait_for()
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_test_id("cancel-button").click()
    page.locator('[data-testid="detail-status"][data-status="cancelled"]').wait_for(timeout=60_000)
    with stack.client(timeout=30) as api:
        deadline = time.monotonic() + 30
        while api.get(f"/api/executions/{eid}/status").json()["status"] != "cancelled":
            assert time.monotonic() < deadline
            time.sleep(0.2)
    shot(page, "execution-cancelled")


def test_a_reader_cannot_cancel(page_as: Any, stack: Stack) -> None:
    eid = _start(stack, pause=0.5, n=40)
    try:
        page = page_as("reader")
        page.goto(f"{stack.url}/ui/executions/{eid}")
        page.locator('[data-testid="detail-status"][data-status="running"]').wait_for()
        page.once("dialog", lambda dialog: dialog.accept())
        page.get_by_test_id("cancel-button").click()
        message = page.get_by_test_id("message")
        message.filter(has_text="operator").wait_for()
        with stack.client(timeout=30) as api:
            assert api.get(f"/api/executions/{eid}/status").json()["status"] == "running"
    finally:
        with stack.client("operator", timeout=30) as api:
            api.post(f"/api/executions/{eid}/cancel", json={"reason": "test over"})


def test_an_admin_sees_the_workers_and_a_reader_is_told_why_not(page_as: Any, stack: Stack) -> None:
    page = page_as("admin")
    page.get_by_test_id("nav-workers").click()
    page.wait_for_url(re.compile(r".*/ui/workers$"))
    rows = page.locator('[data-testid="worker-row"]')
    rows.nth(1).wait_for()
    # The stack's two workers (and any a test of this module started), all alive.
    assert rows.count() >= 2
    statuses = {rows.nth(i).get_attribute("data-status") for i in range(rows.count())}
    assert statuses <= {"ready", "busy", "stopped"}, statuses
    assert "waiting to be published" in page.get_by_test_id("outbox-pending").inner_text()
    shot(page, "workers")
    reader = page_as("reader")
    reader.goto(f"{stack.url}/ui/workers")
    reader.get_by_test_id("workers-refused").filter(has_text="admin").wait_for()
