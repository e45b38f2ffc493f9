"""`flowtide catalog register|list`: playbooks by their metadata.path, in the local store
or (with --server) a server's catalog."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Annotated

import typer

from flowtide.cli.backends import open_store, remote_or_exit, server_client
from flowtide.cli.options import (
    EXIT_INVALID,
    EXIT_OK,
    DbOpt,
    HomeOpt,
    JsonOpt,
    ServerOpt,
    err,
    print_json,
)

catalog_app = typer.Typer(
    help="Register and list playbooks by their metadata.path.", no_args_is_help=True
)


@catalog_app.command("register")
def catalog_register(
    paths: Annotated[
        list[Path], typer.Argument(help="Playbook files or folders (searched for *.yaml).")
    ],
    home: HomeOpt = None,
    db: DbOpt = None,
    server: ServerOpt = None,
) -> None:
    """Validate and record playbooks under their metadata.path (a new version when changed).

    With --server they go to the server's catalog (run them with `flowtide run PATH
    --server URL`)."""
    import time

    from flowtide.errors import PlaybookError
    from flowtide.playbook.loader import load_playbook
    from flowtide.store.base import catalog_path_problem

    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            files.extend(sorted(list(p.rglob("*.yaml")) + list(p.rglob("*.yml"))))
        else:
            files.append(p)
    api = None
    store = None
    if server:
        api = server_client(server)
    else:
        store = open_store(home, db)
    bad = 0
    for file in files:
        try:
            playbook = load_playbook(file)
        except PlaybookError as exc:
            bad += 1
            err(f"skipped: {exc}")
            continue
        problem = catalog_path_problem(playbook.path)
        if problem or not isinstance(playbook.path, str):
            bad += 1
            err(f"skipped: {file}: {problem}")
            continue
        if api is not None:
            doc = remote_or_exit(partial(api.register_playbook, playbook.text))
            version = doc["version"]
        else:
            assert store is not None
            version = store.register_playbook(
                playbook.path, playbook.text, source_file=str(file.resolve()), created=time.time()
            )
        typer.echo(f"{playbook.path} v{version}  ({file})")
    if api is not None:
        api.close()
    if store is not None:
        store.close()
    raise typer.Exit(EXIT_INVALID if bad and bad == len(files) else EXIT_OK)


@catalog_app.command("list")
def catalog_list(
    as_json: JsonOpt = False, home: HomeOpt = None, db: DbOpt = None, server: ServerOpt = None
) -> None:
    """List registered playbooks (latest version of each path)."""
    if server:
        with server_client(server) as api:
            items = remote_or_exit(api.list_playbooks)
        if as_json:
            print_json(items)
            return
        for item in items:
            typer.echo(f"{item.get('path')}  v{item.get('version')}")
        return
    store = open_store(home, db)
    rows = store.list_playbooks()
    store.close()
    if as_json:
        print_json(
            [
                {
                    "path": r.path,
                    "version": r.version,
                    "versions": r.versions,
                    "source_file": r.source_file,
                }
                for r in rows
            ]
        )
        return
    for r in rows:
        typer.echo(f"{r.path}  v{r.version}  ({r.versions} versions)  {r.source_file or ''}")
