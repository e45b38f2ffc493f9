"""The execution pages of `flowtide ui` in a browser: the step panel (a step's source and
result), the event log followed live over the SSE stream to its `end` event, a long log
opened at its end and paged back (never read from its start), re-running
an execution from its page, sub-executions and their parent, and the list's filters
taken from the URL. One `flowtide ui` and one Chromium serve every test of the module."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from browser import SEEN_MS, chromium, needs_chromium, shot

from .helpers import Flowtide, LocalUi, local_ui

pytestmark = needs_chromium

ALPHA = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: alpha, path: tests/ui/alpha}
workload: {n: 3, pause: 0.0}
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
    tool:
      kind: python
      code: "result = {'greeting': 'hello from alpha', 'nothing': None}"
"""

BETA = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: beta, path: tests/ui/beta}
workflow:
  - step: start
    tool: {kind: noop}
"""

CHILD = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: kid, path: tests/ui/kid}
workload: {k: 0}
workflow:
  - step: work
    tool: {kind: python, input: {k: "{{ k }}"}, code: "result = {'k': k}"}
"""

#: 600 iterations of five events each: a log the page must not read from its start.
LONG = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: long, path: tests/ui/long}
workflow:
  - step: start
    tool: {kind: python, code: "result = {'numbers': list(range(600))}"}
    next: [each]
  - step: each
    # One command per iteration (batch: 1): a log of 600 iterations' every event.
    loop: {in: "{{ start.numbers }}", iterator: item, spec: {mode: sequential, batch: 1}}
    tool: {kind: python, input: {i: "{{ item }}"}, code: "result = {'i': i}"}
    next: [end]
  - step: end
    tool: {kind: noop}
"""

PARENT = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: parent, path: tests/ui/parent}
workflow:
  - step: fan
    loop: {in: "{{ range(2) | list }}", iterator: k, spec: {mode: parallel}}
    tool: {kind: playbook, path: tests/ui/kid, args: {k: "{{ k }}"}}
"""


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalUi]:
    """Runs of alpha, beta, long and a parent with two children, and `flowtide ui` over
    them."""
    root = tmp_path_factory.mktemp("ui_detail")
    (root / "cwd").mkdir()
    ft = Flowtide(root / "home", root / "cwd")
    files = {}
    for name, text in (
        ("alpha", ALPHA),
        ("beta", BETA),
        ("kid", CHILD),
        ("parent", PARENT),
        ("long", LONG),
    ):
        files[name] = root / f"{name}.yaml"
        files[name].write_text(text)
    ft.ok("catalog", "register", files["kid"])
    ids = {}
    for name in ("alpha", "beta", "parent", "long"):
        run = ft("run", files[name], "--json")
        assert run.returncode == 0, run.stderr
        ids[name] = str(json.loads(run.stdout)["execution_id"])
    with local_ui(ft, root / "ui.out") as ui:
        ui.ids = ids
        yield ui


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser: Any, ui: LocalUi) -> Iterator[Any]:
    """A page signed in with the URL's token, on the executions list."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(SEEN_MS)
    ui.sign_in(page)
    page.get_by_test_id("exec-row").first.wait_for()
    yield page
    context.close()


def _line(text: str, marker: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), start=1) if marker in line)


def test_the_step_panel_shows_the_steps_result_and_source(page: Any, ui: LocalUi) -> None:
    page.goto(f"{ui.url}/executions/{ui.ids['alpha']}")
    page.locator('[data-testid="graph-node"][data-step="end"][data-status="completed"]').click()
    panel = page.locator('[data-testid="step-panel"][data-step="end"]')
    result = panel.get_by_test_id("step-result")
    result.wait_for()
    assert json.loads(result.locator("pre").inner_text()) == {
        "greeting": "hello from alpha",
        "nothing": None,
    }
    source = panel.get_by_test_id("step-source")
    # Numbered from the step's own line of the playbook file.
    assert source.get_attribute("data-line") == str(_line(ALPHA, "- step: end"))
    assert source.inner_text().split("\n")[0].split() == [
        str(_line(ALPHA, "- step: end")),
        "-",
        "step:",
        "end",
    ]
    assert "hello from alpha" in source.inner_text()
    assert "alpha.yaml:" in panel.get_by_test_id("step-where").inner_text()
    calls = panel.get_by_test_id("step-call")
    assert calls.count() == 1 and calls.first.get_attribute("data-type") == "call.done"
    assert "step=end" in page.url
    shot(page, "local-step-panel")
    # The loop step: its result holds the iterations' results.
    page.locator('[data-testid="graph-node"][data-step="each"]').click()
    loop = page.locator('[data-testid="step-panel"][data-step="each"] [data-testid="step-result"]')
    loop.wait_for()
    assert json.loads(loop.locator("pre").inner_text())["results"] == [{"i": 0}, {"i": 1}, {"i": 2}]


def test_the_event_log_follows_a_running_execution_to_its_end(page: Any, ui: LocalUi) -> None:
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    eid = ui.start(ALPHA, n=16, pause=0.15)
    page.goto(f"{ui.url}/executions/{eid}?tab=events")
    state = page.get_by_test_id("events-state")
    page.locator('[data-testid="events-state"][data-state="live"]').wait_for()
    assert ui.status(eid) == "running"
    rows = page.get_by_test_id("event-row")
    seen = rows.count()
    # New events arrive over the stream while it runs.
    page.wait_for_function(
        "n => document.querySelectorAll('[data-testid=event-row]').length > n", arg=seen
    )
    shot(page, "local-events-live")
    page.locator('[data-testid="events-state"][data-state="ended"]').wait_for()
    assert state.get_attribute("data-end-status") == "completed"
    assert "completed" in state.inner_text()
    # The end event made the page read the summary once more.
    page.locator('[data-testid="detail-status"][data-status="completed"]').wait_for()
    last = page.get_by_test_id("events-last")
    if last.is_enabled():
        last.click()
    page.locator('[data-testid="event-row"][data-type="playbook.completed"]').wait_for()
    events = ui.api.get(f"/api/executions/{eid}/events", params={"limit": 10_000}).json()
    assert f"of {len(events)}" in page.locator(".events-view .pager").inner_text()
    # Followed by one stream, not by polling /events every second.
    streams = [u for u in requests if f"/api/executions/{eid}/events/stream" in u]
    polls = [u for u in requests if re.search(rf"/api/executions/{eid}/events\?", u)]
    assert len(streams) == 1, streams
    assert len(polls) <= 2, polls
    shot(page, "local-events-ended")


def test_a_long_log_opens_at_its_end_and_pages_back(page: Any, ui: LocalUi) -> None:
    eid = ui.ids["long"]
    log = ui.api.get(f"/api/executions/{eid}/events", params={"limit": 10_000}).json()
    assert len(log) >= 2500 and log[-1]["type"] == "playbook.completed"
    ids = [e["event_id"] for e in log]
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(f"{ui.url}/executions/{eid}?tab=events")
    rows = page.get_by_test_id("event-row")
    # It opens on the newest events: the run's last one is the last row shown.
    page.locator('[data-testid="event-row"][data-type="playbook.completed"]').wait_for()
    assert rows.last.get_attribute("data-id") == ids[-1]
    view = page.locator(".events-view")
    assert view.get_attribute("data-whole") == "false"
    info = page.get_by_test_id("events-info")
    assert "of 500 loaded" in info.inner_text()
    assert "500 events loaded" in page.get_by_test_id("events-scope").inner_text()
    assert "500 loaded events" in page.get_by_test_id("events-counts-scope").inner_text()
    assert page.get_by_test_id("events-start").is_hidden()
    shot(page, "local-events-long")
    # Older pages go in front; the first row is then the first of the page before.
    page.get_by_test_id("events-older").click()
    page.wait_for_function(
        "() => document.querySelector('[data-testid=events-info]').textContent"
        ".includes('of 1,000 loaded')"
    )
    assert rows.first.get_attribute("data-id") == ids[-1000]
    # ... up to the start of the log, which is then said so (and the counts are the log's).
    for _ in range(len(log) // 500 + 1):
        if page.get_by_test_id("events-start").is_visible():
            break
        page.locator('[data-testid="events-older"]:enabled').click()
        page.wait_for_function(
            "() => !document.querySelector('[data-testid=events-older]').disabled"
            " || document.querySelector('[data-testid=events-older]').hidden"
        )
    page.get_by_test_id("events-start").wait_for()
    assert page.get_by_test_id("events-older").is_hidden()
    assert rows.first.get_attribute("data-id") == ids[0]
    assert view.get_attribute("data-whole") == "true"
    assert f"of {len(log):,} ·" in info.inner_text()
    chip = page.locator('[data-testid="event-type-chip"][data-type="loop.item"]')
    assert chip.get_attribute("data-count") == "600"
    # The step panel reads its step's newest events (shown newest first), not the log.
    page.get_by_test_id("tab-graph").click()
    page.locator('[data-testid="graph-node"][data-step="each"]').click()
    step_rows = page.locator(
        '[data-testid="step-panel"][data-step="each"] [data-testid="step-event-row"]'
    )
    step_rows.first.wait_for()
    mine = [e for e in log if e.get("step") == "each"]
    assert step_rows.count() == 50
    assert [step_rows.nth(i).get_attribute("data-id") for i in range(50)] == [
        e["event_id"] for e in reversed(mine[-50:])
    ]
    step_reqs = [u for u in requests if re.search(rf"/api/executions/{eid}/events\?.*step=each", u)]
    assert len(step_reqs) == 1 and "newest=true" in step_reqs[0], step_reqs
    # Never a page read from the start of the log.
    reads = [u for u in requests if re.search(rf"/api/executions/{eid}/events\?", u)]
    assert reads and all("newest=true" in u for u in reads), reads
    shot(page, "local-step-events")


def test_re_run_starts_a_new_execution_that_completes(page: Any, ui: LocalUi) -> None:
    first = ui.ids["alpha"]
    page.goto(f"{ui.url}/executions/{first}")
    page.locator('[data-testid="detail-status"][data-status="completed"]').wait_for()
    # A finished run has nothing to resume.
    assert page.get_by_test_id("resume-button").is_hidden()
    page.get_by_test_id("rerun-button").click()
    page.wait_for_url(re.compile(rf".*/ui/executions/(?!{first})\d+$"))
    new = page.url.rsplit("/", 1)[1]
    page.locator('[data-testid="detail-status"][data-status="completed"]').wait_for()
    item = next(
        i
        for i in ui.api.get("/api/executions", params={"limit": 100}).json()["items"]
        if i["execution_id"] == new
    )
    assert item["playbook"] == "tests/ui/alpha" and item["status"] == "completed"
    summary = ui.api.get(f"/api/executions/{new}/summary").json()
    assert summary["progress"]["iterations_done"] == 3


def test_sub_executions_link_to_their_parent(page: Any, ui: LocalUi) -> None:
    parent = ui.ids["parent"]
    page.goto(f"{ui.url}/executions/{parent}")
    table = page.get_by_test_id("children-table")
    table.wait_for()
    children = page.get_by_test_id("child-row")
    assert children.count() == 2
    child = children.first.get_attribute("data-id")
    children.first.locator("a").click()
    link = page.get_by_test_id("parent-link")
    link.wait_for()
    assert link.inner_text() == parent and page.url.endswith(f"/executions/{child}")
    # A sub-execution is started by its parent, not re-run on its own.
    assert page.get_by_test_id("rerun-button").is_disabled()
    link.click()
    table.wait_for()


def test_the_list_filters_by_the_urls_query(page: Any, ui: LocalUi) -> None:
    page.goto(f"{ui.url}/executions?playbook=beta")
    page.locator(f'[data-testid="exec-row"][data-id="{ui.ids["beta"]}"]').wait_for()
    rows = page.get_by_test_id("exec-row")
    assert rows.count() == 1
    assert page.get_by_test_id("filter-input").input_value() == "beta"
    # Typing replaces the query (it is shareable) and narrows on the server.
    page.get_by_test_id("filter-input").fill("alpha")
    page.locator(f'[data-testid="exec-row"][data-id="{ui.ids["alpha"]}"]').wait_for()
    page.locator(f'[data-testid="exec-row"][data-id="{ui.ids["beta"]}"]').wait_for(state="detached")
    assert "playbook=alpha" in page.url
    page.get_by_test_id("min-duration-select").select_option("600")
    page.get_by_test_id("exec-row").first.wait_for(state="detached")
    assert "min_seconds=600" in page.url
    page.goto(f"{ui.url}/executions?parent={ui.ids['parent']}&range=1h")
    page.get_by_test_id("parent-filter").wait_for()
    page.locator('[data-testid="exec-row"] [data-testid="sub-marker"]').first.wait_for()
    assert page.get_by_test_id("exec-row").count() == 2
    assert page.get_by_test_id("range-select").input_value() == "1h"
    shot(page, "local-executions-filtered")
