"""`flowtide catalog register|list`: playbooks by their metadata.path, in the local store
or (with --server) a server's catalog."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Annotated, Any

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
from flowtide.cli.summary import print_warnings

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
    """Validate and record playbooks under their metadata.path (a new version when changed),
    and schedules (`kind: Schedule` documents, added or replaced by name).

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
    # Schedules after playbooks: a schedule may name a playbook registered here.
    from flowtide.cli.subscriptions import is_subscription, register_subscription

    schedules = [f for f in files if _is_schedule(f)]
    subscriptions = [f for f in files if f not in schedules and is_subscription(f)]
    files = [f for f in files if f not in schedules and f not in subscriptions]
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
        print_warnings(playbook, str(file))
        if api is not None:
            doc = remote_or_exit(partial(api.register_playbook, playbook.text))
            version = doc["version"]
        else:
            assert store is not None
            version = store.register_playbook(
                playbook.path, playbook.text, source_file=str(file.resolve()), created=time.time()
            )
        typer.echo(f"{playbook.path} v{version}  ({file})")
    for file in schedules:
        if not _register_schedule(file, api, store):
            bad += 1
    for file in subscriptions:
        if not register_subscription(file, api, store):
            bad += 1
    files += schedules + subscriptions
    if api is not None:
        api.close()
    if store is not None:
        store.close()
    raise typer.Exit(EXIT_INVALID if bad and bad == len(files) else EXIT_OK)


def _is_schedule(file: Path) -> bool:
    """Whether the file is a `kind: Schedule` document (read cheaply: its `kind:` line)."""
    try:
        with file.open(encoding="utf-8", errors="replace") as f:
            head = f.read(65536)
    except OSError:
        return False
    import re

    return re.search(r"(?m)^kind:\s*['\"]?Schedule['\"]?\s*(#.*)?$", head) is not None


def _register_schedule(file: Path, api: Any, store: Any) -> bool:
    """Add or replace the schedule a `kind: Schedule` file defines; False when refused."""
    import time

    from flowtide.errors import FlowtideError
    from flowtide.playbook.source import load_yaml
    from flowtide.triggers.spec import schedule_from_document

    try:
        text = file.read_text(encoding="utf-8")
        doc, positions = load_yaml(text, str(file))
        spec = schedule_from_document(doc, source=str(file), positions=positions)
    except OSError as exc:
        err(f"skipped: {file}: {exc.strerror}")
        return False
    except FlowtideError as exc:
        err(f"skipped: {exc}")
        return False
    if api is not None:
        body = _fields_of(doc, spec.name)
        remote_or_exit(partial(api.api, "POST", "/api/schedules", json=body))
    else:
        from flowtide.ids import default_generator
        from flowtide.triggers.schedules import define_schedule

        try:
            define_schedule(
                store,
                spec,
                new_id=default_generator().next_id,
                now=time.time(),
                local=True,
                base=file.parent,
            )
        except FlowtideError as exc:
            err(f"skipped: {file}: {exc}")
            return False
    typer.echo(f"schedule {spec.name}  ({file})")
    return True


def _fields_of(doc: dict[str, Any], name: str) -> dict[str, Any]:
    """The API body of a `kind: Schedule` document (checked here first): its `spec:`
    fields, the playbook reference flattened, with its name and description."""
    fields = dict(doc.get("spec") or {})
    playbook = fields.get("playbook")
    if isinstance(playbook, dict):
        fields["playbook"] = playbook.get("path")
        fields["version"] = playbook.get("version")
    description = (doc.get("metadata") or {}).get("description")
    body = fields | {"name": name, "replace": True, "description": description}
    return {k: v for k, v in body.items() if v is not None}


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
        versions = f"{r.versions} version{'' if r.versions == 1 else 's'}"
        typer.echo(f"{r.path}  v{r.version}  ({versions})  {r.source_file or ''}")
