"""Errors with positions: the `_Checker` that every part of the loader reports to.

It owns the list of `PlaybookError`s of one file, turns a node path into the
file:line:column of that node (or of a line inside a multi-line string), checks the Jinja
syntax of every template inside a value, and `_suggest` (`flowtide.tools.spec.did_you_mean`)
offers the closest known name ("did you mean ...?") for a misspelt one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from flowtide.errors import PlaybookError
from flowtide.playbook.loader.references import Reference
from flowtide.playbook.loader.schema import LEVELS, Key
from flowtide.playbook.source import Path as NodePath
from flowtide.playbook.source import Positions
from flowtide.playbook.template import check_syntax, is_template
from flowtide.tools.spec import did_you_mean as _suggest

__all__ = ["_Checker", "_suggest"]


class _Checker:
    def __init__(self, file: str | None, positions: Positions) -> None:
        self.file = file
        self.positions = positions
        self.errors: list[PlaybookError] = []
        #: Keys accepted but not acted on: reported as warnings, never stop a run.
        self.warnings: list[PlaybookError] = []
        #: Every template met, its names checked once all steps are known.
        self.references: list[Reference] = []

    def error(
        self,
        path: NodePath,
        message: str,
        *,
        step: str | None = None,
        field: str | None = None,
        expected: str | None = None,
    ) -> None:
        line, column = self.positions.get(path)
        self.errors.append(
            PlaybookError(
                message,
                file=self.file,
                line=line,
                column=column,
                step=step,
                field=field,
                expected=expected,
            )
        )

    def error_inside(
        self,
        path: NodePath,
        line: int,
        column: int | None,
        message: str,
        *,
        step: str | None,
        field: str,
    ) -> None:
        """An error at `line`/`column` of the string at `path` (a multi-line template or
        code block): the file position of that line when it can be known."""
        if line <= 1 and column is None:
            self.error(path, message, step=step, field=field)
            return
        at_line, at_column = self.positions.inside(path, line, column)
        self.errors.append(
            PlaybookError(
                message, file=self.file, line=at_line, column=at_column, step=step, field=field
            )
        )

    def warn(
        self, path: NodePath, message: str, *, step: str | None = None, field: str | None = None
    ) -> None:
        line, column = self.positions.get(path)
        self.warnings.append(
            PlaybookError(message, file=self.file, line=line, column=column, step=step, field=field)
        )

    def keys(
        self,
        raw: Mapping[Any, Any],
        level: str,
        path: NodePath,
        step: str | None,
        field: str,
        *,
        also: Iterable[str] = (),
        skip: Iterable[str] = (),
        hints: Mapping[str, str] | None = None,
    ) -> None:
        """Check every key of `raw` against level `level` of `flowtide.playbook.loader.
        schema.LEVELS` (and `also`, more keys it may carry): an unknown or refused key is
        an error, a known key flowtide does not act on is a warning. `skip`: keys another
        check reports; `hints`: what to say of a known-misplaced key."""
        table: Mapping[str, Key] = LEVELS[level]
        extra = tuple(also)
        ignored = set(skip)
        for key in raw:
            name = str(key)
            if name in ignored or name in extra:
                continue
            at = (*path, key)
            where = f"{field}.{name}" if field else name
            spec = table.get(name)
            if spec is None:
                choices = [k for k, v in table.items() if not v.refused] + list(extra)
                hint = (hints or {}).get(name)
                message = f"unknown {level} key '{name}'" + (
                    f": {hint}" if hint else _suggest(name, choices)
                )
                self.error(at, message, step=step, field=where, expected=" | ".join(choices))
            elif spec.refused:
                self.error(at, spec.refused, step=step, field=where, expected=spec.instead or None)
            elif not spec.acted:
                self.warn(
                    at,
                    f"'{name}' is accepted but flowtide does not act on it ({spec.doc})",
                    step=step,
                    field=where,
                )

    def line(self, path: NodePath) -> int | None:
        return self.positions.get(path)[0]

    def templates(
        self, value: Any, path: NodePath, step: str | None, field: str, *, refs: bool = True
    ) -> None:
        """Report Jinja syntax errors anywhere inside `value`, and keep its templates for
        the check of the names they read (`refs`: they render in a playbook's contexts)."""
        if isinstance(value, str):
            if is_template(value):
                if refs:
                    self.references.append(Reference(path, step, field, value))
                problem = check_syntax(value)
                if problem:
                    self.error_inside(
                        path,
                        problem.line,
                        None,
                        f"template syntax error: {problem}",
                        step=step,
                        field=field,
                    )
        elif isinstance(value, dict):
            for k, v in value.items():
                self.templates(v, (*path, k), step, f"{field}.{k}", refs=refs)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                self.templates(v, (*path, i), step, f"{field}[{i}]", refs=refs)
