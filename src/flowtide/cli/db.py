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
    ShardListOpt,
    err,
    home_dir,
    print_json,
)
from flowtide.urls import scrub_url

db_app = typer.Typer(
    help="The event store: its schema (status, upgrade), and backups of the embedded store"
    " (backup, restore).",
    no_args_is_help=True,
)


def _schema_report(
    home: Path | None,
    db: str | None,
    cluster_db: str | None,
    shards: str | None,
    *,
    apply: bool,
) -> list[dict[str, Any]]:
    """[{database, shard, component, version, latest}] for the cluster database and every
    shard (the topology of --db/--cluster-db/--shards or the shard map); with `apply`,
    migrations are applied first and `from` holds the version found."""
    from flowtide.errors import StoreError
    from flowtide.store.postgres import is_postgres_url

    on_postgres = bool(shards or cluster_db or (db and is_postgres_url(db)))
    if cluster_db and db and not is_postgres_url(db):
        err("error: --cluster-db needs a PostgreSQL --db")
        raise typer.Exit(EXIT_INVALID)
    if not on_postgres:
        from flowtide.store.sqlite import SCHEMA_VERSION

        path = Path(db) if db else home_dir(home) / "flowtide.db"
        open_store(home, db).close()  # opening a SQLite store migrates it
        return [
            {
                "database": str(path),
                "shard": None,
                "component": "sqlite",
                "from": SCHEMA_VERSION,
                "version": SCHEMA_VERSION,
                "latest": SCHEMA_VERSION,
            }
        ]
    from flowtide import topology
    from flowtide.store import pgschema

    # The cluster part first: the shard map lives there.
    cluster = cluster_db or (None if shards else db)
    rows: list[dict[str, Any]] = []
    if cluster:
        rows += _migrate(cluster, [pgschema.CLUSTER], None, apply=apply)
    try:
        topo = topology.load(db=db, shards=shards, cluster_db=cluster_db, home=home)
    except (topology.TopologyError, StoreError) as exc:
        err(f"error: {exc}")
        raise typer.Exit(EXIT_INVALID if isinstance(exc, topology.TopologyError) else 1) from None
    for shard in topo.shards:
        index = shard.index if topo.source != "single" else None
        rows += _migrate(shard.dsn, [pgschema.SHARD], index, apply=apply)
    return rows


def _migrate(
    dsn: str, components: list[Any], shard: int | None, *, apply: bool
) -> list[dict[str, Any]]:
    import psycopg

    from flowtide.errors import StoreError
    from flowtide.store import pgschema
    from flowtide.store.postgres import display_dsn

    where = display_dsn(dsn)
    before: dict[str, int] = {}
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            if apply:
                report = pgschema.upgrade(conn, components, where=where)
                before = {name: old for name, old, _ in report}
            found = pgschema.current_versions(conn)
    except (psycopg.Error, StoreError) as exc:
        # One database out of reach is said and the others still done: a shard that is
        # down must not hide (or block) the rest.
        message = scrub_url(str(exc), dsn).strip()
        if isinstance(exc, psycopg.Error):
            message = f"{where}: {message}"
        return [
            {
                "database": where,
                "shard": shard,
                "component": c.name,
                "from": None,
                "version": None,
                "latest": c.latest,
                "error": message,
            }
            for c in components
        ]
    return [
        {
            "database": where,
            "shard": shard,
            "component": c.name,
            "from": before.get(c.name, found[c.name]),
            "version": found[c.name],
            "latest": c.latest,
        }
        for c in components
    ]


def _where(row: dict[str, Any]) -> str:
    shard = row.get("shard")
    return row["database"] if shard is None else f"shard {shard} {row['database']}"


@db_app.command("upgrade")
def db_upgrade(
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
    cluster_db: ClusterDbOpt = None,
    shards: ShardListOpt = None,
) -> None:
    """Apply pending schema migrations to the cluster database and every shard (safe to
    run from several machines at once)."""
    rows = _schema_report(home, db, cluster_db, shards, apply=True)
    _print(
        rows,
        as_json,
        lambda r: (
            "up to date" if r["from"] == r["version"] else f"upgraded {r['from']} -> {r['version']}"
        ),
    )


def _print(rows: list[dict[str, Any]], as_json: bool, state: Any) -> None:
    """The rows as JSON or a line each (`state(row)` in brackets); then exit 1 naming
    the databases that could not be reached."""
    if as_json:
        print_json(rows)
    else:
        for r in rows:
            if r.get("error"):
                typer.echo(f"{_where(r)}  {r['component']}: unavailable ({r['error']})")
            else:
                typer.echo(f"{_where(r)}  {r['component']}: version {r['version']} ({state(r)})")
    missing = sorted({_where(r) for r in rows if r.get("error")})
    if missing:
        err(f"error: not reached: {', '.join(missing)}")
        raise typer.Exit(EXIT_FAILED)


@db_app.command("status")
def db_status(
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
    cluster_db: ClusterDbOpt = None,
    shards: ShardListOpt = None,
) -> None:
    """Show each schema part's version, in the cluster database and every shard, and
    whether `flowtide db upgrade` has work to do. Exits 1 when a migration is pending."""
    rows = _schema_report(home, db, cluster_db, shards, apply=False)
    pending = any(r["version"] is not None and r["version"] < r["latest"] for r in rows)
    _print(
        rows,
        as_json,
        lambda r: (
            "current"
            if r["version"] == r["latest"]
            else (
                f"needs upgrade to {r['latest']}"
                if r["version"] < r["latest"]
                else f"newer than this flowtide ({r['latest']})"
            )
        ),
    )
    if pending:
        raise typer.Exit(EXIT_FAILED)


def _backups() -> None:
    from flowtide.cli.dbbackup import backup_cmd, restore_cmd

    db_app.command("backup")(backup_cmd)
    db_app.command("restore")(restore_cmd)


_backups()
