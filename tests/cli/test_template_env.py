"""`flowtide run` (embedded): templates see the user's environment, never flowtide's own
settings (FLOWTIDE_*), and a hidden name is a clear error or its default."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from .helpers import Flowtide, describe

PLAYBOOK = """\
workflow:
  - step: start
    set:
      ctx.visible: "{{ env.FT_TEST_VISIBLE }}"
      ctx.db: "{{ env.FLOWTIDE_DB | default('hidden') }}"
    next: [{step: report}]
  - step: report
    tool:
      kind: python
      input: {visible: "{{ ctx.visible }}", db: "{{ ctx.db }}"}
      code: |
        def main(visible, db):
            return {"visible": visible, "db": db}
"""

LEAK = """\
workflow:
  - step: start
    set:
      ctx.db: "{{ env.FLOWTIDE_DB }}"
"""


def _run(ft: Flowtide, playbook: Path, db: Path, expect: int) -> tuple[dict[str, object], str]:
    env = {**ft.env, "FLOWTIDE_DB": str(db), "FT_TEST_VISIBLE": "shown"}
    proc = subprocess.run(
        ft.command("run", playbook, "--json"),
        capture_output=True,
        text=True,
        cwd=ft.cwd,
        env=env,
        timeout=120,
    )
    assert proc.returncode == expect, describe(proc)
    events = subprocess.run(
        ft.command("events", json.loads(proc.stdout)["execution_id"], "--json"),
        capture_output=True,
        text=True,
        cwd=ft.cwd,
        env=env,
        timeout=60,
    )
    assert events.returncode == 0, describe(events)
    return json.loads(proc.stdout), proc.stdout + proc.stderr + events.stdout + events.stderr


def test_flowtide_settings_are_hidden_from_templates(ft: Flowtide, tmp_path: Path) -> None:
    # The event store's location stands for any FLOWTIDE_* secret (a DSN with a password).
    db = tmp_path / "store-s3cret-location.db"
    playbook = tmp_path / "env.yaml"
    playbook.write_text(PLAYBOOK, encoding="utf-8")
    doc, output = _run(ft, playbook, db, expect=0)
    assert doc["result"] == {"visible": "shown", "db": "hidden"}
    assert str(db) not in output

    leak = tmp_path / "leak.yaml"
    leak.write_text(LEAK, encoding="utf-8")
    doc, output = _run(ft, leak, db, expect=1)
    assert doc["status"] == "failed"
    error = doc["error"]
    assert isinstance(error, dict) and error["step"] == "start"
    assert "'env' has no attribute 'FLOWTIDE_DB'" in error["message"]
    assert "FLOWTIDE_* are never visible to templates" in error["message"]
    assert str(db) not in output
