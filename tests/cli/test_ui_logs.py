"""A step's logs in `flowtide ui`: `GET /api/executions/{id}/logs?follow=true` streams what
a running python step prints (NDJSON), and the step panel's Logs section in Chromium
follows it while the step runs (the step waits until both have seen its first lines)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from browser import SEEN_MS, chromium, needs_chromium, shot

from .helpers import Flowtide, LocalUi, local_ui

pytestmark = needs_chromium

LINES = 1000

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: chatty, path: tests/ui/chatty}
workload: {go: "GO"}
workflow:
  - step: talk
    tool:
      kind: python
      input: {go: "{{ go }}"}
      code: |
        import os, time
        for i in range(LINES):
            print(f"line {i}")
            if i == 49:  # the test goes on once it has seen the running step's output
                deadline = time.monotonic() + 60
                while not os.path.exists(go) and time.monotonic() < deadline:
                    time.sleep(0.01)
            if i % 100 == 99:
                time.sleep(0.05)
        result = "done"
""".replace("LINES", str(LINES))


@pytest.fixture
def ft(tmp_path: Path) -> Flowtide:
    (tmp_path / "cwd").mkdir()
    return Flowtide(tmp_path / "home", tmp_path / "cwd")


@pytest.fixture
def ui(ft: Flowtide, tmp_path: Path) -> Iterator[LocalUi]:
    with local_ui(ft, tmp_path / "ui.out") as ui:
        yield ui


def test_the_step_panel_follows_a_running_steps_logs(
    ui: LocalUi, ft: Flowtide, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    eid = ui.start(PLAYBOOK, go=str(go))
    with ui.api.stream(
        "GET", f"/api/executions/{eid}/logs", params={"step": "talk", "follow": "true"}
    ) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("application/x-ndjson")
        lines = stream.iter_lines()
        first = json.loads(next(line for line in lines if line.strip()))
        # The step is still running: it waits for `go`.
        assert first["step"] == "talk" and first["running"] is True
        assert first["text"].startswith("line 0\n") and first["offset"] == 0
        assert ui.status(eid) == "running"

        with chromium() as browser:
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            page: Any = context.new_page()
            page.set_default_timeout(SEEN_MS)
            ui.sign_in(page)
            page.goto(f"{ui.url}/executions/{eid}")
            page.locator('[data-testid="graph-node"][data-step="talk"]').click()
            selector = '[data-testid="step-panel"][data-step="talk"] [data-testid="step-logs"]'
            logs = page.locator(selector)

            def shows(text: str, *, at_end: bool = False) -> None:
                page.wait_for_function(
                    "([sel, text, atEnd]) => { const el = document.querySelector(sel);"
                    " if (!el) return false; const t = el.textContent;"
                    " return atEnd ? t.endsWith(text) : t.includes(text); }",
                    arg=[selector, text, at_end],
                    timeout=2 * SEEN_MS,
                )

            shows("line 49\n")
            assert not go.exists() and ui.status(eid) == "running"  # seen while it runs
            go.touch()
            shows(f"line {LINES - 1}\n", at_end=True)
            text = logs.inner_text()
            shot(page, "step-logs")
            context.close()
        assert text.splitlines() == [f"line {i}" for i in range(LINES)]

        rest = "".join(json.loads(line)["text"] for line in lines if line.strip())
        assert first["text"] + rest == "".join(f"line {i}\n" for i in range(LINES))

    # Once ended: the whole output at once, without `follow`.
    reply = ui.api.get(f"/api/executions/{eid}/logs", params={"step": "talk"})
    assert reply.status_code == 200
    pieces = [json.loads(line) for line in reply.text.splitlines() if line.strip()]
    assert "".join(p["text"] for p in pieces) == "".join(f"line {i}\n" for i in range(LINES))
    assert all(p["running"] is False for p in pieces)
    missing = ui.api.get(f"/api/executions/{eid}/logs", params={"step": "nope"})
    assert missing.status_code == 404

    # `flowtide logs --server` reads the same route (the UI serves the server's API).
    env = {**ft.env, "FLOWTIDE_TOKEN": ui.token}
    remote = subprocess.run(
        ft.command("logs", eid, "talk", "-f", "--server", ui.base),
        capture_output=True, text=True, cwd=ft.cwd, env=env, timeout=60,
    )  # fmt: skip
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout == "".join(f"line {i}\n" for i in range(LINES))
    unknown = subprocess.run(
        ft.command("logs", eid, "nope", "--server", ui.base),
        capture_output=True, text=True, cwd=ft.cwd, env=env, timeout=60,
    )  # fmt: skip
    assert unknown.returncode == 2 and "nope" in unknown.stderr, unknown.stderr
