"""An execution's timeline for the UI's Gantt chart: each step's runs, and its commands
one by one while there are few of them, or as a density lane (commands ended per time
bucket) when there are many, so a 100,000-iteration loop is a few hundred numbers.

Built from the log without reading it whole: the steps' enter and exit events, the
commands of the small steps, and only (step, type, time) of the big steps' outcomes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Final

from typing_extensions import TypedDict

from flowtide.engine import events as ev
from flowtide.engine.events import Event, payload_of
from flowtide.engine.reported import reported_count, reported_duration
from flowtide.playbook.model import Playbook
from flowtide.store.base import INTERRUPTED, Store

__all__ = [
    "COMMANDS_SHOWN",
    "MAX_BUCKETS",
    "CommandBar",
    "Density",
    "RunBar",
    "TimelineDocument",
    "Try",
    "TimelineStep",
    "execution_timeline",
]

#: A step with more commands than this gets a density lane instead of one bar each.
COMMANDS_SHOWN: Final = 300
#: The most buckets a density lane may be asked for.
MAX_BUCKETS: Final = 1000

_RUN_TYPES: Final = (ev.STEP_ENTER, ev.STEP_EXIT)
_COMMAND_TYPES: Final = (
    ev.COMMAND_ISSUED,
    ev.COMMAND_STARTED,
    ev.COMMAND_COMPLETED,
    ev.COMMAND_FAILED,
)
_ENDED: Final = (ev.COMMAND_COMPLETED, ev.COMMAND_FAILED)
_CALLS: Final = (ev.CALL_DONE, ev.CALL_ERROR)
_STOPPED: Final = ("completed", "failed", "cancelled", INTERRUPTED)


class RunBar(TypedDict):
    """One run of a step: from its `step.enter` to its `step.exit`."""

    started: float
    ended: float | None
    status: str


class Try(TypedDict):
    """One call of one of a command's tasks (a `call.done`/`call.error`): a retry when
    its attempt is above 1; the gap before it is the retry's backoff."""

    task: str | None
    attempt: int
    started: float
    ended: float
    #: completed or failed.
    status: str


class CommandBar(TypedDict):
    """One attempt of a command: issued, started, ended."""

    command_id: str
    attempt: int
    loop_index: int | None
    issued: float
    started: float | None
    ended: float | None
    #: issued, running, completed, failed; cancelled or interrupted when its execution
    #: ended or stopped while it ran.
    status: str
    #: Its task calls in order (retries among them).
    tries: list[Try]


class Density(TypedDict):
    """A big step's commands ended per time bucket of `width` seconds."""

    width: float
    completed: list[int]
    failed: list[int]


class TimelineStep(TypedDict):
    step: str
    runs: list[RunBar]
    #: One bar per command while the step has at most `COMMANDS_SHOWN`, else null.
    commands: list[CommandBar] | None
    #: The density lane of a step with more commands, else null.
    density: Density | None
    total_commands: int


class TimelineDocument(TypedDict):
    execution_id: str
    status: str
    start: float
    #: Now while the execution runs.
    end: float
    steps: list[TimelineStep]


def execution_timeline(
    store: Store, playbook: Playbook, execution_id: int, status: str, buckets: int = 120
) -> TimelineDocument:
    """`start` and `end` (event times; `end` is now while the execution runs), and per
    step of `playbook` (in its order) its `runs`, and either its `commands` (at most
    `COMMANDS_SHOWN`, each with its task calls: `tries`) or its `density` over `buckets`
    buckets, with `total_commands`. An `interrupted` execution (no process runs it any
    more) ends at its last event, and what it was running is `interrupted` there."""
    buckets = max(1, min(buckets, MAX_BUCKETS))
    span = store.event_span(execution_id)
    running = status not in _STOPPED
    closed = INTERRUPTED if status == INTERRUPTED else "cancelled"
    start, end = span if span is not None else (time.time(), time.time())
    if running:
        end = max(end, time.time())
    runs: dict[str, list[RunBar]] = {name: [] for name in playbook.steps}
    for e in store.events(execution_id, types=_RUN_TYPES):
        lane = runs.get(e.step or "")
        if lane is None:
            continue
        if e.type == ev.STEP_ENTER:
            lane.append({"started": e.time, "ended": None, "status": "running"})
        elif lane and lane[-1]["ended"] is None:
            lane[-1]["ended"] = e.time
            lane[-1]["status"] = e.status or "completed"
        else:  # exited without entering (not admitted)
            lane.append({"started": e.time, "ended": e.time, "status": e.status or "skipped"})
    if not running:
        # What was still going when the execution ended ended with it (one truth per run).
        for lane in runs.values():
            for bar in lane:
                if bar["ended"] is None:
                    bar["ended"], bar["status"] = end, closed
    # Bars per step: one per command, or per iteration of a chunk of loop iterations.
    issued: dict[str, int] = dict.fromkeys(playbook.steps, 0)
    for e in store.events(execution_id, types=(ev.COMMAND_ISSUED,)):
        if e.step in issued and not payload_of(e, ev.COMMAND_ISSUED).get("reissued"):
            issued[e.step or ""] += int(payload_of(e, ev.COMMAND_ISSUED).get("loop_count") or 1)
    small = [s for s, n in issued.items() if 0 < n <= COMMANDS_SHOWN]
    big = [s for s, n in issued.items() if n > COMMANDS_SHOWN]
    commands = _commands(store, execution_id, small) if small else {}
    if not running:
        for bars in commands.values():
            for command in bars:
                if command["ended"] is None:
                    command["ended"], command["status"] = end, closed
    width = max(end - start, 1e-3) / buckets
    density = _density(store, execution_id, big, start, width, buckets) if big else {}
    return {
        "execution_id": str(execution_id),
        "status": status,
        "start": start,
        "end": end,
        "steps": [
            {
                "step": name,
                "runs": runs[name],
                "commands": commands.get(name, []) if issued[name] <= COMMANDS_SHOWN else None,
                "density": density.get(name),
                "total_commands": issued[name],
            }
            for name in playbook.steps
        ],
    }


@dataclass
class _Chunk:
    """A command of several loop iterations while its events are read: each iteration
    becomes a bar of its own, from its first call (or the end of the one before) to its
    `command.completed`; the one it runs (or waits to run) when the events end is a bar
    without an end."""

    step: str
    attempt: int
    issued: float
    #: Its iterations not ended yet (kept when it is issued again).
    left: set[int]
    since: float | None = None
    tries: list[Try] = field(default_factory=list)
    #: An iteration broke or failed the loop: it runs no more of them.
    stopped: bool = False


def _try(e: Event) -> Try:
    call = payload_of(e, ev.CALL_DONE)
    # A worker's word: any JSON value (10**400 too).
    ms = reported_duration(call.get("duration_ms"))
    return {
        "task": call.get("task"),
        "attempt": max(1, reported_count(call.get("attempt"))),
        "started": e.time,
        "ended": e.time + (ms or 0.0) / 1000,
        "status": "completed" if e.type == ev.CALL_DONE else "failed",
    }


def _commands(store: Store, execution_id: int, steps: list[str]) -> dict[str, list[CommandBar]]:
    """Each command of `steps` with its issue, start and end (the latest attempt's
    issue starts a new bar: a command issued again shows as one bar per attempt), and
    its task calls (`tries`: a task's retries, with the backoff between them). A chunk
    of loop iterations shows one bar per iteration."""
    bars: dict[int, CommandBar] = {}
    chunks: dict[int, _Chunk] = {}
    out: dict[str, list[CommandBar]] = {s: [] for s in steps}
    for e in store.events(execution_id, types=_COMMAND_TYPES + _CALLS, steps=steps):
        cid = e.command_id
        if cid is None:
            continue
        if e.type == ev.COMMAND_ISSUED:
            issued = payload_of(e, ev.COMMAND_ISSUED)
            count = int(issued.get("loop_count") or 1)
            if count > 1:
                first = int(issued.get("loop_index") or 0)
                before = chunks.get(cid)
                left = before.left if before is not None else set(range(first, first + count))
                chunks[cid] = _Chunk(e.step or "", int(issued.get("attempt") or 1), e.time, left)
                continue
            bar: CommandBar = {
                "command_id": str(cid),
                "attempt": int(issued.get("attempt") or 1),
                "loop_index": issued.get("loop_index"),
                "issued": e.time,
                "started": None,
                "ended": None,
                "status": "issued",
                "tries": [],
            }
            bars[cid] = bar
            out.setdefault(e.step or "", []).append(bar)
            continue
        chunk = chunks.get(cid)
        if chunk is not None:
            _chunk_event(chunk, cid, e, out)
            continue
        found = bars.get(cid)
        if found is None:
            continue
        if e.type in _CALLS:
            found["tries"].append(_try(e))
        elif e.type == ev.COMMAND_STARTED:
            found["started"], found["status"] = e.time, "running"
        elif found["ended"] is None:
            ok = (
                e.type == ev.COMMAND_COMPLETED
                and payload_of(e, ev.COMMAND_COMPLETED).get("status", "ok") == "ok"
            )
            found["ended"], found["status"] = e.time, "completed" if ok else "failed"
    for cid, chunk in chunks.items():
        if chunk.left and not chunk.stopped:
            out.setdefault(chunk.step, []).append(
                {
                    "command_id": str(cid),
                    "attempt": chunk.attempt,
                    "loop_index": min(chunk.left),
                    "issued": chunk.issued,
                    "started": chunk.since,
                    "ended": None,
                    "status": "issued" if chunk.since is None else "running",
                    "tries": chunk.tries,
                }
            )
    return out


def _chunk_event(chunk: _Chunk, cid: int, e: Event, out: dict[str, list[CommandBar]]) -> None:
    """One event of a chunk's command: an iteration's bar once its end is read."""
    if e.type in _CALLS:
        chunk.tries.append(_try(e))
    elif e.type == ev.COMMAND_STARTED:
        chunk.since = e.time
    else:
        done = payload_of(e, ev.COMMAND_COMPLETED)
        ok = e.type == ev.COMMAND_COMPLETED and done.get("status", "ok") == "ok"
        started = chunk.tries[0]["started"] if chunk.tries else chunk.since
        out.setdefault(chunk.step, []).append(
            {
                "command_id": str(cid),
                "attempt": chunk.attempt,
                "loop_index": done.get("loop_index"),
                "issued": chunk.issued,
                "started": started,
                "ended": e.time,
                "status": "completed" if ok else "failed",
                "tries": chunk.tries,
            }
        )
        chunk.since, chunk.tries = e.time, []
        index = done.get("loop_index")
        if isinstance(index, int):
            chunk.left.discard(index)
        if done.get("action") in ("break", "fail"):
            chunk.stopped = True


def _density(
    store: Store, execution_id: int, steps: list[str], start: float, width: float, buckets: int
) -> dict[str, Density]:
    """Commands of `steps` ended per bucket of `width` seconds from `start`."""
    counts = {s: ([0] * buckets, [0] * buckets) for s in steps}
    for step, type_, status, at in store.event_times(execution_id, types=_ENDED, steps=steps):
        lane = counts.get(step or "")
        if lane is None:
            continue
        i = min(buckets - 1, max(0, int((at - start) / width)))
        ok = type_ == ev.COMMAND_COMPLETED and status in (None, "ok", "completed")
        lane[0 if ok else 1][i] += 1
    return {
        s: {"width": width, "completed": done, "failed": failed}
        for s, (done, failed) in counts.items()
    }
