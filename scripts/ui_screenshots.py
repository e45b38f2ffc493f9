"""The README's screenshots of the web UI (docs/ui-*.png): the examples run embedded in a
fresh home, `flowtide ui` over them, Debian's Chromium (Playwright) on each page.

    .venv/bin/python scripts/ui_screenshots.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from browser import chromium  # noqa: E402

DOCS = ROOT / "docs"
FAILING = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: sensors, path: examples/sensors}
workload: {stations: [a1, a2, b7, c3]}
workflow:
  - step: start
    tool: {kind: python, input: {s: "{{ stations }}"}, code: "result = {'stations': s}"}
    next: [read]
  - step: read
    loop: {in: "{{ start.stations }}", iterator: station, spec: {mode: parallel}}
    tool:
      kind: python
      input: {station: "{{ iter.station }}"}
      code: |
        if station == "b7":
            raise ValueError(f"station {station}: no reading since 06:00")
        result = {"station": station, "celsius": 21.5}
    next: [report]
  - step: report
    tool: {kind: noop}
"""


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="flowtide-shots-") as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWTIDE_")}
        env |= {"FLOWTIDE_HOME": f"{tmp}/home", "FLOWTIDE_NO_PROGRESS": "1"}
        cli = [sys.executable, "-m", "flowtide.cli"]
        failing = Path(tmp) / "sensors.yaml"
        failing.write_text(FAILING)
        subprocess.run([*cli, "catalog", "register", str(ROOT / "examples")], env=env, check=True)
        ids = {}
        for name, path in (
            ("quickstart", ROOT / "examples/quickstart.yaml"),
            ("failed", failing),
            ("spark", ROOT / "examples/spark_etl.yaml"),
        ):
            run = subprocess.run(
                [*cli, "run", str(path), "--json"], capture_output=True, text=True, env=env
            )
            ids[name] = json.loads(run.stdout)["execution_id"]
        log = Path(tmp) / "ui.out"
        with open(log, "wb") as out:
            ui = subprocess.Popen([*cli, "ui", "--port", "0"], stdout=out, env=env)
        try:
            while not (found := re.search(r"open (\S+/ui)#token=(\S+)", log.read_text())):
                time.sleep(0.1)
            url, token = found[1], found[2]
            with chromium() as browser:
                page = browser.new_page(viewport={"width": 1280, "height": 720})
                page.goto(f"{url}#token={token}")
                page.get_by_test_id("exec-row").first.wait_for()
                page.screenshot(path=str(DOCS / "ui-executions.png"), animations="disabled")
                page.goto(f"{url}/executions/{ids['quickstart']}")
                page.locator('[data-testid="detail-status"][data-status="completed"]').wait_for()
                page.locator('[data-testid="graph-node"]').first.wait_for()
                page.screenshot(path=str(DOCS / "ui-graph.png"), animations="disabled")
                page.goto(f"{url}/executions/{ids['failed']}?step=read")
                page.get_by_test_id("step-panel").wait_for()
                page.screenshot(path=str(DOCS / "ui-failed-step.png"), animations="disabled")
                page.goto(f"{url}/executions/{ids['quickstart']}?tab=timeline")
                page.locator('[data-testid="timeline-lane"]').first.wait_for()
                page.screenshot(path=str(DOCS / "ui-timeline.png"), animations="disabled")
                page.goto(f"{url}/executions/{ids['quickstart']}?tab=events")
                page.get_by_test_id("event-row").first.wait_for()
                page.screenshot(path=str(DOCS / "ui-events.png"), animations="disabled")
                page.goto(f"{url}/executions/{ids['spark']}?step=summary")
                page.get_by_test_id("spark-preview").wait_for()
                page.get_by_test_id("spark-panel").scroll_into_view_if_needed()
                page.screenshot(path=str(DOCS / "ui-spark-step.png"), animations="disabled")
                page.goto(f"{url}/catalog/examples/quickstart")
                page.locator('[data-testid="yaml-line-1"]').wait_for()
                page.screenshot(path=str(DOCS / "ui-catalog.png"), animations="disabled")
        finally:
            ui.terminate()
            ui.wait(timeout=30)
    print("wrote", ", ".join(sorted(p.name for p in DOCS.glob("ui-*.png"))))


if __name__ == "__main__":
    main()
