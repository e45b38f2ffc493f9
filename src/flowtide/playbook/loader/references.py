"""The names a playbook's templates refer to, checked once every step is known.

A template's root names (`strat` in `{{ strat.x }}`) must be something a render context
can hold: a step, a task of a pipeline, a workload key, a loop's iterator, a name a `set`
or an `input` writes, or a name the runtime itself offers (`RUNTIME_NAMES`). An unknown
one is an error with "did you mean"; so is `workload.NAME` for a key the workload does
not declare. The check is by name, not by place (a name some step offers is accepted in
every template), and it skips what cannot be known statically: a name tested with
`is defined` or given a `| default(...)` is the author's own guard, and an attribute of
anything but `workload` (a step's result, `ctx`) is data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from jinja2 import TemplateSyntaxError, meta, nodes

from flowtide.playbook.model import Step, Task
from flowtide.playbook.source import Path as NodePath
from flowtide.playbook.template import ENV
from flowtide.tools.spec import did_you_mean

__all__ = ["RUNTIME_NAMES", "Reference", "known_iter_keys", "scan", "suggest", "unknown"]

#: Names the runtime puts in render contexts (`flowtide.engine.context.base_context`,
#: `iteration_scope`, `flowtide.engine.start.render_workload`, the step exit and policy
#: scopes of `flowtide.engine.decide` and `flowtide.runtime.rendering`), each where it
#: applies; NoETL's render contexts offer the same (`execution_id`, `job`, `workload`,
#: `ctx`/`vars`, `iter`, `loop`, `output`/`result`/`response` and `error` after a call,
#: `event` on arcs: `ExecutionState.get_render_context` in noetl/noetl
#: `noetl/core/dsl/engine/executor/state.py`; `_task`, `_attempt`, `results`, `_prev` in
#: a pipeline: `TaskSequenceContext` in `noetl/worker/task_sequence_executor.py`).
RUNTIME_NAMES: Mapping[str, str] = {
    "execution_id": "the execution's id (digits)",
    "job": "`uuid`, `execution_id`, `id`: the execution's id",
    "env": "the environment variables the runtime shows templates",
    "workload": "the workload, overrides applied",
    "payload": "in workload templates: the overrides",
    "input": "in workload templates: the overrides; in a tool: its input",
    "ctx": "the execution's variables (`set: {ctx.x: ...}`)",
    "vars": "another name of `ctx`",
    "iter": "in a loop: the element, `iter._index`, `iter._first`, `iter._last` and "
    "`iter.<name>` values",
    "loop": "in a loop: `{index, first, length, done}`; on a loop step's arcs: as it ended",
    "loop_index": "in a loop: the iteration's index",
    "_index": "in a loop: the iteration's index",
    "output": "after a call: its envelope `{status, data, error, meta}`",
    "result": "after a call: its result",
    "response": "after a call: its result",
    "error": "after a failed call: its error (`output.error`)",
    "event": "on arcs, in policies and `set`: `{name, step}` of the outcome",
    "_prev": "in a pipeline: the last successful result",
    "_task": "in a pipeline: the task's own name",
    "_attempt": "in a pipeline: the task's attempt (1 the first)",
    "results": "in a pipeline: the results of the tasks before, by name",
    "__frame_max_rows": "in a cursor claim: the frame's max_rows",
}


_MAPPING_METHODS = frozenset({"get", "items", "keys", "values"})


@dataclass(frozen=True)
class Reference:
    """A template to check: where it is and what it says."""

    path: NodePath
    step: str | None
    field: str
    source: str


def _root(node: nodes.Node | None) -> nodes.Name | None:
    while isinstance(node, nodes.Getattr | nodes.Getitem | nodes.Filter | nodes.Test):
        node = node.node
    return node if isinstance(node, nodes.Name) else None


def _keys_of(tree: nodes.Template, root: str) -> list[tuple[str, int]]:
    """The constant keys `tree` reads of the name `root` (`root.key`, `root['key']`)."""
    keys: list[tuple[str, int]] = []
    for attr in tree.find_all(nodes.Getattr):
        if (
            isinstance(attr.node, nodes.Name)
            and attr.node.name == root
            and attr.attr not in _MAPPING_METHODS
        ):
            keys.append((attr.attr, attr.lineno))
    for item in tree.find_all(nodes.Getitem):
        if (
            isinstance(item.node, nodes.Name)
            and item.node.name == root
            and isinstance(item.arg, nodes.Const)
            and isinstance(item.arg.value, str)
        ):
            keys.append((item.arg.value, item.lineno))
    return keys


def iter_keys(source: str) -> list[tuple[str, int]]:
    """The `iter.<key>` reads of `source` with their line, unless `iter` is guarded (or
    `source` does not parse)."""
    try:
        tree = ENV.parse(source)
    except (TemplateSyntaxError, RecursionError):
        return []
    guarded, free, _ = scan(source)
    if "iter" in guarded or "iter" not in {name for name, _ in free}:
        return []
    return _keys_of(tree, "iter")


def scan(source: str) -> tuple[set[str], list[tuple[str, int]], list[tuple[str, int]]]:
    """The names `source` reads without defining them and does not guard, as (guarded,
    free names with their line, `workload.<key>` reads with their line); empty when it
    does not parse (its syntax error is reported elsewhere)."""
    try:
        tree = ENV.parse(source)
    except (TemplateSyntaxError, RecursionError):
        return set(), [], []
    free = meta.find_undeclared_variables(tree)
    guarded: set[str] = set()
    for test in tree.find_all(nodes.Test):
        if test.name in ("defined", "undefined"):
            root = _root(test.node)
            if root is not None:
                guarded.add(root.name)
    for flt in tree.find_all(nodes.Filter):
        if flt.name in ("default", "d") and flt.node is not None:
            root = _root(flt.node)
            if root is not None:
                guarded.add(root.name)
    names: list[tuple[str, int]] = []
    seen: set[str] = set()
    for name in tree.find_all(nodes.Name):
        if name.ctx == "load" and name.name in free and name.name not in guarded:
            if name.name not in seen:
                seen.add(name.name)
                names.append((name.name, name.lineno))
    keys: list[tuple[str, int]] = []
    if "workload" in free and "workload" not in guarded:
        keys = _keys_of(tree, "workload")
    return guarded, names, keys


def _edits(a: str, b: str, limit: int) -> int:
    """Edits from `a` to `b`: insertions, deletions, substitutions and swaps of two
    neighbours (a swap is the commonest typo: `itme`, `strat`); `limit + 1` as soon as
    it is sure to be over `limit`."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        if min(cur) > limit and min(prev) > limit:  # and so every row after them
            return limit + 1
        prev2, prev = prev, cur
    return prev[len(b)]


#: Names a misspelt one is compared with, at most (those closest in length), and
#: unknown names of one playbook given a suggestion, at most: a playbook of thousands of
#: steps each reading an unknown name took hours to check.
MAX_CANDIDATES = 200
MAX_SUGGESTED = 20


def suggest(name: str, choices: Iterable[str]) -> str:
    """ "; did you mean 'x'?" for the choice fewest edits away (at most 2), else the
    closest by `did_you_mean`, or ""."""
    candidates = sorted(set(choices), key=lambda c: (abs(len(c) - len(name)), c))
    candidates = sorted(candidates[:MAX_CANDIDATES])
    limit = min(2, len(name) // 2)
    near = [(d, c) for c in candidates if (d := _edits(name, c, limit)) <= limit]
    if near:
        return f"; did you mean '{min(near)[1]}'?"
    return did_you_mean(name, candidates)


def _set_names(block: Mapping[str, Any]) -> Iterable[str]:
    for key in block:
        text = str(key)
        for prefix in ("ctx.", "vars.", "iter."):
            if text.startswith(prefix):
                text = text[len(prefix) :]
        yield text.split(".")[0]


def _task_names(task: Task) -> Iterable[str]:
    yield task.name
    yield from _set_names(task.set)
    yield from (task.input or {})
    for rule in task.policy.rules if task.policy else ():
        yield from _set_names(rule.set)


#: What `iter` holds besides the iterators and `set: {iter.x: ...}` names
#: (`flowtide.engine.context.iteration_scope`).
ITER_MARKS = ("index", "_index", "_first", "_last")


def known_iter_keys(steps: Mapping[str, Step], workbook: Mapping[str, Task]) -> set[str]:
    """Every key `iter` can hold in this playbook: each loop's iterator, the marks, and
    the names a `set` writes under `iter.`."""
    out = set(ITER_MARKS)
    blocks: list[Mapping[str, Any]] = []
    for step in steps.values():
        if step.loop is not None:
            out.add(step.loop.iterator)
        blocks.append(step.set)
        blocks.extend(arc.set for arc in step.next.arcs)
        for task in step.tasks:
            blocks.append(task.set)
            blocks.extend(rule.set for rule in (task.policy.rules if task.policy else ()))
    for task in workbook.values():
        blocks.append(task.set)
        blocks.extend(rule.set for rule in (task.policy.rules if task.policy else ()))
    for block in blocks:
        for key in block:
            if str(key).startswith("iter."):
                out.add(str(key)[len("iter.") :].split(".")[0])
    return out


def known_names(
    workload: Mapping[str, Any], steps: Mapping[str, Step], workbook: Mapping[str, Task]
) -> set[str]:
    """Every root name some render context of this playbook can hold."""
    out = set(RUNTIME_NAMES) | set(ENV.globals) | set(workload) | set(steps)
    for step in steps.values():
        out.update(_set_names(step.set))
        for arc in step.next.arcs:
            out.update(_set_names(arc.set))
        if step.loop is not None:
            out.add(step.loop.iterator)
        for task in step.tasks:
            out.update(_task_names(task))
    for task in workbook.values():
        out.update(_task_names(task))
    return out


def unknown(
    reference: Reference,
    names: set[str],
    workload: Mapping[str, Any],
    iters: set[str] | None = None,
) -> list[tuple[str, int, Iterable[str]]]:
    """The unknown names of one template: (what, its line in the template, the names it
    could have meant). `iters`: the keys `iter` can hold (`known_iter_keys`; None: not
    checked)."""
    _, free, keys = scan(reference.source)
    out: list[tuple[str, int, Iterable[str]]] = []
    for name, line in free:
        if name not in names:
            out.append((f"name '{name}'", line, names))
    for key, line in keys:
        if key not in workload:
            out.append((f"workload key '{key}'", line, workload))
    if iters is not None and "iter" in reference.source:
        for key, line in iter_keys(reference.source):
            if key not in iters:
                out.append((f"iter key '{key}'", line, iters))
    return out
