"""`flowtide db backup|restore`: the embedded store copied while it runs, and put back.

A backup is SQLite's online backup of the store: a consistent copy of one instant, taken
while runs write to it (they wait a moment, never fail). The master key
(`<home>/master.key`, or FLOWTIDE_MASTER_KEY) seals credentials and secret values in
the store and is not in the copy: keep it apart (a backup that holds its own key protects
nothing); `restore --key` puts it back beside the store. A run that was going when the
backup was taken is `running` in the copy: `flowtide resume ID` goes on from its last
recorded event, as after a crash.

On PostgreSQL use the database's own tools per database (each shard and the cluster
database): `pg_dump -Fc` and `pg_restore` (README, "Operating flowtide").
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Annotated

import typer

from flowtide.cli.options import EXIT_FAILED, EXIT_INVALID, HomeOpt, err, home_dir

__all__ = ["backup_cmd", "restore_cmd"]

TargetArg = Annotated[Path, typer.Argument(help="The backup file.", show_default=False)]


def _copy(source: Path, target: Path) -> None:
    """SQLite's online backup of `source` into a new file `target` (pages copied in
    steps, so writers wait only briefly)."""
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=30)
    try:
        dst = sqlite3.connect(target)
        try:
            src.backup(dst, pages=1024)
        finally:
            dst.close()
    finally:
        src.close()


def backup_cmd(
    target: TargetArg,
    home: HomeOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing file.")] = False,
) -> None:
    """Copy this home's store to TARGET while runs go on (a consistent instant). The master
    key is not in it: back it up apart."""
    source = home_dir(home) / "flowtide.db"
    if not source.exists():
        err(f"error: no store at {source}")
        raise typer.Exit(EXIT_INVALID)
    if target.exists() and not force:
        err(f"error: {target} exists (--force replaces it)")
        raise typer.Exit(EXIT_INVALID)
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)
    try:
        _copy(source, partial)
        partial.replace(target)
    except (OSError, sqlite3.Error) as exc:
        partial.unlink(missing_ok=True)
        err(f"error: backup of {source}: {exc}")
        raise typer.Exit(EXIT_FAILED) from None
    target.chmod(0o600)
    key = source.parent / "master.key"
    typer.echo(f"backed up {source} -> {target} ({target.stat().st_size:,} bytes)")
    if key.exists():
        typer.echo(f"the master key is not in it: keep {key} apart (restore --key puts it back)")
    else:
        typer.echo("the master key is not in it (this home has none yet: nothing is sealed)")


def restore_cmd(
    source: Annotated[Path, typer.Argument(help="A file `db backup` wrote.", show_default=False)],
    home: HomeOpt = None,
    key: Annotated[
        Path | None,
        typer.Option("--key", help="The master key file to put back beside the store."),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace this home's store if it has one.")
    ] = False,
) -> None:
    """Put a backup in place as this home's store (and, with --key, its master key). A
    run that was going at the backup's instant resumes with `flowtide resume ID`."""
    folder = home_dir(home)
    target = folder / "flowtide.db"
    try:
        with sqlite3.connect(f"file:{source}?mode=ro", uri=True) as check:
            ok = check.execute("PRAGMA quick_check").fetchone()
            check.execute("SELECT count(*) FROM execution").fetchone()
    except sqlite3.Error as exc:
        err(f"error: {source} is not a flowtide store: {exc}")
        raise typer.Exit(EXIT_INVALID) from None
    if not ok or ok[0] != "ok":
        err(f"error: {source} is damaged: {ok[0] if ok else 'no answer'}")
        raise typer.Exit(EXIT_INVALID)
    if target.exists() and not force:
        err(f"error: {target} exists (--force replaces it; back it up first)")
        raise typer.Exit(EXIT_INVALID)
    folder.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)
    try:
        _copy(source, partial)
        for leftover in (Path(f"{target}-wal"), Path(f"{target}-shm")):
            leftover.unlink(missing_ok=True)
        partial.replace(target)
        target.chmod(0o600)
        if key is not None:
            shutil.copyfile(key, folder / "master.key")
            (folder / "master.key").chmod(0o600)
    except (OSError, sqlite3.Error) as exc:
        partial.unlink(missing_ok=True)
        err(f"error: restore into {target}: {exc}")
        raise typer.Exit(EXIT_FAILED) from None
    typer.echo(f"restored {source} -> {target}; runs that were going: flowtide resume ID")
