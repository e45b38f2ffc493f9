"""`flowtide token create|list|revoke`: API tokens, through a server (an admin token) or
straight in the cluster database (`--db`: whoever can write the database is admin anyway;
this is how the first admin token is made)."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer

from flowtide.cli.options import EXIT_FAILED, EXIT_INVALID, JsonOpt, setting

__all__ = ["token_app"]

token_app = typer.Typer(
    help=(
        "API tokens for flowtide servers. A token has a role: reader (list, status, "
        "events), operator (+ execute, cancel, vars, catalog register), admin (+ "
        "credentials, keychain, tokens, finalize, workers) or worker (claim and report "
        "commands of its pool). Use --server URL with an admin token, or --db URL to "
        "write the cluster database directly (the first admin token)."
    ),
    no_args_is_help=True,
)

# Tokens live in the cluster database and are managed by admins: these options say so,
# unlike the ones of the same name in `options`.
ServerOpt = Annotated[
    str | None,
    setting(
        "client.server",
        "--server",
        help="flowtide server URL (sends FLOWTIDE_TOKEN: an admin token).",
        show_default=False,
    ),
]
DbOpt = Annotated[
    str | None,
    setting(
        "server.db",
        "--db",
        help="PostgreSQL URL of the server's database (its cluster part: see --cluster-db).",
        show_default=False,
    ),
]
ClusterDbOpt = Annotated[
    str | None,
    setting(
        "server.cluster_db",
        "--cluster-db",
        help="PostgreSQL URL of the cluster tables, when they live apart from --db.",
        show_default=False,
    ),
]


def _fail(message: str, code: int = EXIT_INVALID) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


class _Target:
    """The server's API or the database, whichever the options name."""

    def __init__(self, server: str | None, db: str | None, cluster_db: str | None) -> None:
        if server:
            from flowtide.client import ServerClient, ServerError

            try:
                self.api: Any = ServerClient(server)
            except ServerError as exc:
                raise _fail(str(exc)) from None
            self.tokens: Any = None
            return
        target = cluster_db or db
        if not target:
            raise _fail("give --server URL (with an admin token) or --db postgresql://...")
        from flowtide.store.postgres import is_postgres_url

        if not is_postgres_url(target):
            raise _fail("tokens live in the server's PostgreSQL database: --db postgresql://...")
        from flowtide.auth.tokens import TokenStore
        from flowtide.errors import StoreError
        from flowtide.store.postgres import PostgresStore

        try:
            self.store = PostgresStore(db or target, cluster_dsn=cluster_db, max_size=2)
        except StoreError as exc:
            raise _fail(str(exc)) from None
        self.api = None
        self.tokens = TokenStore(self.store)

    def call(self, via_api: Any, via_db: Any) -> Any:
        from flowtide.errors import FlowtideError

        try:
            if self.api is not None:
                from flowtide.client import ServerError

                try:
                    return via_api(self.api)
                except ServerError as exc:
                    raise _fail(
                        str(exc), EXIT_INVALID if 400 <= exc.status < 500 else EXIT_FAILED
                    ) from None
            return via_db(self.tokens)
        except FlowtideError as exc:
            raise _fail(str(exc)) from None
        finally:
            if self.api is not None:
                self.api.close()
            else:
                self.store.close()


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


@token_app.command("create")
def token_create(
    role: Annotated[
        str, typer.Option("--role", help="reader, operator, admin or worker.", show_default=False)
    ],
    pool: Annotated[
        str | None,
        typer.Option("--pool", help="Worker tokens: the only pool it serves.", show_default=False),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option("--name", help="A name to list and revoke it by.", show_default=False),
    ] = None,
    expires: Annotated[
        str | None,
        typer.Option(
            "--expires", help="Lifetime: 30d, 12h, 90m... (default: never).", show_default=False
        ),
    ] = None,
    server: ServerOpt = None,
    db: DbOpt = None,
    cluster_db: ClusterDbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a token and print it (once: only its hash is stored)."""
    from flowtide.auth.tokens import check_fields, parse_duration
    from flowtide.errors import FlowtideError

    try:
        check_fields(role, pool, name)
        expires_in = parse_duration(expires) if expires else None
    except (FlowtideError, ValueError) as exc:
        raise _fail(str(exc)) from None
    target = _Target(server, db, cluster_db)
    doc = target.call(
        lambda api: api.create_token(role, name=name, pool=pool, expires_in=expires_in),
        lambda tokens: _created(
            *tokens.create(role=role, name=name, pool=pool, expires_in=expires_in)
        ),
    )
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    scope = f", pool {doc['pool']}" if doc.get("pool") else ""
    until = f", expires {_when(doc['expires'])}" if doc.get("expires") else ""
    typer.echo(f"token {doc['name']} ({doc['role']}{scope}{until}), id {doc['id']}:", err=True)
    typer.echo(doc["token"])
    typer.echo("It is shown this once; keep it in a secret store.", err=True)


def _created(text: str, record: Any) -> dict[str, Any]:
    return {**record.to_dict(), "token": text}


@token_app.command("list")
def token_list(
    include_all: Annotated[
        bool, typer.Option("--all", help="Include revoked and expired tokens.")
    ] = False,
    server: ServerOpt = None,
    db: DbOpt = None,
    cluster_db: ClusterDbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List tokens (never their text): id, name, role, pool, expiry, last use."""
    target = _Target(server, db, cluster_db)
    items = target.call(
        lambda api: api.list_tokens(include_inactive=include_all),
        lambda tokens: [r.to_dict() for r in tokens.list(include_inactive=include_all)],
    )
    if as_json:
        typer.echo(json.dumps(items, indent=2))
        return
    for t in items:
        state = "revoked" if t["revoked"] else "active"
        if not t["revoked"] and t["expires"] is not None and t["expires"] <= time.time():
            state = "expired"
        typer.echo(
            f"{t['id']}  {t['name']:<24}  {t['role']:<8}  {t['pool'] or '-':<10}  {state:<7}"
            f"  expires {_when(t['expires'])}  last used {_when(t['last_used'])}"
        )


@token_app.command("revoke")
def token_revoke(
    token: Annotated[str, typer.Argument(help="The token's id or name.")],
    server: ServerOpt = None,
    db: DbOpt = None,
    cluster_db: ClusterDbOpt = None,
) -> None:
    """Revoke a token: servers refuse it within seconds."""
    target = _Target(server, db, cluster_db)
    doc = target.call(
        lambda api: api.revoke_token(token), lambda tokens: tokens.revoke(token).to_dict()
    )
    typer.echo(f"token {doc['name']} ({doc['id']}) revoked")
