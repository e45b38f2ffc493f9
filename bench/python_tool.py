"""Micro-benchmark of PythonTool per-call overhead.

    .venv/bin/python bench/python_tool.py [--calls N]

Prints microseconds per call for a few snippet shapes, next to a bare `exec` of the same
precompiled code (the floor any in-process runner pays).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from flowtide.tools.base import ToolContext
from flowtide.tools.python import PythonTool

CASES: list[tuple[str, dict[str, Any]]] = [
    ("result = {...} (trivial)", {"input": {}, "code": 'result = {"status": "ok"}\n'}),
    (
        "bare input + result",
        {"input": {"message": "hi"}, "code": 'result = {"status": "ok", "m": message}\n'},
    ),
    ("print + result", {"input": {"m": "hi"}, "code": 'print(f"HELLO {m}")\nresult = 1\n'}),
    ("def main(a, b=1)", {"input": {"a": 1}, "code": "def main(a, b=1):\n    return a + b\n"}),
    ("module-level return", {"input": {"x": 1}, "code": "x = x + 1\nreturn {'x': x}\n"}),
    (
        "trivial with timeout (thread)",
        {"input": {}, "code": "result = 1\n", "timeout": 30},
    ),
]


def per_call_us(fn: Callable[[], Any], calls: int) -> float:
    """Best of three timed runs of `calls` calls, in microseconds per call."""
    fn()  # warm up (fills the compile cache)
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter_ns() - started) / calls / 1000)
    return best


def main() -> None:
    """Run every case and print a table of µs per call."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()

    tool = PythonTool()
    floor_code = compile('result = {"status": "ok"}\n', "<code>", "exec")
    floor = per_call_us(lambda: exec(floor_code, {}), args.calls)
    print(f"{'bare exec of precompiled code':34s} {floor:8.2f} µs/call")
    print(f"{'':34s} {'tool only':>13s} {'+ new ToolContext':>20s}")
    # One reused context isolates the tool's own overhead; a fresh ToolContext per call
    # (what the runtime does) adds its construction, mostly Path.cwd() for base_dir.
    ctx = ToolContext(execution_id=1, step="bench")
    for label, config in CASES:
        calls = args.calls // 20 if "timeout" in config else args.calls

        def reuse(config: dict[str, Any] = config) -> Any:
            ctx.stdout.clear()
            return tool.run(config, ctx)

        def fresh(config: dict[str, Any] = config) -> Any:
            return tool.run(config, ToolContext(execution_id=1, step="bench"))

        own, full = per_call_us(reuse, calls), per_call_us(fresh, calls)
        print(f"{label:34s} {own:8.2f} µs/call {full:11.2f} µs/call")


if __name__ == "__main__":
    main()
