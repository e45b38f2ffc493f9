"""Live progress of an embedded run on a terminal (rich), fed by the runtime's listener."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from flowtide.engine import events as ev
from flowtide.engine.events import Event
from flowtide.engine.state import ExecutionState

_STYLE = {
    "completed": "green",
    "failed": "red",
    "running": "yellow",
    "pending": "dim",
    "skipped": "dim",
}


def _items(items: Mapping[str, Any]) -> Any:
    """A spark loop's items: a bar, done/total and items per second."""
    total, done = int(items.get("total") or 0), int(items.get("done") or 0)
    failed = int(items.get("failed") or 0)
    rate = float(items.get("per_second") or 0.0)
    text = f" {done:,}/{total:,}" + (f" ({failed:,} failed)" if failed else "")
    if rate:
        text += f"  {rate:,.0f}/s"
    grid = Table.grid()
    grid.add_row(ProgressBar(total=total, completed=done, width=30), Text(text))
    return grid


class ProgressView:
    """Shows the steps of one execution (its children are summarised) while it runs."""

    def __init__(self, console: Console, title: str) -> None:
        self.console = console
        self.title = title
        self.execution_id: int | None = None
        self.started = time.monotonic()
        self._state: ExecutionState | None = None
        self._last_step_time: dict[str, float] = {}
        self._events = 0
        self._live = Live(
            console=console,
            refresh_per_second=8,
            transient=False,
            auto_refresh=True,
            get_renderable=self.render,
        )

    def __enter__(self) -> ProgressView:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._live.__exit__(*exc)

    def track(self, execution_id: int) -> None:
        self.execution_id = execution_id

    def on_events(self, events: list[Event], states: Mapping[int, ExecutionState]) -> None:
        self._events += len(events)
        if self.execution_id is not None:
            self._state = states.get(self.execution_id)
        now = time.monotonic()
        for event in events:
            if event.type == ev.STEP_ENTER and event.step:
                self._last_step_time[event.step] = now

    def render(self) -> Any:
        state = self._state
        elapsed = time.monotonic() - self.started
        header = Text.assemble(
            (self.title, "bold"), f"  {elapsed:5.1f}s  ", (f"{self._events} events", "dim")
        )
        if state is None:
            return header
        table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        table.add_column("step")
        table.add_column("status")
        table.add_column("runs", justify="right")
        table.add_column("progress")
        for name, rec in state.steps.items():
            if rec.runs == 0:
                continue
            progress: Any = ""
            loop = state.loop_of(name)
            if loop is not None and loop.size:
                bar = ProgressBar(total=loop.size, completed=loop.completed, width=30)
                label = Text(
                    f" {loop.completed}/{loop.size}"
                    + (f" ({loop.failed} failed)" if loop.failed else "")
                )
                grid = Table.grid()
                grid.add_row(bar, label)
                progress = grid
            elif rec.items is not None and rec.items.get("total"):
                progress = _items(rec.items)
            table.add_row(
                name, Text(rec.status, style=_STYLE.get(rec.status, "")), str(rec.runs), progress
            )
        spark = self._spark(state)
        return Group(header, table, spark) if spark is not None else Group(header, table)

    @staticmethod
    def _spark(state: ExecutionState) -> Any:
        """Spark jobs of this execution's running steps: stages and tasks done/total."""
        activity = sys.modules.get("flowtide.spark.activity")
        if activity is None:  # no spark step ran: never import pyspark for the display
            return None
        runs = [r for r in activity.snapshot() if r["execution_id"] == state.execution_id]
        if not runs:
            return None
        table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        table.add_column("spark step")
        table.add_column("jobs")
        table.add_column("stages")
        table.add_column("tasks")
        for run in runs:
            stages = ", ".join(f"{s['id']} ({s['done']}/{s['total']})" for s in run["stages"])
            grid = Table.grid()
            if run["tasks_total"]:
                grid.add_row(
                    ProgressBar(total=run["tasks_total"], completed=run["tasks_done"], width=20),
                    Text(f" {run['tasks_done']}/{run['tasks_total']}"),
                )
            table.add_row(
                f"{run['step']} ({run['seconds']:.0f}s)",
                ", ".join(map(str, run["jobs"])) or "-",
                stages or "-",
                grid,
            )
        session = sys.modules.get("flowtide.spark.session")
        info = getattr(getattr(session, "sessions", None), "info", None)
        if info is not None and info.ui_url:
            return Group(table, Text(f"Spark UI {info.ui_url}", style="dim"))
        return table
