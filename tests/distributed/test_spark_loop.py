"""A `mode: spark` loop on the distributed stack: the worker that claims the loop's one
command is the Spark driver (its own local session), and the result is what the same
playbook gives embedded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .stack import Stack
from .test_results import _embedded

pytestmark = [pytest.mark.postgres, pytest.mark.nats, pytest.mark.spark]

STACK_WORKERS = 1

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: spark_loop_dist, path: tests/dist/spark_loop}
workload: {n: 500}
workflow:
  - step: start
    tool: {kind: python, input: {n: "{{ workload.n }}"}, code: "result = list(range(n))"}
    next: [square]
  - step: square
    loop: {in: "{{ start }}", iterator: x, spec: {mode: spark, partitions: 2}}
    tool:
      kind: python
      input: {x: "{{ iter.x }}"}
      code: |
        if x % 50 == 3:
            raise ValueError(x)
        result = x * x
      spec:
        policy:
          rules:
            - when: "{{ output.status == 'error' }}"
              then: {do: continue}
    next: [end]
  - step: end
    tool:
      kind: python
      input: {stats: "{{ square.stats }}", results: "{{ square.results }}"}
      code: "result = {'stats': stats, 'sum': sum(r for r in results if isinstance(r, int))}"
"""


def test_a_spark_loop_runs_on_a_worker_as_embedded(stack: Stack, tmp_path: Path) -> None:
    file = tmp_path / "spark_loop.yaml"
    file.write_text(PLAYBOOK)
    proc = stack.run("run", file, "--json", timeout=300)
    assert proc.stdout, proc.stderr + stack.log("worker0")
    remote = json.loads(proc.stdout)
    assert remote["status"] == "completed", remote["error"]
    assert remote["result"] == {
        "stats": {"total": 500, "success": 490, "failed": 10},
        "sum": sum(x * x for x in range(500) if x % 50 != 3),
    }
    local = _embedded(stack.root, file)
    assert local["result"] == remote["result"]
