"""Loops: a step's `loop:` into a `Loop` of the model.

It owns the collection and iterator, the mode (sequential, parallel or cursor) and
`max_in_flight`, and for a cursor loop the claim query (`loop.cursor`, a postgres task)
and the frame (`spec.frame`: how many rows a claim takes and whether they are processed
one by one or as a frame).
"""

from __future__ import annotations

from typing import Any

from flowtide.playbook.loader.checker import _Checker
from flowtide.playbook.model import Loop, Task
from flowtide.playbook.source import Path as NodePath
from flowtide.playbook.sqllint import params_problem
from flowtide.playbook.template import is_template


def _parse_loop(c: _Checker, raw: Any, path: NodePath, step: str) -> Loop | None:
    if not isinstance(raw, dict):
        c.error(
            path,
            "'loop' must be a mapping",
            step=step,
            field="loop",
            expected="{in: TEMPLATE, iterator: NAME, spec: {mode: sequential|parallel|spark}}",
        )
        return None
    c.keys(raw, "loop", path, step, "loop")
    spec = raw.get("spec") or {}
    if not isinstance(spec, dict):
        c.error((*path, "spec"), "loop 'spec' must be a mapping", step=step, field="loop.spec")
        spec = {}
    c.keys(spec, "loop spec", (*path, "spec"), step, "loop.spec")
    mode = str(spec.get("mode") or raw.get("mode") or "sequential")
    has_cursor = raw.get("cursor") is not None
    if "in" not in raw and "collection" not in raw and not has_cursor and mode != "cursor":
        c.error(path, "loop needs 'in' (the collection to iterate)", step=step, field="loop.in")
        return None
    iterator = raw.get("iterator") or raw.get("element")
    if not iterator:
        c.error(
            path,
            "loop needs 'iterator' (the name of the current element)",
            step=step,
            field="loop.iterator",
        )
        return None
    if mode not in ("sequential", "parallel", "cursor", "spark"):
        c.error(
            (*path, "spec", "mode"),
            f"unsupported loop mode '{mode}'",
            step=step,
            field="loop.spec.mode",
            expected="sequential | parallel | cursor | spark",
        )
    collection = raw.get("in", raw.get("collection"))
    c.templates(collection, (*path, "in"), step, "loop.in")
    mif = spec.get("max_in_flight", raw.get("max_in_flight"))
    if mif is not None and not isinstance(mif, int) and not is_template(mif):
        c.error(
            (*path, "spec", "max_in_flight"),
            f"max_in_flight must be an integer, got {mif!r}",
            step=step,
            field="loop.spec.max_in_flight",
            expected="a positive integer or a template",
        )
    cursor: Task | None = None
    max_rows, process = 1, "row"
    if mode == "cursor" or has_cursor:
        cursor = _parse_cursor(c, raw, path, step, mode)
        max_rows, process = _parse_frame(c, spec, (*path, "spec"), step)
    partitions = _positive(c, spec, "partitions", path, step, None)
    results_max = _positive(c, spec, "results_max", path, step, 10_000, zero=True)
    rate = _rate(c, spec, path, step)
    batch = _positive(c, spec, "batch", path, step, None)
    if batch is not None and batch > MAX_BATCH:
        c.error(
            (*path, "spec", "batch"),
            f"loop 'spec.batch' is at most {MAX_BATCH} iterations per command, got {batch}",
            step=step,
            field="loop.spec.batch",
            expected=f"an integer from 1 to {MAX_BATCH}",
        )
        batch = MAX_BATCH
    if "batch" in spec and mode in ("cursor", "spark"):
        c.error(
            (*path, "spec", "batch"),
            f"loop 'spec.batch' applies to 'mode: parallel' and 'sequential' loops (the"
            f" mode is '{mode}'): remove it",
            step=step,
            field="loop.spec.batch",
        )
    if mode != "spark":
        for key in ("partitions", "results_max", "rate"):
            if key in spec:
                c.error(
                    (*path, "spec", key),
                    f"loop 'spec.{key}' applies to 'mode: spark' only (the mode is '{mode}'): "
                    "remove it, or set 'spec.mode: spark'",
                    step=step,
                    field=f"loop.spec.{key}",
                )
    return Loop(
        collection=collection,
        iterator=str(iterator),
        mode=mode,
        max_in_flight=mif,
        cursor=cursor,
        frame_max_rows=max_rows,
        frame_process=process,
        partitions=partitions,
        results_max=results_max if results_max is not None else 10_000,
        rate=rate,
        batch=batch,
    )


def _rate(c: _Checker, spec: dict[str, Any], path: NodePath, step: str) -> Any:
    """`spec.rate`: items started per second across a spark loop's job, a number > 0
    or a template (rendered on the driver), or None."""
    value = spec.get("rate")
    if is_template(value):
        c.templates(value, (*path, "spec", "rate"), step, "loop.spec.rate")
        return value
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        c.error(
            (*path, "spec", "rate"),
            f"loop 'spec.rate' must be a number > 0 (items per second), got {value!r}",
            step=step,
            field="loop.spec.rate",
            expected="a positive number or a template",
        )
        return None
    return value


def _positive(
    c: _Checker,
    spec: dict[str, Any],
    key: str,
    path: NodePath,
    step: str,
    default: int | None,
    *,
    zero: bool = False,
) -> int | None:
    """`spec[key]`, an integer > 0 (>= 0 with `zero`), or `default` when absent."""
    value = spec.get(key)
    if value is None:
        return default
    low = 0 if zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        c.error(
            (*path, "spec", key),
            f"loop 'spec.{key}' must be an integer >= {low}, got {value!r}",
            step=step,
            field=f"loop.spec.{key}",
            expected=f"an integer >= {low}, or no '{key}' for the default",
        )
        return default
    return value


_CURSOR_KINDS = ("postgres",)
#: `spec.batch` at most (a command's claim reply lists its iterations' elements).
MAX_BATCH = 1_000


def _parse_cursor(
    c: _Checker, raw: dict[str, Any], path: NodePath, step: str, mode: str
) -> Task | None:
    """`loop.cursor` of a `spec.mode: cursor` loop: `{kind: postgres, auth, claim}`."""
    cursor = raw.get("cursor")
    if cursor is None:
        c.error(
            (*path, "spec", "mode"),
            "a cursor loop needs 'cursor' (the claim query)",
            step=step,
            field="loop.cursor",
            expected="cursor: {kind: postgres, auth: ALIAS, claim: SQL}",
        )
        return None
    cpath: NodePath = (*path, "cursor")
    if mode != "cursor":
        c.error(
            cpath,
            f"'loop.cursor' needs 'spec.mode: cursor' (the mode is '{mode}')",
            step=step,
            field="loop.spec.mode",
            expected="cursor",
        )
    if not isinstance(cursor, dict):
        c.error(
            cpath,
            "'loop.cursor' must be a mapping",
            step=step,
            field="loop.cursor",
            expected="{kind: postgres, auth: ALIAS, claim: SQL}",
        )
        return None
    c.keys(cursor, "cursor", cpath, step, "loop.cursor")
    kind = cursor.get("kind")
    if kind not in _CURSOR_KINDS:
        c.error(
            (*cpath, "kind") if "kind" in cursor else cpath,
            f"unsupported cursor kind {kind!r}" if kind else "cursor needs 'kind'",
            step=step,
            field="loop.cursor.kind",
            expected=" | ".join(_CURSOR_KINDS),
        )
    claim = cursor.get("claim")
    if not isinstance(claim, str) or not claim.strip():
        c.error(
            (*cpath, "claim") if "claim" in cursor else cpath,
            "cursor needs 'claim' (SQL that claims rows and returns them)",
            step=step,
            field="loop.cursor.claim",
            expected="claim: UPDATE ... RETURNING ...",
        )
    config = {k: v for k, v in cursor.items() if k != "kind"}
    c.templates(config, cpath, step, "loop.cursor")
    if problem := params_problem(str(kind), config):
        c.error((*cpath, "params"), problem, step=step, field="loop.cursor.params")
    if kind not in _CURSOR_KINDS or not isinstance(claim, str):
        return None
    return Task(name="cursor", kind=str(kind), config=config, line=c.line(cpath))


def _parse_frame(c: _Checker, spec: dict[str, Any], path: NodePath, step: str) -> tuple[int, str]:
    frame = spec.get("frame")
    if frame is None:
        return 1, "row"
    fpath: NodePath = (*path, "frame")
    if not isinstance(frame, dict):
        c.error(
            fpath,
            "loop 'spec.frame' must be a mapping",
            step=step,
            field="loop.spec.frame",
            expected="{max_rows: N, process: row|frame}",
        )
        return 1, "row"
    c.keys(frame, "frame", fpath, step, "loop.spec.frame")
    max_rows = frame.get("max_rows", 1)
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        c.error(
            (*fpath, "max_rows"),
            f"frame max_rows must be an integer >= 1, got {max_rows!r}",
            step=step,
            field="loop.spec.frame.max_rows",
            expected="an integer >= 1",
        )
        max_rows = 1
    process = frame.get("process", "row")
    if process not in ("row", "frame"):
        c.error(
            (*fpath, "process"),
            f"frame process must be 'row' or 'frame', got {process!r}",
            step=step,
            field="loop.spec.frame.process",
            expected="row | frame",
        )
        process = "row"
    return max_rows, str(process)
