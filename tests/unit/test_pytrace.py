"""A failed python step's traceback placed in the playbook: where a task's inline
`code:` starts (`code_start`), and the error with its frames mapped (`with_traceback`)."""

from __future__ import annotations

from flowtide.playbook.loader import parse_playbook
from flowtide.runtime.pytrace import code_start, with_traceback

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: trace, path: trace}
workflow:
  - step: start
    tool:
      kind: python
      code: |
        def helper(x):
            return 1 / x
        result = helper(0)
    next: [pipe]
  - step: pipe
    tool:
      - name: first
        kind: python
        code: "result = 1"
      - name: second
        kind: python
        code: |-
          x = 1
          raise ValueError(x)
  - step: flow
    tool: {kind: python, code: "result = 1"}
"""


def test_code_start_is_the_first_line_of_the_tasks_code() -> None:
    playbook = parse_playbook(PLAYBOOK, "/tmp/trace.yaml")
    start = playbook.steps["start"]
    assert code_start(playbook, start, start.tasks[0]) == 9
    pipe = playbook.steps["pipe"]
    assert code_start(playbook, pipe, pipe.tasks[0]) == 17
    assert code_start(playbook, pipe, pipe.tasks[1]) == 21
    flow = playbook.steps["flow"]
    assert code_start(playbook, flow, flow.tasks[0]) is None


def test_the_traceback_names_the_playbooks_lines() -> None:
    playbook = parse_playbook(PLAYBOOK, "/tmp/trace.yaml")
    start = playbook.steps["start"]
    error = {
        "kind": "python_error",
        "message": "ZeroDivisionError: division by zero (line 2: return 1 / x)",
    }
    data = {
        "exception": "ZeroDivisionError",
        "filename": "<code>",
        "frames": [
            {"line": 3, "function": "<module>", "source": "result = helper(0)"},
            {"line": 2, "function": "helper", "source": "return 1 / x"},
        ],
    }
    mapped = with_traceback(error, data, playbook, start, start.tasks[0])
    assert mapped["message"] == "ZeroDivisionError: division by zero (trace.yaml:10: return 1 / x)"
    assert mapped["traceback"].splitlines() == [
        "Traceback (most recent call last):",
        '  File "trace.yaml", line 11, in <module>',
        "    result = helper(0)",
        '  File "trace.yaml", line 10, in helper',
        "    return 1 / x",
        "ZeroDivisionError: division by zero",
    ]
    # Without frames (another tool's error), the error is left as it is.
    assert with_traceback(error, {"x": 1}, playbook, start, start.tasks[0]) is error
