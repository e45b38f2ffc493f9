"""`flowtide db status|upgrade`: the event store's schema version, and its migrations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from flowtide.cli.backends import open_store
from flowtide.cli.options import (
    EXIT_FAILED,
    EXIT_INVALID,
    ClusterDbOpt,
    DbOpt,
    HomeOpt,
    JsonOpt,
    err,
    home_dir,
    print_json,
)
from flowtide.urls import scrub_url

db_app = typer.Typer(
    help="The event store's schema: show its version, apply pending migrations.",
    no_args_is_help=True,
)


def _schema_report(
    home: Path | None, db: str | None, cluster_db: str | None, *, apply: bool
) -> list[dict[str, Any]]:
    """[{database, component, version, latest}] for --db (and --cluster-db); with `apply`,
    migrations are applied first and `from` holds the version found."""
    from flowtide.errors import StoreError
    from flowtide.store.postgres import display_dsn, is_postgres_url

    if not (db and is_postgres_url(db)):
        if cluster_db:
            err("error: --cluster-db needs a PostgreSQL --db")
            raise typer.Exit(EXIT_INVALID)
        from flowtide.store.sqlite import SCHEMA_VERSION

        path = Path(db) if db else home_dir(home) / "flowtide.db"
        open_store(home, db).close()  # opening a SQLite store migrates it
        return [
            {
                "database": str(path),
                "component": "sqlite",
                "from": SCHEMA_VERSION,
                "version": SCHEMA_VERSION,
                "latest": SCHEMA_VERSION,
            }
        ]
    import psycopg

    from flowtide.store import pgschema

    targets = [
        (db, [pgschema.SHARD] + ([] if cluster_db and cluster_db != db else [pgschema.CLUSTER]))
    ]
    if cluster_db and cluster_db != db:
        targets.append((cluster_db, [pgschema.CLUSTER]))
    rows: list[dict[str, Any]] = []
    for dsn, components in targets:
        where = display_dsn(dsn)
        before: dict[str, int] = {}
        try:
            with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
                if apply:
                    report = pgschema.upgrade(conn, components, where=where)
                    before = {name: old for name, old, _ in report}
                found = pgschema.current_versions(conn)
        except psycopg.Error as exc:
            err(f"error: {where}: {scrub_url(str(exc), dsn)}")
            raise typer.Exit(EXIT_FAILED) from None
        except StoreError as exc:
            err(f"error: {exc}")
            raise typer.Exit(EXIT_FAILED) from None
        for c in components:
            rows.append(
                {
                    "database": where,
                    "component": c.name,
                    "from": before.get(c.name, found[c.name]),
                    "version": found[c.name],
                    "latest": c.latest,
                }
            )
    return rows


@db_app.command("upgrade")
def db_upgrade(
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
    cluster_db: ClusterDbOpt = None,
) -> None:
    """Apply pending schema migrations (safe to run from several machines at once)."""
    rows = _schema_report(home, db, cluster_db, apply=True)
    if as_json:
        print_json(rows)
        return
    for r in rows:
        change = (
            "up to date" if r["from"] == r["version"] else f"upgraded {r['from']} -> {r['version']}"
        )
        typer.echo(f"{r['database']}  {r['component']}: version {r['version']} ({change})")


@db_app.command("status")
def db_status(
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
    cluster_db: ClusterDbOpt = None,
) -> None:
    """Show each schema part's version and whether `flowtide db upgrade` has work to do.
    Exits 1 when a migration is pending."""
    rows = _schema_report(home, db, cluster_db, apply=False)
    pending = any(r["version"] < r["latest"] for r in rows)
    if as_json:
        print_json(rows)
    else:
        for r in rows:
            state = (
                "current"
                if r["version"] == r["latest"]
                else (
                    f"needs upgrade to {r['latest']}"
                    if r["version"] < r["latest"]
                    else f"newer than this flowtide ({r['latest']})"
                )
            )
            typer.echo(f"{r['database']}  {r['component']}: version {r['version']} ({state})")
    if pending:
        raise typer.Exit(EXIT_FAILED)
