"""A spark loop whose run was killed mid-job (SIGKILL), in `flowtide status` and in the
UI: the items it had done and no items per second (its job runs no more), and both say
that a resume runs all its items again (its counts were progress; the job's output is
not kept), rather than "N succeeded" and "iterations are kept".

Screenshot: build/screenshots/spark-loop-interrupted.png."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from browser import SEEN_MS, chromium, needs_chromium, shot

from .helpers import Flowtide, local_ui, wait_until

pytestmark = [needs_chromium, pytest.mark.spark, pytest.mark.timeout(300)]

SLOW = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: slow_spark, path: tests/ui/slow_spark}
workload: {marker: M}
workflow:
  - step: work
    loop: {in: "{{ range(20000) | list }}", iterator: x, spec: {mode: spark, partitions: 4}}
    tool:
      kind: python
      input: {x: "{{ iter.x }}", marker: "{{ workload.marker }}"}
      code: |
        import time
        if x == 0:
            open(marker, "w").write("started")
        time.sleep(0.005)
        result = x
"""


def _done(ft: Flowtide, eid: str) -> int:
    items = ft.status(eid)["steps"]["work"].get("items") or {}
    return int(items.get("done") or 0)


def test_a_killed_spark_loop_is_shown_stopped(ft: Flowtide, tmp_path: Path) -> None:
    playbook = tmp_path / "slow_spark.yaml"
    playbook.write_text(SLOW, encoding="utf-8")
    marker = tmp_path / "started"
    with (tmp_path / "run.log").open("wb") as log:
        proc = ft.popen("run", playbook, "--set", f"marker={marker}", stdout=log, stderr=log)
        try:
            wait_until(marker.exists, timeout=120, what="the first item", proc=proc)
            eid = ft.executions()[0]["execution_id"]
            wait_until(lambda: _done(ft, eid) > 0, timeout=60, what="progress", proc=proc)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    status = ft.status(eid)
    assert status["status"] == "interrupted"
    assert status["steps"]["work"]["items"]["per_second"] == 0.0
    text = ft.ok("status", eid).stdout
    assert "when it stopped" in text and "/s)" not in text, text
    assert "a resume runs all" in " ".join(text.split()), text

    with local_ui(ft, tmp_path / "ui.out") as ui, chromium() as browser:
        summary = ui.get(f"/api/executions/{eid}/summary")
        loop = summary["steps"]["work"]["loop"]
        assert summary["status"] == "interrupted"
        assert loop["exact"] is False and loop["per_second"] == 0.0 and loop["done"] > 0
        page: Any = browser.new_page(viewport={"width": 1400, "height": 900})
        page.set_default_timeout(SEEN_MS)
        ui.sign_in(page)
        page.get_by_test_id("exec-row").first.wait_for()
        page.goto(f"{ui.url}/executions/{eid}?step=work")
        again = page.get_by_test_id("spark-loops-again")
        again.wait_for()
        assert "Spark loop work" in again.inner_text()
        outcome = page.get_by_test_id("spark-outcome")
        outcome.wait_for()
        assert "a resume runs all its items again" in outcome.inner_text()
        assert "succeeded" not in page.inner_text("body")
        facts = outcome.locator("xpath=ancestor::dl").inner_text()  # the step's
        assert "Iterations" in facts and not re.search(r"[\d,]+/s\b", facts), facts
        shot(page, "spark-loop-interrupted")
