"""A failed call's event keeps what the call was given (its rendered input), so the UI's
step panel and `flowtide events` show what failed with what; a large input only by its
size and keys."""

from __future__ import annotations

from pathlib import Path

from browser import SEEN_MS, chromium, needs_chromium, shot

from .helpers import Flowtide, local_ui

FLOW = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: failed_input}
workload: {n: 3, size: 10}
workflow:
  - step: start
    tool:
      kind: python
      input: {n: "{{ workload.n }}", rows: "{{ range(workload.size) | list }}"}
      code: "raise ValueError(f'bad n {n}')"
"""


def _call_error(ft: Flowtide, playbook: Path, *extra: str) -> dict[str, object]:
    doc = ft.run(playbook, *extra, expect=1)
    [event] = [e for e in ft.events(doc["execution_id"]) if e["type"] == "call.error"]
    return dict(event["payload"])


def test_a_failed_call_keeps_its_input(ft: Flowtide, tmp_path: Path) -> None:
    playbook = tmp_path / "failed.yaml"
    playbook.write_text(FLOW)
    payload = _call_error(ft, playbook)
    assert payload["input"] == {"n": 3, "rows": list(range(10))}
    big = _call_error(ft, playbook, "--set", "size=5000")
    assert big["input"] == {
        "truncated": True,
        "bytes": big["input"]["bytes"],
        "keys": ["n", "rows"],
    }  # type: ignore[index]
    assert big["input"]["bytes"] > 4096  # type: ignore[index]


@needs_chromium
def test_the_step_panel_shows_the_failed_calls_input(ft: Flowtide, tmp_path: Path) -> None:
    playbook = tmp_path / "failed.yaml"
    playbook.write_text(FLOW)
    eid = ft.run(playbook, expect=1)["execution_id"]
    with local_ui(ft, tmp_path / "ui.out") as ui:
        detail = ui.get(f"/api/executions/{eid}/steps/start")
        assert detail["calls"][0]["meta"]["input"] == {"n": 3, "rows": list(range(10))}
        with chromium() as browser:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(SEEN_MS)
            ui.sign_in(page)
            page.get_by_test_id("exec-row").first.wait_for()
            page.goto(f"{ui.url}/executions/{eid}?step=start")
            shown = page.get_by_test_id("step-input")
            shown.wait_for()
            assert '"rows"' in shown.inner_text() and "Attempt 1" in shown.inner_text()
            # A failed run has nothing to resume; it can be run again.
            assert page.get_by_test_id("resume-button").is_hidden()
            assert page.get_by_test_id("rerun-button").is_visible()
            shot(page, "local-failed-call-input")
