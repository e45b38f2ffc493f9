"""A task's result has a size limit: a bigger one is an error the step's policy sees (kind
result_too_large), never an event too big to store or a report the server refuses."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from .helpers import Flowtide

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: big, path: tests/big}
workflow:
  - step: start
    tool:
      - name: make
        kind: python
        code: "result = {'blob': 'x' * 5000}"
        spec:
          policy:
            rules:
              - when: "{{ output.status == 'error' and output.error.kind == 'result_too_large' }}"
                then: {do: continue, set: {ctx.too_big: true}}
      - name: small
        kind: python
        code: "result = {'ok': True}"
"""


def test_a_result_over_the_limit_is_an_error_the_policy_sees(ft: Flowtide, tmp_path: Path) -> None:
    playbook = tmp_path / "big.yaml"
    playbook.write_text(PLAYBOOK)
    proc = subprocess.run(
        ft.command("run", playbook, "--json"),
        capture_output=True,
        text=True,
        cwd=ft.cwd,
        env={**ft.env, "FLOWTIDE_MAX_RESULT_BYTES": "1000"},
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["status"] == "completed"
    assert doc["steps"]["start"]["result"] == {"ok": True}
    events = json.loads(ft.ok("events", doc["execution_id"], "--json").stdout)
    errors = [e["error"] for e in events if e["type"] == "call.error"]
    assert errors and errors[0]["kind"] == "result_too_large"
    assert "1000-byte limit" in errors[0]["message"]
    assert "x" * 1000 not in proc.stdout + json.dumps(events)
