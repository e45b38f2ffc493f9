"""Arcs: a step's `next:` into a `Next` of the model, and which steps each step can reach.

`next` may be a mapping with `arcs` (and a routing mode, exclusive or inclusive), a
single arc, a list of arcs or a step name; each arc becomes an `Arc` with its `when` and
`set`. Whether an arc's target exists is checked once all steps are known, in
`flowtide.playbook.loader.parse_playbook`.
"""

from __future__ import annotations

from typing import Any

from flowtide.playbook.loader.checker import _Checker
from flowtide.playbook.model import Arc, Next, Step
from flowtide.playbook.source import Path as NodePath


def _parse_next(c: _Checker, raw: Any, path: NodePath, step: str) -> Next:
    if raw is None:
        return Next()
    mode = "exclusive"
    arcs_raw: Any
    if isinstance(raw, dict):
        c.keys(raw, "next", path, step, "next")
        spec = raw.get("spec") or {}
        if isinstance(spec, dict):
            c.keys(spec, "next spec", (*path, "spec"), step, "next.spec")
        mode = str(
            (spec.get("mode") if isinstance(spec, dict) else None) or raw.get("mode") or "exclusive"
        )
        if "arcs" in raw:
            arcs_raw = raw.get("arcs") or []
            arcs_path: NodePath = (*path, "arcs")
        elif "step" in raw:
            arcs_raw = [raw]
            arcs_path = path
        else:
            arcs_raw = []
            arcs_path = path
    elif isinstance(raw, list):
        arcs_raw = raw
        arcs_path = path
    elif isinstance(raw, str):
        arcs_raw = [raw]
        arcs_path = path
    else:
        c.error(
            path,
            "'next' must be a mapping with 'arcs', a list of arcs, or a step name",
            step=step,
            field="next",
        )
        return Next()
    if mode not in ("exclusive", "inclusive"):
        c.error(
            (*path, "spec", "mode"),
            f"unknown routing mode '{mode}'",
            step=step,
            field="next.spec.mode",
            expected="exclusive | inclusive",
        )
    if not isinstance(arcs_raw, list):
        c.error(arcs_path, "'arcs' must be a list", step=step, field="next.arcs")
        return Next(mode=mode)
    arcs: list[Arc] = []
    for i, item in enumerate(arcs_raw):
        apath = (*arcs_path, i)
        if isinstance(item, str):
            arcs.append(Arc(step=item, line=c.line(apath)))
            continue
        if not isinstance(item, dict) or "step" not in item:
            c.error(
                apath,
                "an arc needs 'step'",
                step=step,
                field=f"next.arcs[{i}]",
                expected="{step: NAME, when: TEMPLATE, set: {...}}",
            )
            continue
        if item is not raw:
            c.keys(item, "arc", apath, step, f"next.arcs[{i}]")
        arc_set = item.get("set") or {}
        c.templates(item.get("when"), (*apath, "when"), step, f"next.arcs[{i}].when")
        c.templates(arc_set, (*apath, "set"), step, f"next.arcs[{i}].set")
        arcs.append(
            Arc(
                step=str(item["step"]),
                when=item.get("when"),
                set=dict(arc_set),
                line=c.line((*apath, "step")),
            )
        )
    return Next(mode=mode, arcs=tuple(arcs))


def _reachability(steps: dict[str, Step]) -> dict[str, frozenset[str]]:
    graph = {name: {a.step for a in s.next.arcs if a.step in steps} for name, s in steps.items()}
    out: dict[str, frozenset[str]] = {}
    for name in steps:
        seen: set[str] = set()
        stack = list(graph[name])
        while stack:
            cur = stack.pop()
            if cur in seen:
                continue
            seen.add(cur)
            stack.extend(graph[cur])
        out[name] = frozenset(seen)
    return out
