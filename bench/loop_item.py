"""CPU per item of a spark loop's partition, in this process (no Spark, no JVM): what a
Spark python worker spends on each item of `result = {'sq': x * x}` with
`input: {x: "{{ iter.x }}"}` (the item through `StepRunner.run`, its row written as
Arrow), against the same with the plain-reference fast path of templates turned off
(every `{{ iter.x }}` rendered by Jinja), interleaved, medians.

    .venv/bin/python bench/loop_item.py [--items 20000] [--rounds 5] [--json]

What a loop item costs in a python worker bounds what `mode: spark` can do on a machine:
two cores run two python workers, so N µs of CPU per item is at most 2,000,000 / N items/s
before Spark's own work.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import uuid
from typing import Any

import pyarrow as pa

from flowtide.playbook import template
from flowtide.spark.partition import run_partition

TEXT = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: loop_item, path: bench/loop_item}
workflow:
  - step: work
    loop: {in: "{{ [] }}", iterator: x, spec: {mode: spark}}
    tool:
      kind: python
      input: {x: "{{ iter.x }}"}
      code: "result = {'sq': x * x}"
"""


def _plan(n: int) -> dict[str, Any]:
    return {
        "key": uuid.uuid4().hex,
        "marks": None,
        "text": TEXT,
        "file": "loop_item.yaml",
        "step": "work",
        "iterator": "x",
        "size": n,
        "unwrap": "x",
        "columns": ["x"],
        "items": None,
        "base": {"workload": {}},
        "ctx": {},
        "execution_id": 1,
        "max_in_flight": 1,
        "data_dir": None,
        "embedded": True,
    }


def _cpu_per_item(n: int, fast: bool) -> float:
    """µs of this process's CPU per item over `n` items (the plan prepared beforehand)."""
    plan = _plan(n)
    batch = pa.RecordBatch.from_arrays(
        [pa.array(range(n), pa.int64()), pa.array(range(n), pa.int64())], names=["index", "c0"]
    )
    list(run_partition(plan, iter([batch.slice(0, 10)])))  # parse, compile, warm
    read_path = template._read_path
    if not fast:
        template._read_path = lambda path, context: template._MISSING
    try:
        t0 = time.process_time()
        (out,) = run_partition(plan, iter([batch]))
        spent = time.process_time() - t0
    finally:
        template._read_path = read_path
    assert out.num_rows == n and json.loads(out.column(2)[n - 1].as_py()) == {"sq": (n - 1) ** 2}
    return spent / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--items", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    fast: list[float] = []
    jinja: list[float] = []
    for _ in range(args.rounds):
        fast.append(_cpu_per_item(args.items, True))
        jinja.append(_cpu_per_item(args.items, False))
    out = {
        "items": args.items,
        "rounds": args.rounds,
        "load": [round(x, 2) for x in os.getloadavg()],
        "us_per_item": round(statistics.median(fast), 1),
        "us_per_item_jinja": round(statistics.median(jinja), 1),
        "ceiling_items_per_s_2_cores": round(2_000_000 / statistics.median(fast)),
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(
        f"{args.items:,} items x {args.rounds} rounds, load {out['load'][0]}:\n"
        f"  CPU per item: {out['us_per_item']} µs (plain references read directly),"
        f" {out['us_per_item_jinja']} µs (all through Jinja)\n"
        f"  two python workers at most: {out['ceiling_items_per_s_2_cores']:,} items/s"
        " before Spark's own work"
    )


if __name__ == "__main__":
    main()
