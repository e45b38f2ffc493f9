"""Opening what a command talks to: the event store, a flowtide server, the KV.

A backend that cannot be opened ends the command with one line on stderr and an exit
code, never a traceback. Every import of a driver happens inside the function that
needs it, so that `flowtide --help` loads none.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from flowtide.cli.options import EXIT_FAILED, EXIT_INVALID, err, home_dir
from flowtide.errors import exit_code
from flowtide.kv.errors import KVUnavailable
from flowtide.urls import redact_url

if TYPE_CHECKING:
    from flowtide.client import ServerClient
    from flowtide.store.base import Store


def open_store(home: Path | None, db: str | None) -> Store:
    """Open the event store `--db` names; a store that cannot open ends the command."""
    from flowtide.errors import StoreError
    from flowtide.sealing import Sealer
    from flowtide.store.postgres import PostgresStore, is_postgres_url
    from flowtide.store.sqlite import SQLiteStore

    # What holds a secret is sealed with the master key the credentials use.
    sealer = Sealer(home_dir(home))
    try:
        if db and is_postgres_url(db):
            return PostgresStore(db, sealer=sealer)
        return SQLiteStore(Path(db) if db else home_dir(home) / "flowtide.db", sealer=sealer)
    except StoreError as exc:
        err(f"error: {exc}")
        raise typer.Exit(EXIT_FAILED) from None


def execution_or_exit(store: Store, execution_id: int) -> Any:
    """The execution's row; exit 2 with a message when there is no such execution."""
    from flowtide.errors import NotFoundError

    try:
        return store.get_execution(execution_id)
    except NotFoundError as exc:
        store.close()
        err(f"error: {exc}")
        raise typer.Exit(exit_code(exc)) from None


def folded(store: Store, execution_id: int) -> tuple[Any, Any]:
    """(execution row, state rebuilt from its event log); exit 2 when there is none."""
    from flowtide.engine.state import fold
    from flowtide.playbook.loader import parse_playbook

    row = execution_or_exit(store, execution_id)
    playbook = parse_playbook(row.playbook_text, row.playbook_file)
    return row, fold(playbook, execution_id, store.events(execution_id))


def server_client(server: str) -> ServerClient:
    """A ServerClient for `server`; a token that cannot be read ends the command (exit 2)."""
    from flowtide.client import ServerClient, ServerError

    try:
        return ServerClient(server)
    except ServerError as exc:
        err(f"error: {exc}")
        raise typer.Exit(EXIT_INVALID) from None


def remote_or_exit(call: Callable[[], Any]) -> Any:
    """`call()` against the server; a refusal or an unreachable server ends the command
    (exit 2 for a 4xx: bad input or unknown id; 1 otherwise)."""
    from flowtide.client import ServerError

    try:
        return call()
    except ServerError as exc:
        err(f"error: {exc}")
        raise typer.Exit(exit_code(exc)) from None


async def open_kv(
    url: str,
    bucket: str,
    *,
    ttl: float | None = 3600.0,
    create: bool = True,
    nats_creds: Path | None = None,
    settings: dict[str, Any] | None = None,
    apply: bool = False,
) -> Any:
    """Connect to bucket `bucket` at `url` (created with `ttl` if missing, when `create`),
    with the NATS credentials of --nats-creds or FLOWTIDE_NATS_USER/PASSWORD.

    `settings` (connect's keyword arguments: history, max_bytes, ...) replace `ttl`
    when given; with `apply` they are changed on an existing bucket (`kv edit`).

    Raises:
        BucketNotFoundError: `create` is False and there is no such bucket.
        KVUnavailable: bad URL or bucket name, server unreachable or refusing.
    """
    from flowtide.kv import BucketNotFoundError, KVError, connect
    from flowtide.natsauth import NatsAuth

    shown = redact_url(url)
    auth = NatsAuth.from_env(creds=str(nats_creds) if nats_creds else None)
    try:
        config = settings if settings is not None else {"ttl": ttl}
        return await connect(url, bucket, create=create, apply=apply, nats_auth=auth, **config)
    except BucketNotFoundError:
        raise  # create=False: the caller says which bucket is missing
    except KVError as exc:
        reason = auth.scrub(exc.message, url)
    except Exception as exc:  # a driver's error the adapter let through
        reason = auth.scrub(f"{type(exc).__name__}: {exc}", url)
    # The adapters' messages mostly name the URL already; say it once.
    if shown in reason:
        raise KVUnavailable(reason)
    raise KVUnavailable(f"cannot open KV bucket {bucket!r} at {shown}: {reason}")


async def close_kv(kv: Any) -> None:
    # The command's outcome is already decided; a handle that fails to close (server
    # gone) must not turn it into an error.
    try:
        await kv.close()
    except Exception:
        pass
