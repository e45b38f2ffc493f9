"""What declares a tool kind: a `ToolSpec` — its name, the fields its tasks take (checked
by the loader with file:line:column like every other playbook error), how to make its
runner, and what its result looks like.

Built-in kinds are ToolSpecs listed in `flowtide.tools.builtin`; a plugin's are found
through the `flowtide.tools` entry point group (`flowtide.tools.kinds` merges both).
This module imports nothing heavy and nothing of the playbook: the loader reads specs
while `flowtide validate` runs, and a runner's module (duckdb, psycopg, pyspark...) is
imported only when a task of its kind first runs.

A runner is an object with `run(config, ctx) -> result` (`flowtide.tools.base.Tool`),
sync or async; it may also have the hooks the runtime calls when present:
`warm(**hints)` (ahead of the first command; `executor`, `data_dir` reach the ones that
name them), `cancel(execution_id)` (stop work running outside Python) and
`configure(...)` (the worker's process settings, kind-specific).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

#: The entry point group a plugin registers its kinds in: `<kind> = "<module>:<ToolSpec>"`.
ENTRY_POINT_GROUP = "flowtide.tools"

#: Fields the runtime itself reads from any task (`timeout`), allowed by a strict schema.
COMMON_FIELDS = ("kind", "timeout")

#: A field's position relative to the tool mapping: `"url"`, `("spec", "url")`,
#: `("inputs", "orders", "format")`.
At = str | Sequence[str | int]


@dataclass(frozen=True)
class FieldSpec:
    """One field of a kind's configuration. A value that is a template (`{{ }}`) is
    checked when rendered, by the runner, not here."""

    #: The Python types the value may have (`str`, `int`, `float`, `bool`, `list`,
    #: `dict`); empty: any.
    types: tuple[type, ...] = ()
    #: The values it may take (compared as lower-case text); empty: any.
    choices: tuple[str, ...] = ()
    #: One line for the docs and the error's `expected`.
    doc: str = ""


class TaskCheck(Protocol):
    """What a kind's `check` is given: one task's configuration as written, and where to
    report what is wrong with it. Errors carry file:line:column, the step and the field."""

    kind: str
    step: str
    #: The task's fields (flat fields win over those under `spec:`), templates not
    #: rendered; `kind` included.
    config: Mapping[str, Any]
    #: The tool mapping as written (flat fields, `spec`, `input`...).
    raw: Mapping[str, Any]

    def at(self, name: str) -> tuple[str, ...]:
        """Where field `name` is written: `(name,)`, or `("spec", name)` when it sits
        under `spec:` only."""
        ...

    def error(
        self,
        at: At,
        message: str,
        *,
        field: At | None = None,
        expected: str | None = None,
    ) -> None:
        """Report `message` at the position of `at` (relative to the tool mapping; the
        nearest written parent when `at` is not written). The report names the field
        `at` without a leading `spec`, or `field` when given (a missing `sink.table`
        reported at `sink`); an integer in it is a list position (`("cmds", 1)`:
        `cmds[1]`)."""
        ...

    def error_inside(
        self, at: At, line: int, column: int | None, message: str, *, field: At | None = None
    ) -> None:
        """Report `message` at `line`/`column` (1-based) of the multi-line string at `at`
        (a code block's syntax error)."""
        ...


@dataclass(frozen=True)
class ToolSpec:
    """A tool kind.

    `runner`: a `"module:attribute"` reference, imported when a task of the kind first
    runs (keep heavy imports out of `flowtide validate`), or the class / factory itself;
    called with no arguments it gives the one shared runner of the process. None: the
    runtime runs the kind itself, as `call` or `delegate` says (`playbook`, `workbook`).

    What the runtime does differently for a kind is said here, never by its name in the
    runtime: `call`, `delegate`, `loop_input`.
    """

    kind: str
    runner: str | Callable[[], Any] | None
    #: One of these fields must be set (not empty) on every task of the kind.
    requires: tuple[str, ...] = ()
    #: How the "requires" error names them, e.g. "'url'"; default: 'a' or 'b'.
    requires_text: str = ""
    #: Fields whose type or value the loader checks.
    fields: Mapping[str, FieldSpec] = field(default_factory=dict)
    #: Fields neither in `fields` nor in `COMMON_FIELDS` are refused (did you mean...?).
    strict: bool = False
    #: More checks of one task: report problems on the TaskCheck.
    check: Callable[[TaskCheck], None] | None = None
    #: Fields the runtime hands to the runner as written, templates and all: the runner
    #: renders them itself against `ToolContext.render_context` (the shell tool passes
    #: the values of its commands' templates as environment variables, never as code).
    unrendered: tuple[str, ...] = ()
    #: How the runtime calls a kind without a runner: a function `(config, ctx) ->
    #: result` given the rendered config and the `ToolContext`, like a runner's `run`, or
    #: its `"module:attribute"` reference (`invoke` calls it; `playbook`: a sub-playbook,
    #: through `ToolContext.run_playbook`).
    call: str | Callable[[dict[str, Any], Any], Any] | None = None
    #: A kind whose task stands for another: `delegate(config, playbook)` gives the task
    #: run in its place (fields as written), whose `input` holds the defaults of the
    #: rendered input and whose templates see that input over the scope (`workbook`: an
    #: action of the playbook's workbook).
    delegate: Callable[[Mapping[str, Any], Any], Any] | None = None
    #: Inside a loop, the runner's `input` gets the element by the loop's iterator name
    #: and `loop_index` (explicit inputs win): code reads them as names, as templates do.
    loop_input: bool = False
    #: What `run` returns (the result a later step reads), for the docs.
    result: str = ""
    #: One line: what the kind does.
    doc: str = ""

    def requirement(self) -> str:
        """The fields `requires` names, as the "requires" error says them."""
        return self.requires_text or " or ".join(f"'{name}'" for name in self.requires)

    def make_runner(self) -> Any:
        """A new runner (importing its module when `runner` is a reference).

        Raises:
            ImportError: its module (or a library it imports) is not installed.
            LookupError: `runner` is None, or its reference names nothing.
        """
        if self.runner is None:
            raise LookupError(f"kind '{self.kind}' is run by the runtime, not by a tool")
        return _callable(self.runner, f"runner '{self.runner}' of kind '{self.kind}'")()

    def invoke(self, config: dict[str, Any], ctx: Any) -> Any:
        """Run one task of a kind the runtime calls itself, through `call` (importing
        its module when `call` is a reference).

        Raises:
            ImportError: its module is not installed.
            LookupError: `call` is None, or its reference names nothing.
            flowtide.errors.ToolError: the call failed.
        """
        if self.call is None:
            raise LookupError(f"kind '{self.kind}' has no call")
        return _callable(self.call, f"call '{self.call}' of kind '{self.kind}'")(config, ctx)


def _callable(reference: str | Callable[..., Any], what: str) -> Callable[..., Any]:
    """The function or class `reference` is, or names as `"module:attribute"`.

    Raises:
        ImportError: its module (or a library it imports) is not installed.
        LookupError: the reference names nothing callable.
    """
    target: Any = reference
    if isinstance(target, str):
        module_name, _, attribute = target.partition(":")
        target = getattr(importlib.import_module(module_name), attribute, None)
    if not callable(target):
        raise LookupError(f"{what} is not callable")
    return cast("Callable[..., Any]", target)


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """ "; did you mean 'x'?" for the closest of `candidates` to a misspelt `name`, or ""."""
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""
