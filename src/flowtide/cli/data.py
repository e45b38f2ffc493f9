"""`flowtide data`: the rows a spark step wrote, read by `flowtide.spark.outputs`."""

from __future__ import annotations

from typing import Annotated

import typer

from flowtide.cli.backends import folded, open_store
from flowtide.cli.options import (
    EXIT_FAILED,
    EXIT_INVALID,
    DbOpt,
    ExecutionIdArg,
    HomeOpt,
    JsonOpt,
    err,
    print_json,
)


def data(
    execution_id: ExecutionIdArg,
    step: Annotated[
        str, typer.Argument(help="A spark step or a spark loop (mode: spark) of that execution.")
    ],
    limit: Annotated[int, typer.Option(help="Rows to print (0: all).")] = 20,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
) -> None:
    """Print the rows a spark step or a spark loop wrote, read with DuckDB (no JVM).

    A spark loop's rows are (index, status, result, error, action), one per item.
    Works for parquet, csv and json results on this machine's disk (by default
    HOME/data/<execution_id>/<step>/). A loop of spark steps prints iteration 0;
    `flowtide status` shows the references of the others.
    """
    from flowtide.errors import DatasetError
    from flowtide.spark.outputs import output_reference, read_output

    store = open_store(home, db)
    _, state = folded(store, execution_id)
    store.close()
    record = state.steps.get(step)
    if record is None or record.runs == 0:
        err(f"error: execution {execution_id} has no step '{step}' that ran")
        raise typer.Exit(EXIT_INVALID)
    ref = output_reference(record.result)
    if ref is None:
        err(
            f"error: step '{step}' did not produce a dataset reference (not a spark step or "
            "a spark loop? `flowtide status` shows its result)"
        )
        raise typer.Exit(EXIT_INVALID)
    try:
        out = read_output(ref, limit=limit)
    except DatasetError as exc:
        if exc.reason == "not_local":
            err(f"error: step '{step}' wrote {exc.format} to {exc.uri}: {exc.message}")
            raise typer.Exit(EXIT_INVALID) from None
        err(f"error: {exc}")
        raise typer.Exit(EXIT_FAILED) from None
    if as_json:
        print_json(
            {"uri": out.uri, "format": out.format, "row_count": out.row_count, "rows": out.rows}
        )
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"{step}: {out.uri} ({out.format}, {out.row_count:,} rows)", title_justify="left"
    )
    for column in out.columns:
        table.add_column(column)
    for row in out.rows:
        table.add_row(*("" if v is None else str(v) for v in row.values()))
    Console().print(table)
    if limit and out.row_count > len(out.rows):
        typer.echo(f"... {out.row_count - len(out.rows):,} more rows (--limit 0 for all)")


def prune_cmd(
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than",
            help="Prune executions that ended longer ago than this: 30d, 12h, 90m, 2w.",
        ),
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Say what would go; remove nothing.")
    ] = False,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
) -> None:
    """Remove the files (spark datasets, results stored by reference) of executions that
    ended before --older-than, from this home's data folder. Running and resumable
    executions, and folders the store does not know, are kept. Their events stay."""
    import time

    from flowtide.cli.options import home_dir
    from flowtide.errors import FlowtideError
    from flowtide.prune import parse_age, prune

    try:
        age = parse_age(older_than)
    except FlowtideError as exc:
        err(f"error: {exc}")
        raise typer.Exit(EXIT_INVALID) from None
    data = home_dir(home) / "data"
    store = open_store(home, db)
    try:
        done = prune(store, data, older_than=age, now=time.time(), dry_run=dry_run)
    finally:
        store.close()
    if as_json:
        print_json({"dry_run": dry_run, **done.as_dict()})
        return
    verb = "would remove" if dry_run else "removed"
    typer.echo(
        f"{verb} {done.folders} folder{'s' if done.folders != 1 else ''} of"
        f" {len(done.executions)} execution{'s' if len(done.executions) != 1 else ''}"
        f" ({done.bytes:,} bytes) from {data}; kept: {done.kept_running} running,"
        f" {done.kept_recent} recent, {done.kept_unknown} unknown to this store"
    )
