"""`flowtide gc`: remove executions that ended long ago, with their rows and files."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from flowtide.cli.backends import open_store
from flowtide.cli.options import EXIT_INVALID, DbOpt, HomeOpt, JsonOpt, err, home_dir, print_json

_ENDED = ("completed", "failed", "cancelled")


def gc_cmd(
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than",
            help="Remove executions that ended longer ago than this: 30d, 12h, 90m, 2w.",
        ),
    ],
    status: Annotated[
        list[str] | None,
        typer.Option(
            "--status",
            help="Only executions that ended so: completed, failed or cancelled (repeat for"
            " several; default: all three).",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what would go; remove nothing.")
    ] = False,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
) -> None:
    """Remove executions that ended before --older-than from the local store: their
    events, commands, summaries, notification deliveries and data folders (datasets,
    stored results), in batches, then give the space back (the SQLite file shrinks). A
    run still open, and a parent whose child is open, are kept; trigger firings are kept
    (a schedule's slot, a hook's delivery, a message never starts a run twice)."""
    from flowtide.errors import FlowtideError
    from flowtide.gc import collect_garbage
    from flowtide.prune import parse_age

    statuses = tuple(status or _ENDED)
    wrong = [s for s in statuses if s not in _ENDED]
    if wrong:
        err(
            f"error: --status {wrong[0]!r}: expected one of {', '.join(_ENDED)} (only ended runs go)"
        )
        raise typer.Exit(EXIT_INVALID)
    try:
        age = parse_age(older_than)
    except FlowtideError as exc:
        err(f"error: {exc}")
        raise typer.Exit(EXIT_INVALID) from None
    store = open_store(home, db)
    path = getattr(store, "path", None)
    file = Path(path) if path else None

    def size() -> int | None:
        if file is None or not file.exists():
            return None
        return sum(p.stat().st_size for p in (file, Path(f"{file}-wal")) if p.exists())

    def progress(count: int) -> None:
        if not as_json:
            err(f"  {count} executions removed so far")

    try:
        done = collect_garbage(
            store,
            home_dir(home) / "data",
            before=time.time() - age,
            statuses=statuses,
            dry_run=dry_run,
            size=size,
            progress=progress,
        )
    except FlowtideError as exc:
        err(f"error: {exc}")
        raise typer.Exit(EXIT_INVALID) from None
    finally:
        store.close()
    if as_json:
        print_json({"dry_run": dry_run, **done.as_dict()})
        return
    verb = "would remove" if dry_run else "removed"
    rows = ", ".join(f"{n} {table}" for table, n in done.rows.items() if n and table != "execution")
    typer.echo(
        f"{verb} {done.executions} execution{'s' if done.executions != 1 else ''}"
        + (f" ({rows} rows)" if rows else "")
        + f" and {done.folders} data folder{'s' if done.folders != 1 else ''}"
        f" ({done.bytes:,} bytes)"
    )
    if not dry_run and done.store_bytes_before is not None and done.store_bytes_after is not None:
        typer.echo(f"store: {done.store_bytes_before:,} -> {done.store_bytes_after:,} bytes")
