"""How `flowtide run` and `resume` print an ended execution: on a terminal a short
summary; piped or redirected, the status and the error on stderr and the result alone,
as JSON, on stdout (`| jq` works)."""

from __future__ import annotations

import sys
from typing import Any

from flowtide.cli.options import err, print_json

__all__ = ["print_error", "print_summary", "print_warnings"]


def print_summary(doc: dict[str, Any], location: str | None = None) -> None:
    from rich.console import Console
    from rich.pretty import Pretty

    # On a terminal, one readable summary; piped or redirected, the status and the error
    # go to stderr and stdout carries the result alone, as JSON (`| jq` works).
    terminal = sys.stdout.isatty()
    console = Console(stderr=not terminal)
    style = {"completed": "green", "failed": "red", "cancelled": "yellow"}.get(doc["status"], "")
    console.print(f"execution [bold]{doc['execution_id']}[/] [{style}]{doc['status']}[/]")
    if doc["error"]:
        print_error(console, doc["error"], location)
    if not terminal:
        print_json(doc["result"])
        return
    if doc["result"] is None and doc["status"] != "completed":
        return  # nothing to show: a failed or cancelled run's "result: None" is noise
    console.print("result:")
    console.print(Pretty(doc["result"], max_length=20, max_string=400))


def print_error(console: Any, error: dict[str, Any], location: str | None = None) -> None:
    """An execution's error on `console` (a rich Console): its step, where the step is
    written, its kind and message, then a python step's traceback. What the error holds is
    the user's text (a message may contain `[/x]`): never read as rich markup, and never
    broken into lines at the console's width (piped, that is 80 columns)."""
    from rich.markup import escape

    where = f" ({escape(location)})" if location else ""
    step = f" in step [bold]{escape(str(error['step']))}[/]" if error.get("step") else ""
    message = escape(f"({error.get('kind')}): {error.get('message')}")
    console.print(f"[red]error[/]{step}{where} {message}", soft_wrap=True)
    if error.get("traceback"):  # a python step's, in the playbook's lines
        console.print(str(error["traceback"]), markup=False, highlight=False, soft_wrap=True)


def print_warnings(playbook: Any, file: str) -> list[dict[str, Any]]:
    """Print (on stderr) and return the playbook's warnings: keys it accepts but does not
    act on (the loader's) and templates pasted into SQL text (flowtide.playbook.sqllint).
    Warnings never stop a run nor a registration."""
    from flowtide.playbook.loader import warning_text
    from flowtide.playbook.sqllint import lint_playbook

    for key_warning in playbook.warnings:
        err(warning_text(key_warning))
    warnings = lint_playbook(playbook, file)
    for warning in warnings:
        err(warning.render())
    return [w.to_dict() for w in playbook.warnings] + [w.to_dict() for w in warnings]
