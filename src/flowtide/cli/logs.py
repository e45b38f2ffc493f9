"""`flowtide logs ID [STEP] [-f]`: what an execution's steps printed, live while they run,
from the local store and the embedded runtime's logs, or (with --server) a server."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Collection, Set
from pathlib import Path
from typing import Annotated, Any, Final

import typer

from flowtide.cli.backends import execution_or_exit, open_store, remote_or_exit, server_client
from flowtide.cli.options import (
    EXIT_INTERRUPTED,
    DbOpt,
    ExecutionIdArg,
    HomeOpt,
    JsonOpt,
    ServerOpt,
    err,
    home_dir,
)

__all__ = ["logs", "printable"]


def logs(
    execution_id: ExecutionIdArg,
    step: Annotated[str | None, typer.Argument(help="Only this step's output.")] = None,
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help="Keep printing what is written until the run ends."),
    ] = False,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
    server: ServerOpt = None,
) -> None:
    """Print what an execution's steps wrote (python prints, shell and script output),
    as they write it with -f. Each command keeps its newest 64 KiB while it runs."""
    try:
        if server:
            with server_client(server) as api:
                doc = remote_or_exit(lambda: api.execution(execution_id))
                _known_step_or_exit(step, doc.get("steps") or {}, execution_id)

                def show_all() -> None:
                    for piece in api.logs(execution_id, step, follow):
                        _show(piece, as_json)

                remote_or_exit(show_all)
            return
        asyncio.run(_local(execution_id, step, follow, as_json, home, db))
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_INTERRUPTED) from None


async def _local(
    execution_id: int,
    step: str | None,
    follow: bool,
    as_json: bool,
    home: Path | None,
    db: str | None,
) -> None:
    from flowtide.engine import events as ev
    from flowtide.engine.state import secret_values
    from flowtide.logfiles import read_live
    from flowtide.logread import read_logs

    store = open_store(home, db)
    row = execution_or_exit(store, execution_id)
    if step is not None:
        from flowtide.playbook.loader import parse_playbook

        steps = parse_playbook(row.playbook_text, row.playbook_file).steps
        _known_step_or_exit(step, steps, execution_id)
    root = home_dir(home) / "data" / "logs"

    async def live(skip: Set[int]) -> Any:
        return await asyncio.to_thread(read_live, root, execution_id, skip)

    def read_status() -> str:
        from flowtide.cli.executions import _stopped

        status = store.get_execution(execution_id).status
        if status == "running" and _stopped(store, home, [execution_id]):
            return "interrupted"  # its process died: nothing more will be written
        return status

    async def status() -> str:
        return await asyncio.to_thread(read_status)

    async def secrets() -> frozenset[str]:
        found = await asyncio.to_thread(store.events, execution_id, types=[ev.SECRETS_ADDED])
        values: set[str] = set()
        for e in found:
            values |= secret_values(e)
        return frozenset(values)

    try:
        async for piece in read_logs(
            store,
            execution_id,
            live=live,
            status=status,
            secrets=secrets,
            step=step,
            follow=follow,
        ):
            if piece is not None:
                _show(dict(piece), as_json)
    finally:
        store.close()


def _known_step_or_exit(step: str | None, steps: Collection[str], execution_id: int) -> None:
    """A STEP the execution's playbook does not have ends the command (exit 2) naming
    the steps it has, rather than printing nothing as if the step had been silent."""
    if step is None or not steps or step in steps:
        return
    from flowtide.playbook.loader.references import suggest

    names = ", ".join(sorted(steps))
    err(
        f"error: execution {execution_id} has no step '{step}'{suggest(step, steps)} (steps: {names})"
    )
    raise typer.Exit(2)


def _show(piece: dict[str, Any], as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(piece) + "\n")
    else:
        text = ""
        if piece.get("dropped"):
            text = f"[{piece.get('step')}: {piece['dropped']} bytes not kept]\n"
        text += str(piece.get("text") or "")
        sys.stdout.write(printable(text, terminal=sys.stdout.isatty()))
    sys.stdout.flush()


#: What a terminal would act on rather than show: C0 controls but tab and newline (and a
#: carriage return before a newline), DEL, C1 controls (ESC sequences start terminal
#: commands: set the title, write the clipboard, move the cursor), the bidirectional
#: overrides, and lone surrogates (which no encoding writes).
_CONTROL: Final = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]|\r(?!\n)"
)
_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def printable(text: str, *, terminal: bool) -> str:
    """`text`, a step's output, as `flowtide logs` writes it: on a terminal with its
    control characters shown escaped (`\\x1b`), so what a step prints cannot command the
    reader's terminal; to a file or a pipe as it is. Lone surrogates are U+FFFD."""
    text = _SURROGATE.sub("\ufffd", text)
    if not terminal:
        return text
    return _CONTROL.sub(_escaped, text)


def _escaped(found: re.Match[str]) -> str:
    code = ord(found.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
