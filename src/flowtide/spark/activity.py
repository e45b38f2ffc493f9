"""Spark work in flight, by step run: progress for the display, cancellation, job ids.

Every spark step run registers a `SparkRun` under a tag unique to it. In classic mode
the tag is the thread's Spark job group, so the status tracker lists the run's jobs and
`cancelJobGroup` stops them; with Spark Connect it is an operation tag (`addTag`,
`interruptTag`) and progress arrives through the session's progress handler, which the
client calls on the thread that started the query.

A monitor thread (started with the first run) interrupts runs whose execution is being
cancelled (`ToolContext.cancelled`) or whose `timeout` has passed, and writes each run's
progress (its jobs' stages, at most once a second and only when it changed) and what the
driver logged meanwhile (classic mode: the JVM's log file) to the step's live log. `cancel_execution` and
`cancel_all` do the same at once, for the runtime's shutdown on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flowtide.logs import current_log

__all__ = [
    "TRACEPARENT_PROPERTY",
    "TRACEPARENT_TAG",
    "ItemsWatch",
    "PROGRESS_SECONDS",
    "SparkRun",
    "begin",
    "cancel_all",
    "cancel_execution",
    "end",
    "say",
    "snapshot",
]

_POLL_SECONDS = 0.2
_TELL_SECONDS = 1.0
#: Seconds between two reports of a spark loop's items (each is an event in its log).
PROGRESS_SECONDS = 2.0
_DRIVER_BYTES = 64 * 1024
_KEEP_LINES = 500
_SNAPSHOT_TTL = 0.25


@dataclass
class SparkRun:
    tag: str
    execution_id: int
    step: str
    session: Any  # the run's child session
    connect: bool
    cancelled: Callable[[], bool] | None = None
    deadline: float | None = None  # time.monotonic() after which the run is interrupted
    started: float = field(default_factory=time.monotonic)
    reason: str | None = None  # "cancelled" | "timeout" once interrupted
    #: Called as the run is interrupted, before its jobs are cancelled (a spark loop
    #: tells its python workers to start no more items: `flowtide.spark.loop`).
    on_interrupt: Callable[[], None] | None = None
    # Spark Connect: what the progress handler reported.
    operations: list[str] = field(default_factory=list)
    stages: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> (done, total)
    stages_done: set[int] = field(default_factory=set)
    inflight: int = 0
    #: The W3C traceparent of the run's span (flowtide.tracing), handed to the driver.
    traceparent: str | None = None
    #: Classic mode: the driver JVM's log file, whose lines written during the run are
    #: copied to the step's log (the driver is the process's: with several spark steps
    #: of one execution running at once, each is shown what they logged meanwhile; while
    #: a step of another execution runs on it too, nothing is copied, only counted).
    driver_log: str | None = None
    #: Other executions whose spark steps ran on the same driver since the last copy.
    others: set[int] = field(default_factory=set)
    withheld: bool = False  # told once that lines were not copied
    #: Driver log lines written once the run was interrupted: the JVM's account of the
    #: cancel (a stack trace per task it killed), counted, not copied.
    after_stop: int = 0
    #: The command's live log (`flowtide.logs.current_log` of the step's thread).
    log: Any = None
    #: The call's printed output (`ToolContext.stdout`: kept in its event once it ended).
    stdout: list[str] | None = None
    kept: int = 0
    driver_offset: int = -1
    said: str = ""
    said_at: float = 0.0
    #: A spark loop's items while its job runs (`watch_items`).
    items: ItemsWatch | None = None


@dataclass
class ItemsWatch:
    """The items of a spark loop's job: what its partitions wrote they ran (`marks`: a
    local master, `flowtide.spark.loopmarks`), else counted a task at a time (`total`
    times the tasks done of its stage: the stage of `partitions` tasks, else the job's
    last); never less than it was. Told (`report`, the step's log) at most every
    `PROGRESS_SECONDS` and only when it grew."""

    total: int
    partitions: int | None
    report: Callable[[dict[str, Any]], None] | None
    marks: str | None = None
    started: float = field(default_factory=time.monotonic)
    done: int = 0
    told_at: float = 0.0


#: The classic driver's local property, and the prefix of the Connect operation tag, that
#: carry a run's traceparent to Spark (listeners and plugins on the driver may read it).
TRACEPARENT_PROPERTY = "flowtide.traceparent"
TRACEPARENT_TAG = "flowtide-traceparent-"

_lock = threading.Lock()
_runs: dict[str, SparkRun] = {}
_current = threading.local()
_monitor: threading.Thread | None = None
_cache: tuple[float, list[dict[str, Any]]] = (0.0, [])
#: One copy of a driver's log lines at a time (the monitor's and a run's last one).
_copying = threading.Lock()


def _sharing(run: SparkRun) -> list[SparkRun]:
    """The registered runs of other executions on `run`'s driver (under `_lock`)."""
    return [
        r
        for r in _runs.values()
        if r.driver_log == run.driver_log and r.execution_id != run.execution_id
    ]


def begin(run: SparkRun) -> None:
    """Register `run` and mark this thread's Spark work with its tag."""
    global _monitor
    if run.connect:
        run.session.addTag(run.tag)
        if run.traceparent:
            run.session.addTag(TRACEPARENT_TAG + run.traceparent)
        run.session.registerProgressHandler(_on_progress)
    else:
        sc = run.session.sparkContext
        sc.setJobGroup(run.tag, f"flowtide {run.execution_id} {run.step}", interruptOnCancel=True)
        if run.traceparent:
            sc.setLocalProperty(TRACEPARENT_PROPERTY, run.traceparent)
    _current.run = run
    run.log = current_log.get()
    run.said_at = run.started
    if run.driver_log:
        try:
            run.driver_offset = os.path.getsize(run.driver_log)
        except OSError:
            run.driver_log = None
    with _lock:
        if run.driver_log:
            for other in _sharing(run):
                other.others.add(run.execution_id)
                run.others.add(other.execution_id)
        _runs[run.tag] = run
        if _monitor is None or not _monitor.is_alive():
            _monitor = threading.Thread(target=_watch, name="flowtide-spark-monitor", daemon=True)
            _monitor.start()


def end(run: SparkRun) -> list[Any]:
    """Unregister `run`; returns its job ids (classic) or operation ids (Connect)."""
    global _cache
    _copy_driver_log(run)
    if run.after_stop:
        say(
            run,
            f"driver: {run.after_stop:,} lines logged as its jobs were stopped, not copied"
            f" (see {run.driver_log})",
        )
    with _lock:
        _runs.pop(run.tag, None)
        if run.driver_log:
            for other in _sharing(run):
                other.others.add(run.execution_id)  # its window saw this run's lines
        _cache = (0.0, [])  # the display must not show a finished run from the cache
    _current.run = None
    if run.connect:
        try:
            run.session.removeTag(run.tag)
            if run.traceparent:
                run.session.removeTag(TRACEPARENT_TAG + run.traceparent)
        except Exception:
            pass
        return list(dict.fromkeys(run.operations))
    try:
        sc = run.session.sparkContext
        jobs = sorted(int(j) for j in sc.statusTracker().getJobIdsForGroup(run.tag))
        sc.setLocalProperty("spark.jobGroup.id", None)
        if run.traceparent:
            sc.setLocalProperty(TRACEPARENT_PROPERTY, None)
        return jobs
    except Exception:
        return []


def _on_progress(*args: Any, **kwargs: Any) -> None:
    """Spark Connect progress handler: (stages, inflight_tasks, operation_id, done)."""
    run = getattr(_current, "run", None)
    if run is None:
        return
    stages = kwargs.get("stages", args[0] if args else [])
    inflight = kwargs.get("inflight_tasks", args[1] if len(args) > 1 else 0)
    operation = kwargs.get("operation_id", args[2] if len(args) > 2 else None)
    if operation and (not run.operations or run.operations[-1] != operation):
        run.operations.append(str(operation))
    run.inflight = int(inflight or 0)
    for stage in stages or []:
        sid = int(getattr(stage, "stage_id", -1))
        run.stages[sid] = (
            int(getattr(stage, "num_completed_tasks", 0)),
            int(getattr(stage, "num_tasks", 0)),
        )
        if getattr(stage, "done", False):
            run.stages_done.add(sid)


def interrupt(run: SparkRun, reason: str, why: str | None = None) -> None:
    """Stop the run's Spark jobs; the step then fails with kind `reason` (its log says
    so, and `why` when given)."""
    if run.reason is not None:
        return
    _copy_driver_log(run)  # what it logged before, copied as it was
    run.reason = reason
    say(run, f"{reason}: stopping its Spark jobs" + (f" ({why})" if why else ""))
    if run.on_interrupt is not None:
        with contextlib.suppress(Exception):
            run.on_interrupt()
    try:
        if run.connect:
            run.session.interruptTag(run.tag)
        else:
            run.session.sparkContext.cancelJobGroup(run.tag)
    except Exception:
        pass  # the session is going away anyway


def cancel_execution(execution_id: int, reason: str = "cancelled") -> int:
    """Interrupt every run of `execution_id`; returns how many were running."""
    with _lock:
        runs = [r for r in _runs.values() if r.execution_id == execution_id]
    for run in runs:
        interrupt(run, reason)
    return len(runs)


def cancel_all(reason: str = "cancelled") -> int:
    """Interrupt every run in the process (the runtime is shutting down)."""
    with _lock:
        runs = list(_runs.values())
    for run in runs:
        interrupt(run, reason, "the process running it is stopping")
    return len(runs)


def say(run: SparkRun | None, text: str) -> None:
    """Write a line of `[spark]` news to the step's live log and its output (the first
    `_KEEP_LINES` of them: the live log, a bounded ring, gets every one)."""
    if run is None:
        return
    line = f"[spark] {text}\n"
    if run.log is not None:
        with contextlib.suppress(Exception):  # a log that cannot be written stops no step
            run.log.write(line)
    if run.stdout is not None:
        with _lock:
            run.kept += 1
            if run.kept <= _KEEP_LINES:
                run.stdout.append(line)
            elif run.kept == _KEEP_LINES + 1:
                run.stdout.append("[spark] (more lines were written to the live log only)\n")


def _tell(run: SparkRun, now: float) -> None:
    """The run's progress, when it changed (at most every `_TELL_SECONDS`), and what the
    driver logged since the last look."""
    if (run.log is None and run.stdout is None) or now - run.said_at < _TELL_SECONDS:
        return
    run.said_at = now
    d = _describe(run, now)
    if d["stages"]:
        stages = ", ".join(f"stage {s['id']} {s['done']}/{s['total']}" for s in d["stages"])
        jobs = f"job {', '.join(map(str, d['jobs']))}: " if d["jobs"] else ""
        line = f"{jobs}{stages} tasks"
        if line != run.said:
            run.said = line
            say(run, f"{line} ({d['seconds']:.0f} s)")
    _copy_driver_log(run)


def _count_items(run: SparkRun, now: float) -> None:
    """Tell how many of a spark loop's items are done (`ItemsWatch`), when it grew."""
    watch = run.items
    if watch is None or now - watch.told_at < PROGRESS_SECONDS:
        return
    done = 0
    stages = _describe(run, now)["stages"]
    ours = [s for s in stages if watch.partitions and s["total"] == watch.partitions] or stages
    if ours:
        stage = max(ours, key=lambda s: s["id"])
        done = watch.total * stage["done"] // max(stage["total"], 1)
    if watch.marks is not None:
        from flowtide.spark.loopmarks import read_done

        done = max(done, min(read_done(watch.marks) or 0, watch.total))
    if done <= watch.done:
        return
    watch.done, watch.told_at = done, now
    rate = done / max(now - watch.started, 1e-3)
    say(run, f"items {done:,}/{watch.total:,} ({rate:,.0f}/s)")
    if watch.report is not None:
        watch.report({"done": done, "total": watch.total, "per_second": rate})


def _copy_driver_log(run: SparkRun) -> None:
    """Copy the driver's log lines written since the last copy (whole lines, at most
    `_DRIVER_BYTES` a time: the rest is counted, not copied) to the run's log; none
    when a spark step of another execution ran on the driver meanwhile (its lines
    may hold that execution's data or secrets, which this one's log does not mask),
    nor once the run was interrupted (counted: the JVM's stack traces of the tasks it
    killed would bury the step's log)."""
    if not run.driver_log or run.driver_offset < 0:
        return
    with _copying:
        _copy_locked(run, run.driver_log)


def _copy_locked(run: SparkRun, path: str) -> None:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size <= run.driver_offset:
                return
            skipped = max(0, size - run.driver_offset - _DRIVER_BYTES)
            f.seek(run.driver_offset + skipped)
            data = f.read(_DRIVER_BYTES)
    except OSError:
        return
    whole = data[: data.rfind(b"\n") + 1]
    if not whole:
        return
    run.driver_offset += skipped + len(whole)
    with _lock:
        shared = bool(run.others)
        run.others = {r.execution_id for r in _sharing(run)}
    if shared:
        if not run.withheld:
            run.withheld = True
            say(run, "driver: log lines not copied while spark steps of other executions run")
        return
    lines = whole.decode("utf-8", "replace").splitlines()
    if run.reason is not None:
        run.after_stop += len(lines)
        return
    if skipped:
        say(run, f"driver: {skipped} bytes of its log skipped (see {run.driver_log})")
    for line in lines:
        say(run, f"driver: {line}")


def _watch() -> None:
    while True:
        time.sleep(_POLL_SECONDS)
        now = time.monotonic()
        with _lock:
            runs = list(_runs.values())
        for run in runs:
            with contextlib.suppress(Exception):
                _tell(run, now)
            with contextlib.suppress(Exception):
                _count_items(run, now)
            if run.reason is not None:
                continue
            try:
                if run.cancelled is not None and run.cancelled():
                    interrupt(run, "cancelled")
                elif run.deadline is not None and now >= run.deadline:
                    interrupt(run, "timeout")
            except Exception:
                continue


def snapshot() -> list[dict[str, Any]]:
    """Runs in flight with their active stages: `[{execution_id, step, seconds, jobs,
    stages: [{id, done, total}], tasks_done, tasks_total}]`. Cached for a quarter second:
    the display calls it several times a second and classic mode asks the JVM."""
    global _cache
    now = time.monotonic()
    if now - _cache[0] < _SNAPSHOT_TTL:
        return _cache[1]
    with _lock:
        runs = list(_runs.values())
    out = [_describe(run, now) for run in runs]
    _cache = (now, out)
    return out


def _describe(run: SparkRun, now: float) -> dict[str, Any]:
    stages: list[dict[str, int]] = []
    jobs: list[int] = []
    if run.connect:
        for sid, (done, total) in sorted(run.stages.items()):
            if sid not in run.stages_done:
                stages.append({"id": sid, "done": done, "total": total})
    else:
        try:
            tracker = run.session.sparkContext.statusTracker()
            for job_id in tracker.getJobIdsForGroup(run.tag):
                info = tracker.getJobInfo(job_id)
                if info is None or info.status != "RUNNING":
                    continue
                jobs.append(int(job_id))
                for sid in info.stageIds:
                    stage = tracker.getStageInfo(sid)
                    if stage is None or stage.numTasks == stage.numCompletedTasks:
                        continue
                    stages.append(
                        {"id": int(sid), "done": stage.numCompletedTasks, "total": stage.numTasks}
                    )
        except Exception:
            pass  # the JVM is busy stopping: show what we have
    return {
        "execution_id": run.execution_id,
        "step": run.step,
        "seconds": round(now - run.started, 1),
        "jobs": sorted(jobs),
        "stages": stages,
        "tasks_done": sum(s["done"] for s in stages),
        "tasks_total": sum(s["total"] for s in stages),
    }
