"""`flowtide hook add|list|show|delete`: webhooks (signed HTTP deliveries that start a
playbook), in the local store or (with --server) on a server. The secret is read from a
file (or a credential) and never printed."""

from __future__ import annotations

import datetime as dt
import json
import stat
from pathlib import Path
from typing import Annotated, Any

import typer

from flowtide.cli.backends import open_store, remote_or_exit, server_client
from flowtide.cli.options import EXIT_INVALID, DbOpt, HomeOpt, JsonOpt, err, home_dir, print_json
from flowtide.urls import redact_url

hook_app = typer.Typer(
    help="Webhooks: POST /api/hooks/NAME, signed with the hook's secret, starts a playbook.",
    no_args_is_help=True,
)

HookServerOpt = Annotated[
    str | None,
    typer.Option(
        "--server",
        help="On this flowtide server (needs an operator FLOWTIDE_TOKEN; a reader's to"
        " read) instead of the local store.",
        show_default=False,
    ),
]


def _fail(message: str) -> typer.Exit:
    err(f"error: {message}")
    return typer.Exit(EXIT_INVALID)


def _secret_file(path: Path) -> str:
    """The secret in `path` (refused if missing, empty, over the size, not text); a warning
    when other users may read it."""
    from flowtide.errors import TriggerError
    from flowtide.triggers.hooks import MAX_SECRET_BYTES, check_secret

    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise _fail(f"--secret-file {path}: not a file")
        if info.st_size > MAX_SECRET_BYTES + 2:
            raise _fail(f"--secret-file {path}: larger than {MAX_SECRET_BYTES} bytes")
        raw = path.read_bytes()
    except OSError as exc:
        raise _fail(f"--secret-file {path}: cannot read it: {exc.strerror}") from None
    if info.st_mode & (stat.S_IRGRP | stat.S_IROTH):
        err(f"warning: --secret-file {path} is readable by other users (chmod 600 it)")
    try:
        return check_secret(raw, where=f"--secret-file {path}").decode("utf-8")
    except TriggerError as exc:
        raise _fail(str(exc)) from None
    except UnicodeDecodeError:
        raise _fail(f"--secret-file {path}: the secret must be text (UTF-8)") from None


def _workload(text: str | None) -> dict[str, Any] | None:
    """--workload: a mapping of templates, as YAML or JSON text, or @file."""
    if text is None:
        return None
    import yaml

    try:
        source = Path(text[1:]).read_text(encoding="utf-8") if text.startswith("@") else text
        value = yaml.safe_load(source)
    except OSError as exc:
        raise _fail(f"--workload {text}: cannot read file: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise _fail(f"--workload is not YAML or JSON: {exc}") from None
    if not isinstance(value, dict):
        raise _fail("--workload must be a mapping (e.g. '{repo: \"{{ hook.body.repo }}\"}')")
    return value


@hook_app.command("add")
def hook_add(
    name: Annotated[str, typer.Argument(help="The hook's name: its URL is /api/hooks/NAME.")],
    playbook: Annotated[
        str,
        typer.Argument(help="Catalog path of the playbook (or, locally, a playbook file)."),
    ],
    secret_file: Annotated[
        Path | None, typer.Option("--secret-file", help="File holding the HMAC secret (chmod 600).")
    ] = None,
    secret_credential: Annotated[
        str | None,
        typer.Option(
            "--secret-credential",
            help="Or: a credential alias whose `secret` (or `value`) field is the secret.",
        ),
    ] = None,
    workload: Annotated[
        str | None,
        typer.Option(
            "--workload",
            help="The run's workload as templates over hook.body, hook.headers,"
            " hook.delivery (YAML/JSON mapping or @file; default: {body, headers, delivery}).",
        ),
    ] = None,
    rate: Annotated[
        str | None,
        typer.Option("--rate", help="Deliveries allowed, e.g. 10/s, 100/m (per server process)."),
    ] = None,
    version: Annotated[
        int | None, typer.Option("--version", help="Catalog version (default: the latest).")
    ] = None,
    home: HomeOpt = None,
    db: DbOpt = None,
    server: HookServerOpt = None,
) -> None:
    """Add a webhook (or replace the one of that name, keeping its id and deliveries)."""
    from flowtide.errors import FlowtideError, exit_code
    from flowtide.triggers.hooks import check_name, parse_rate

    if (secret_file is None) == (secret_credential is None):
        raise _fail("give one of --secret-file, --secret-credential")
    try:
        check_name(name)
        per_second = parse_rate(rate)
    except FlowtideError as exc:
        raise _fail(str(exc)) from None
    template = _workload(workload)
    secret = _secret_file(secret_file) if secret_file is not None else None
    if server:
        body = {
            "name": name,
            "playbook": playbook,
            "version": version,
            "workload": template,
            "rate": per_second,
            "secret": secret,
            "secret_credential": secret_credential,
        }
        with server_client(server) as api:
            remote_or_exit(lambda: api.add_hook(body))
        typer.echo(f"hook '{name}' added on {redact_url(server)}: POST /api/hooks/{name}")
        return
    from flowtide.credentials import CredentialVault
    from flowtide.triggers.hooks import add_hook, credential_secret
    from flowtide.triggers.targets import playbook_ref

    store = open_store(home, db)
    try:
        ref = playbook_ref(playbook, version=version, local=True)
        if "path" in ref:
            store.get_playbook(ref["path"], ref.get("version"))
        if secret_credential is not None:
            body_of = CredentialVault(store, home_dir(home)).resolve(secret_credential)
            raw = credential_secret(body_of, secret_credential)
        else:
            raw = (secret or "").encode()
        add_hook(store, name, ref, secret=raw, workload=template, rate=per_second)
    except FlowtideError as exc:
        err(f"error: {exc}")
        raise typer.Exit(exit_code(exc)) from None
    finally:
        store.close()
    typer.echo(
        f"hook '{name}' added: POST /api/hooks/{name} on `flowtide ui` (or `flowtide"
        " scheduler`) over this store"
    )


def _hooks(home: Path | None, db: str | None, server: str | None) -> list[dict[str, Any]]:
    if server:
        with server_client(server) as api:
            return list(remote_or_exit(api.list_hooks))
    from flowtide.triggers.hooks import HOOK
    from flowtide.web.hooks import hook_item

    store = open_store(home, db)
    try:
        return [dict(hook_item(r)) for r in store.list_triggers(HOOK)]
    finally:
        store.close()


def _when(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds).astimezone().isoformat(timespec="seconds")


def _playbook_text(ref: dict[str, Any]) -> str:
    from flowtide.triggers.targets import ref_text

    return ref_text(ref)


@hook_app.command("list")
def hook_list(
    as_json: JsonOpt = False, home: HomeOpt = None, db: DbOpt = None, server: HookServerOpt = None
) -> None:
    """List webhooks (never their secrets)."""
    from flowtide.triggers.hooks import rate_text

    items = _hooks(home, db, server)
    if as_json:
        print_json(items)
        return
    for h in items:
        typer.echo(
            f"{h['name']}  {_playbook_text(h['playbook'])}  rate {rate_text(h['rate'])}  {h['url']}"
        )


@hook_app.command("show")
def hook_show(
    name: str,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
    server: HookServerOpt = None,
) -> None:
    """A webhook, its latest deliveries and (from a server) the refused ones with why."""
    from flowtide.errors import FlowtideError, exit_code
    from flowtide.triggers.hooks import HOOK, rate_text

    if server:
        with server_client(server) as api:
            doc = dict(remote_or_exit(lambda: api.get_hook(name)))
    else:
        from flowtide.web.hooks import hook_document

        store = open_store(home, db)
        try:
            row = store.get_trigger(HOOK, name)
            # Refusals live in the memory of the process that served the hook.
            doc = dict(hook_document(row, store.firings(row.trigger_id, limit=50), []))
        except FlowtideError as exc:
            err(f"error: {exc}")
            raise typer.Exit(exit_code(exc)) from None
        finally:
            store.close()
    if as_json:
        print_json(doc)
        return
    typer.echo(f"hook      {doc['name']}  (id {doc['trigger_id']})")
    typer.echo(f"url       POST {doc['url']}")
    typer.echo(f"playbook  {_playbook_text(doc['playbook'])}")
    typer.echo(f"rate      {rate_text(doc['rate'])}")
    shape = doc["workload"]
    typer.echo(
        f"workload  {json.dumps(shape) if shape is not None else '{body, headers, delivery}'}"
    )
    typer.echo("secret    kept sealed (never shown)")
    typer.echo(f"deliveries ({len(doc['deliveries'])})")
    for d in doc["deliveries"]:
        typer.echo(f"  {_when(d['time'])}  {d['delivery']}  {d['status']}  {d['execution_id']}")
    if server:
        typer.echo(f"refused ({len(doc['refused'])}, by the server that answered)")
        for r in doc["refused"]:
            typer.echo(f"  {_when(r['time'])}  {r['status']}  {r['why']}")


@hook_app.command("delete")
def hook_delete(
    name: str, home: HomeOpt = None, db: DbOpt = None, server: HookServerOpt = None
) -> None:
    """Delete a webhook (the runs it started stay)."""
    from flowtide.errors import NotFoundError
    from flowtide.triggers.hooks import HOOK

    if server:
        with server_client(server) as api:
            remote_or_exit(lambda: api.delete_hook(name))
        typer.echo(f"hook '{name}' deleted on {redact_url(server)}")
        return
    store = open_store(home, db)
    try:
        store.delete_trigger(HOOK, name)
    except NotFoundError as exc:
        raise _fail(str(exc)) from None
    finally:
        store.close()
    typer.echo(f"hook '{name}' deleted")
