"""`flowtide shards`: where executions live when the event log is split over N shards."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from flowtide.cli.options import EXIT_INVALID, JsonOpt, print_json

__all__ = ["shards_app"]

shards_app = typer.Typer(
    help=(
        "Shards: N PostgreSQL databases that each hold a slice of the executions, chosen "
        "by shard_for(execution_id, N) = xxHash64 (seed 0) of the id's 8 little-endian "
        "bytes, modulo N (NoETL's function)."
    ),
    no_args_is_help=True,
)


def _count_from_env() -> int | None:
    """N from FLOWTIDE_SHARDS (`dsn0;dsn1;...`), when set."""
    raw = os.environ.get("FLOWTIDE_SHARDS", "")
    dsns = [d for d in raw.split(";") if d.strip()]
    return len(dsns) or None


@shards_app.command("for")
def shard_for_cmd(
    execution_id: Annotated[str, typer.Argument(help="The execution id (a snowflake).")],
    shards: Annotated[
        int | None,
        typer.Option(
            "--shards",
            min=1,
            help="Number of shards [default: the number of DSNs in FLOWTIDE_SHARDS].",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Print the index of the shard that owns EXECUTION_ID."""
    from flowtide.sharding import shard_for

    n = shards if shards is not None else _count_from_env()
    if n is None:
        typer.echo("error: say how many shards: --shards N (or set FLOWTIDE_SHARDS)", err=True)
        raise typer.Exit(EXIT_INVALID)
    try:
        value = int(execution_id.strip())
        shard = shard_for(value, n)
    except ValueError as exc:
        message = str(exc) if "range" in str(exc) else f"{execution_id!r} is not an integer id"
        typer.echo(f"error: execution id: {message}", err=True)
        raise typer.Exit(EXIT_INVALID) from None
    if as_json:
        print_json({"execution_id": str(value), "shards": n, "shard": shard})
    else:
        typer.echo(str(shard))
