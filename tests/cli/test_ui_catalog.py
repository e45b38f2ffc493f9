"""The web UI's catalog pages over `flowtide ui`: a playbook registered with `flowtide
catalog register` is listed, its YAML shows with line numbers, its Run form starts an
execution with a changed workload value (the page lands on the run, which completes),
and a bad edit validated shows the error on its line."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from browser import SEEN_MS, chromium, needs_chromium, shot

from .helpers import Flowtide, LocalUi, local_ui

FLOW = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: ui_catalog
  path: tests/ui/catalog
  description: Counts to a number of the workload
workload:
  count: 2
  label: small
workflow:
  - step: start
    tool:
      kind: python
      input: {count: "{{ count }}", label: "{{ label }}"}
      code: "result = {'numbers': list(range(int(count))), 'label': label}"
    next:
      arcs:
        - step: end
  - step: end
    tool: {kind: noop}
"""


@pytest.fixture
def catalog_ui(ft: Flowtide, tmp_path: Path) -> Iterator[LocalUi]:
    """The playbook registered, and `flowtide ui` over the home."""
    playbook = tmp_path / "catalog.yaml"
    playbook.write_text(FLOW)
    ft.ok("catalog", "register", playbook)
    with local_ui(ft, tmp_path / "ui.out") as ui:
        yield ui


@needs_chromium
def test_the_catalog_lists_shows_runs_and_validates_a_playbook(catalog_ui: LocalUi) -> None:
    ui = catalog_ui
    lines = FLOW.splitlines()
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        page = context.new_page()
        page.set_default_timeout(SEEN_MS)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        ui.sign_in(page)
        page.get_by_test_id("nav-catalog").click()

        # The list: the registered playbook, its latest version and its file.
        row = page.locator('[data-testid="catalog-row"][data-path="tests/ui/catalog"]')
        row.wait_for()
        assert "v1" in row.inner_text() and "catalog.yaml" in row.inner_text()
        page.get_by_test_id("catalog-filter").fill("no such playbook")
        row.wait_for(state="detached")
        page.get_by_test_id("catalog-filter").fill("ui/cat")
        row.get_by_role("link").click()

        # The YAML, one numbered element per line; the header from the metadata.
        page.wait_for_url(re.compile(r"/ui/catalog/tests/ui/catalog$"))
        page.get_by_test_id(f"yaml-line-{len(lines)}").wait_for()
        assert page.locator('[data-testid^="yaml-line-"]').count() == len(lines)
        first = page.get_by_test_id("yaml-line-1")
        assert first.locator(".ln").inner_text() == "1"
        assert first.locator(".lc").inner_text() == lines[0]
        assert page.get_by_test_id("catalog-name").inner_text() == "ui_catalog"
        description = page.get_by_test_id("catalog-description")
        if "description" in ui.get("/api/catalog/tests/ui/catalog"):
            assert description.inner_text() == "Counts to a number of the workload"
        else:  # an API without the entry's description: nothing shown for it
            assert description.is_hidden()
        shot(page, "local-catalog-entry")

        # The Run form: a JSON value that does not parse is named; a changed one is sent.
        count = page.get_by_test_id("run-input-count")
        assert count.input_value() == "2"
        assert page.get_by_test_id("run-input-label").input_value() == "small"
        count.fill("{5")
        page.get_by_test_id("run-submit").click()
        assert "count" in page.get_by_test_id("run-field-error-count").inner_text()
        assert page.url.endswith("/ui/catalog/tests/ui/catalog")
        count.fill("5")
        page.get_by_test_id("run-submit").click()
        page.wait_for_url(re.compile(r"/ui/executions/\d+"))
        execution_id = page.url.split("/ui/executions/")[1].split("?")[0]
        page.locator('[data-testid="detail-status"][data-status="completed"]').wait_for()
        run = ui.get(f"/api/executions/{execution_id}")
        assert run["steps"]["start"]["result"] == {"numbers": [0, 1, 2, 3, 4], "label": "small"}

        # The run is among the playbook's recent executions.
        page.go_back()
        recent = page.locator(f'[data-testid="recent-row"][data-id="{execution_id}"]')
        recent.locator('[data-status="completed"]').wait_for()

        # A bad edit, validated: the error on its line, a click selects the line.
        page.get_by_test_id("catalog-edit").click()
        editor = page.get_by_test_id("editor-text")
        bad = next(n for n, line in enumerate(lines, 1) if "kind: noop" in line)
        editor.fill(FLOW.replace("kind: noop", "kind: nope"))
        page.get_by_test_id("editor-validate").click()
        error = page.locator(f'[data-testid="editor-error"][data-line="{bad}"]')
        error.wait_for()
        assert "nope" in error.inner_text()
        gutter = page.get_by_test_id(f"editor-line-{bad}")
        assert "has-error" in (gutter.get_attribute("class") or "")
        error.click()
        selected = editor.evaluate("t => t.value.slice(t.selectionStart, t.selectionEnd)")
        assert selected == lines[bad - 1].replace("noop", "nope")
        page.evaluate("window.scrollTo(0, 0)")
        shot(page, "local-catalog-edit-error")
        # Not registered: still one version.
        assert ui.get("/api/catalog/tests/ui/catalog")["versions"] == 1
        assert not errors, errors
        context.close()


def test_the_catalog_page_is_served(catalog_ui: LocalUi) -> None:
    """catalog.js ships with the page (the asset map serves shipped files only)."""
    script = httpx.get(f"{catalog_ui.url}/static/catalog.js", timeout=30)
    assert script.status_code == 200 and "mountCatalogList" in script.text
    listed = catalog_ui.get("/api/catalog/list")["items"]
    assert [(i["path"], i["version"]) for i in listed] == [("tests/ui/catalog", 1)]
    entry = catalog_ui.get("/api/catalog/tests/ui/catalog")
    assert entry["workload"] == {"count": 2, "label": "small"}
    assert entry["name"] == "ui_catalog" and entry["errors"] == []
