"""Typed playbook model: what the loader produces and the engine reads.

Values are frozen dataclasses. Tool configuration stays an open mapping (each kind has
its own fields, and real playbooks carry many optional ones); the loader checks them
against the kind's `ToolSpec`. Which kinds exist (built in, or from plugins) is
`flowtide.tools.kinds.known_kinds()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowtide.playbook.notify import NotifyTarget

ACTIONS = ("continue", "retry", "jump", "break", "fail")


@dataclass(frozen=True)
class Rule:
    """One policy rule: `when` (template or bool; None for `else`) -> `then` action."""

    when: Any
    is_else: bool
    do: str = "continue"
    attempts: int = 3
    backoff: str = "fixed"
    delay: float = 0.0
    max_delay: float = 60.0
    to: str | None = None
    set: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Policy:
    rules: tuple[Rule, ...] = ()


@dataclass(frozen=True)
class Task:
    """One tool call. A step's `tool` is one task, or a list of named tasks run in order."""

    name: str
    kind: str
    config: dict[str, Any]
    input: dict[str, Any] | None = None
    set: dict[str, Any] = field(default_factory=dict)
    policy: Policy | None = None
    line: int | None = None


@dataclass(frozen=True)
class Arc:
    step: str
    when: Any = None  # None: always
    set: dict[str, Any] = field(default_factory=dict)
    line: int | None = None


@dataclass(frozen=True)
class Next:
    mode: str = "exclusive"  # exclusive: first matching arc; inclusive: every match
    arcs: tuple[Arc, ...] = ()


@dataclass(frozen=True)
class Loop:
    collection: Any  # template or literal list (None for a cursor loop)
    iterator: str
    mode: str = "sequential"  # sequential | parallel | cursor | spark
    max_in_flight: Any = None  # int, template, or None (default by mode)
    # `mode: cursor`: the claim query, run as a task (config holds `claim`, `auth`, ...);
    # each claim takes up to `frame_max_rows` rows, and each row (`frame_process: row`)
    # or each claimed batch (`frame`) becomes one iteration.
    cursor: Task | None = None
    frame_max_rows: int = 1
    frame_process: str = "row"  # row | frame
    # `mode: spark`: the items run as Spark tasks (flowtide.spark.loop), split into
    # `partitions` (None: Spark's parallelism); `results_max`: up to this many items the
    # result also holds `results`; `rate`: items started per second across the job
    # (number, template, or None: as fast as they run).
    partitions: int | None = None
    results_max: int = 10_000
    rate: Any = None
    # `spec.batch`: iterations per command, a chunk (None: sized from the iterations'
    # observed durations, flowtide.engine.chunks; 1: one command per iteration).
    batch: int | None = None


@dataclass(frozen=True)
class Step:
    name: str
    tasks: tuple[Task, ...] = ()
    pipeline: bool = False  # `tool` was written as a list of tasks
    loop: Loop | None = None
    set: dict[str, Any] = field(default_factory=dict)
    next: Next = field(default_factory=Next)
    desc: str | None = None
    line: int | None = None
    # `spec.policy.admit` rules: (when, allow) pairs, `when` None for `else`. A step
    # whose first matching rule says allow: false is skipped (its branch ends).
    admit: tuple[tuple[Any, bool], ...] = ()
    # `output:` (NoETL): `output_select`, `store: {kind}`, `inline_max_bytes`: which
    # results are stored by reference and what stays beside the reference
    # (flowtide.artifacts).
    output: dict[str, Any] | list[Any] | None = None


@dataclass(frozen=True)
class Playbook:
    name: str
    path: str | None
    version: str | None
    workload: dict[str, Any]
    steps: dict[str, Step]
    entry: str
    workbook: dict[str, Task]
    text: str
    file: str | None = None
    keychain: list[Any] = field(default_factory=list)
    executor: dict[str, Any] = field(default_factory=dict)
    # step -> the steps that have an arc into it
    upstreams: dict[str, frozenset[str]] = field(default_factory=dict)
    # step -> every step reachable from it by arcs (not including itself unless on a cycle)
    reachable: dict[str, frozenset[str]] = field(default_factory=dict)
    # `notify:` (flowtide.playbook.notify): who is told of the run's transitions.
    notify: tuple[NotifyTarget, ...] = ()
    # `timeout:` (seconds): past it the run fails with error kind `deadline_exceeded`.
    timeout: float | None = None
    # `sla:` (seconds): past it a run still going records `deadline_missed` (kind sla).
    sla: float | None = None
    # Keys accepted but not acted on, and other loader warnings (never stop a run):
    # `flowtide.errors.PlaybookError`s, shown by `validate` and `run`.
    warnings: tuple[Any, ...] = ()

    @property
    def base_dir(self) -> Path:
        return Path(self.file).resolve().parent if self.file else Path.cwd()
