"""What a spark loop's items print, kept by a partition and told by the driver
(`flowtide.spark.printed`): pure logic, the bounds and the masking."""

from __future__ import annotations

from flowtide.spark.printed import (
    LINE_CHARS,
    LOOP_BYTES,
    PARTITION_LINES,
    LoopOutput,
    PartitionOutput,
    _Param,
)


def test_a_partition_keeps_its_first_lines_masked_and_cut_and_counts_the_rest() -> None:
    out = PartitionOutput()
    assert out.report(3) is None  # nothing printed: nothing sent
    out.add(7, "pw=hunter2-long-secret\n" + "x" * (LINE_CHARS + 10) + "\n", {"hunter2-long-secret"})
    for i in range(30):
        out.add(8 + i, f"line {i}\nmore {i}", set())
    report = out.report(3)
    assert report is not None and report["partition"] == 3
    lines = report["lines"]
    assert len(lines) == PARTITION_LINES
    assert lines[0] == (7, "pw=***")
    assert lines[1][1] == "x" * (LINE_CHARS - 1) + "…"
    assert lines[2:4] == [(8, "line 0"), (8, "more 0")]
    assert report["left"] == 2 + 30 * 2 - PARTITION_LINES


def test_the_driver_shows_each_partition_once_within_the_loops_bounds() -> None:
    said: list[str] = []
    loop = LoopOutput(said.append)
    param = _Param()
    worker = param.zero(None)
    report = {"partition": 0, "lines": [(0, "a"), (1, "b")], "left": 5}
    assert param.addInPlace(worker, [report]) == [report]
    assert param.addInPlace(loop, [report, report]) is loop  # a task run again: once
    assert said == ["item 0: a", "item 1: b"]
    big = "y" * 1000
    many = [{"partition": p, "lines": [(p, big)] * 20, "left": 0} for p in range(1, 12)]
    loop.take(many)
    shown = said[2:]
    assert sum(len(s) + 1 for s in said) <= LOOP_BYTES
    assert len(shown) == (LOOP_BYTES - 2 * len("item 0: a\n")) // len(f"item 1: {big}\n")
    loop.finish()
    left = 5 + 11 * 20 - len(shown)
    assert said[-1].startswith(f"items printed {left:,} more lines, not shown")
    loop.take([{"partition": 99, "lines": [(9, "late")], "left": 0}])  # after the end
    assert "item 9: late" not in said
