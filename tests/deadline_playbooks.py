"""A playbook whose one python step sleeps, with the deadlines a test gives it (the
embedded and the distributed deadline tests), and how to tell its child still runs."""

from __future__ import annotations

import subprocess

SLOW = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: slow, path: tests/deadlines/slow}}
{limits}
workflow:
  - step: start
    tool:
      kind: python
      code: |
        import time
        marker = "{marker}"
        time.sleep({sleep})
        result = {{"done": True}}
"""


def alive(marker: str) -> bool:
    """Whether a process whose command line holds `marker` still runs."""
    found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    return bool(found.stdout.strip())
