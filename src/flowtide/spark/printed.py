"""What a spark loop's items print (`print`, writes to sys.stdout or sys.stderr), shown
in the step's log as `[spark] item N: ...` lines, bounded however many items print.

In a python worker each partition keeps the first `PARTITION_LINES` lines its items
printed (`PartitionOutput`: each line masked with the secrets the item's tools touched,
then cut at `LINE_CHARS` characters) and counts the rest; as the partition ends it adds
them to the loop's accumulator (classic Spark: an accumulator's updates reach the driver
as each task ends, whatever the master). The driver (`LoopOutput`) writes them to the
step's log as they arrive, at most `LOOP_LINES` lines and `LOOP_BYTES` bytes for the
loop, and at the end a line saying how many lines were left out. Those lines are masked
as every `[spark]` line is (the execution's secrets, in the live log and on display).

With Spark Connect there is no accumulator: the items' output is not collected (a line
of the step's log says so when the job starts).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from typing import Any

from flowtide.redaction import mask_text

__all__ = [
    "LINE_CHARS",
    "LOOP_BYTES",
    "LOOP_LINES",
    "PARTITION_LINES",
    "LoopOutput",
    "PartitionOutput",
]

#: Lines of output kept by each partition (the first its items printed).
PARTITION_LINES = 20
#: Lines and bytes of output the loop's log shows, at most.
LOOP_LINES = 200
LOOP_BYTES = 64 * 1024
#: Characters of one printed line shown, at most (the rest is cut, marked `…`).
LINE_CHARS = 500


class PartitionOutput:
    """What the items of one partition printed: the first `PARTITION_LINES` lines, as
    `(index, text)`, and how many more there were (`left`)."""

    __slots__ = ("lines", "left")

    def __init__(self) -> None:
        self.lines: list[tuple[int, str]] = []
        self.left = 0

    def add(self, index: int, text: str, secrets: Collection[str]) -> None:
        """The output `text` of item `index`, whose tools touched `secrets`."""
        room = PARTITION_LINES - len(self.lines)
        if room <= 0:
            self.left += text.count("\n") + (not text.endswith("\n"))
            return
        if secrets:
            text = mask_text(text, frozenset(secrets))  # before a cut could split one
        lines = text.splitlines()
        for line in lines[:room]:
            cut = line if len(line) <= LINE_CHARS else line[: LINE_CHARS - 1] + "…"
            self.lines.append((index, cut))
        self.left += max(0, len(lines) - room)

    def report(self, partition: int) -> dict[str, Any] | None:
        """What the driver is sent (None when nothing was printed)."""
        if not self.lines and not self.left:
            return None
        return {"partition": partition, "lines": self.lines, "left": self.left}


class _Param:
    """The loop's accumulator, as Spark calls it (`AccumulatorParam`): in a python
    worker its value is a list of the partition's reports; on the driver it is the
    loop's `LoopOutput`, which takes each report as it arrives (its bounds hold: the
    driver keeps no more than it shows)."""

    def zero(self, value: Any) -> list[Any]:
        return []

    def addInPlace(self, value1: Any, value2: list[Any]) -> Any:  # noqa: N802 - Spark's API
        if isinstance(value1, LoopOutput):
            value1.take(value2)
        else:
            value1.extend(value2)
        return value1


class LoopOutput:
    """The driver's side: the partitions' reports, as they arrive (`take`), told
    through `say` (one `[spark]` line each) within the loop's bounds."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.partitions: set[int] = set()
        self.lines = 0
        self.bytes = 0
        self.left = 0
        self.closed = False
        self.lock = threading.Lock()

    def accumulator(self, spark: Any) -> Any:
        """A new accumulator of partitions' reports on the classic session `spark`, whose
        value on the driver is this; None with Spark Connect (it has none)."""
        try:
            context = spark.sparkContext
        except Exception:  # noqa: BLE001 - Spark Connect has no SparkContext
            return None
        return context.accumulator(self, _Param())

    def take(self, reports: list[dict[str, Any]]) -> None:
        """Tell the partitions' `reports` (a partition's once: a task Spark ran again
        reports again)."""
        with self.lock:
            if self.closed:
                return  # a task of the job that ended late: its log is complete
            for report in reports:
                if report["partition"] in self.partitions:
                    continue
                self.partitions.add(report["partition"])
                self.left += int(report["left"])
                for index, text in report["lines"]:
                    line = f"item {index}: {text}"
                    size = len(line.encode("utf-8", "replace")) + 1
                    if self.lines >= LOOP_LINES or self.bytes + size > LOOP_BYTES:
                        self.left += 1
                        continue
                    self.lines += 1
                    self.bytes += size
                    self.say(line)

    def finish(self) -> None:
        """Tell how many printed lines were not shown, if any; take no more reports
        (Spark's registry keeps the accumulator, and this with it, for the process's
        life: what it holds goes now)."""
        with self.lock:
            left, self.left = self.left, 0
            self.closed = True
            self.partitions = set()
            say, self.say = self.say, _nothing
        if left:
            say(
                f"items printed {left:,} more line{'s' if left != 1 else ''}, not shown (the"
                f" first {PARTITION_LINES} of each partition are kept, at most {LOOP_LINES}"
                f" lines and {LOOP_BYTES // 1024} KiB for the loop)"
            )


def _nothing(line: str) -> None:
    pass
