"""A result has a size limit in events (FLOWTIDE_MAX_RESULT_BYTES): a bigger one is stored
by reference (flowtide.artifacts), never an event too big to store or a report the server
refuses; a task's policy still sees the whole result."""

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
              - when: "{{ output.status == 'ok' and output.data.blob | length == 5000 }}"
                then: {do: continue, set: {ctx.whole: true}}
      - name: small
        kind: python
        code: "result = {'ok': True}"
"""


def test_a_result_over_the_limit_is_stored_by_reference(ft: Flowtide, tmp_path: Path) -> None:
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
    assert not [e for e in events if e["type"] == "call.error"]
    completed = next(e for e in events if e["type"] == "command.completed")
    made = completed["payload"]["tasks"]["make"]
    assert made["_store"] == "kv" and made["_size_bytes"] == len(
        json.dumps({"blob": "x" * 5000}, separators=(",", ":"))
    )
    assert completed["payload"]["ctx"] == {"whole": True}
    assert "x" * 1000 not in proc.stdout + json.dumps(events)
