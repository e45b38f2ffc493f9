"""`flowtide credential set|list|delete|rotate-key`: credential aliases, encrypted at rest
with the master key, in the local store or (with --server) on a server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from flowtide.cli.backends import open_store, remote_or_exit, server_client
from flowtide.cli.options import (
    EXIT_FAILED,
    EXIT_INVALID,
    DbOpt,
    HomeOpt,
    JsonOpt,
    err,
    home_dir,
    print_json,
)
from flowtide.urls import redact_url

credential_app = typer.Typer(
    help="Store credential aliases (encrypted at rest).", no_args_is_help=True
)

CredServerOpt = Annotated[
    str | None,
    typer.Option(
        "--server",
        help="Store it on this flowtide server (the server encrypts it; needs an admin "
        "FLOWTIDE_TOKEN) instead of --db / the local store.",
        show_default=False,
    ),
]


@credential_app.command("set")
def credential_set(
    name: Annotated[str, typer.Argument(help="Alias used in playbooks (auth: NAME).")],
    body: Annotated[
        str, typer.Option("--json", help="Credential body as a JSON object (or @file).")
    ],
    kind: Annotated[str, typer.Option(help="Credential kind, e.g. postgres, http.")] = "generic",
    home: HomeOpt = None,
    db: DbOpt = None,
    server: CredServerOpt = None,
) -> None:
    """Store (or replace) a credential alias, encrypted with the master key."""
    from flowtide.credentials import CredentialVault

    try:
        text = Path(body[1:]).read_text(encoding="utf-8") if body.startswith("@") else body
    except OSError as exc:
        err(f"error: --json {body}: cannot read file: {exc.strerror}")
        raise typer.Exit(EXIT_INVALID) from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        err(f"error: --json is not valid JSON: {exc}")
        raise typer.Exit(EXIT_INVALID) from None
    if not isinstance(data, dict):
        err("error: --json must be a JSON object")
        raise typer.Exit(EXIT_INVALID)
    if server:
        with server_client(server) as api:
            reply = remote_or_exit(lambda: api.set_credential(name, data, kind))
        typer.echo(f"credential '{name}' stored on {redact_url(server)}")
        # The server names the fields too weak to be masked (never their values).
        warnings = reply.get("warnings") if isinstance(reply, dict) else None
        for warning in warnings if isinstance(warnings, list) else ():
            err(f"warning: {warning}")
        return
    from flowtide.redaction import weak_fields, weak_message

    store = open_store(home, db)
    CredentialVault(store, home_dir(home)).set(name, data, kind=kind)
    store.close()
    typer.echo(f"credential '{name}' stored")
    for field, reason in weak_fields(data):
        err(f"warning: {weak_message(name, field, reason)}")


@credential_app.command("list")
def credential_list(
    as_json: JsonOpt = False, home: HomeOpt = None, db: DbOpt = None, server: CredServerOpt = None
) -> None:
    """List credential aliases (never their values)."""
    if server:
        with server_client(server) as api:
            rows = remote_or_exit(api.list_credentials)
    else:
        store = open_store(home, db)
        rows = store.list_credentials()
        store.close()
    if as_json:
        print_json(rows)
        return
    for r in rows:
        typer.echo(f"{r['name']}  {r['kind']}")


@credential_app.command("delete")
def credential_delete(
    name: str, home: HomeOpt = None, db: DbOpt = None, server: CredServerOpt = None
) -> None:
    """Delete a credential alias."""
    from flowtide.errors import NotFoundError

    if server:
        with server_client(server) as api:
            remote_or_exit(lambda: api.delete_credential(name))
        typer.echo(f"credential '{name}' deleted on {redact_url(server)}")
        return

    store = open_store(home, db)
    try:
        store.delete_credential(name)
    except NotFoundError as exc:
        err(f"error: {exc}")
        raise typer.Exit(EXIT_INVALID) from None
    finally:
        store.close()
    typer.echo(f"credential '{name}' deleted")


@credential_app.command("rotate-key")
def credential_rotate_key(
    home: HomeOpt = None,
    db: DbOpt = None,
    retire: Annotated[
        bool,
        typer.Option(
            "--retire",
            help="Second step: re-encrypt once more with the newest key and drop the older"
            " ones (run it when every process has the new key).",
        ),
    ] = False,
    new_key_file: Annotated[
        Path | None,
        typer.Option(
            "--new-key-file",
            help="Where the keys go when they are in FLOWTIDE_MASTER_KEY (default:"
            " HOME/master.key.new); with the key file, the file itself is updated.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Re-encrypt every credential, keychain entry and sealed value with a new master key.

    Two steps, so that nothing is ever unreadable: `rotate-key` makes a new key, puts it
    first (it encrypts from now on) and keeps the old ones for decryption only; once every
    process has the new key, `rotate-key --retire` re-encrypts what was sealed meanwhile
    and drops the old keys. Run it where the store's master key is (the server's machine
    for --db postgresql://)."""
    from flowtide.credentials import MASTER_KEY_ENV, CredentialVault
    from flowtide.errors import CredentialError, StoreError

    store = open_store(home, db)
    try:
        done = CredentialVault(store, home_dir(home)).rotate_key(new_key_file, retire=retire)
    except (CredentialError, StoreError) as exc:
        err(f"error: {exc}")
        raise typer.Exit(EXIT_FAILED) from None
    finally:
        store.close()
    typer.echo(f"{done.resealed} sealed values re-encrypted with the newest master key")
    if done.from_env:
        typer.echo(
            f"the keys are in {done.key_file} (mode 0600, {done.keys} of them): put its"
            f" lines, comma-separated, in {MASTER_KEY_ENV} of every process that reads"
            " credentials, then delete the file"
        )
    else:
        typer.echo(f"the key file {done.key_file} holds {done.keys} key(s)")
    if not retire:
        typer.echo(
            "the old keys still decrypt; once every process has the new one, run"
            " `flowtide credential rotate-key --retire`"
        )
