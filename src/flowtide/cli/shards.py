"""`flowtide shards`: where executions live when the event log is split over N shards."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from flowtide.cli.options import EXIT_FAILED, EXIT_INVALID, JsonOpt, print_json, setting

__all__ = ["shards_app"]

shards_app = typer.Typer(
    help=(
        "Shards: N PostgreSQL databases that each hold a slice of the executions, chosen "
        "by shard_for(execution_id, N) = xxHash64 (seed 0) of the id's 8 little-endian "
        "bytes, modulo N (NoETL's function). The map of where they are is either "
        "FLOWTIDE_SHARDS ('dsn0;dsn1;...') or the cluster database's shard map, which "
        "add, set and list manage."
    ),
    no_args_is_help=True,
)


def _count_from_env() -> int | None:
    """N from FLOWTIDE_SHARDS (`dsn0;dsn1;...`), when set."""
    from flowtide.settings import ServerSection, read

    raw = read(ServerSection).shards or ""
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


_ClusterOpt = Annotated[
    str | None,
    setting(
        "server.cluster_db",
        "--cluster-db",
        help="PostgreSQL URL of the cluster database, which holds the shard map [default: --db].",
        show_default=False,
    ),
]
_DbOpt = Annotated[
    str | None,
    setting(
        "server.db",
        "--db",
        help="PostgreSQL URL of the database holding the cluster tables, when no"
        " --cluster-db is given.",
        show_default=False,
    ),
]


def _cluster(cluster_db: str | None, db: str | None) -> str:
    from flowtide.store.postgres import is_postgres_url

    dsn = cluster_db or db
    if not dsn or not is_postgres_url(dsn):
        typer.echo(
            "error: the shard map lives in the cluster database: give --cluster-db URL"
            " (FLOWTIDE_CLUSTER_DB), a postgresql:// URL",
            err=True,
        )
        raise typer.Exit(EXIT_INVALID)
    return dsn


def _connect(dsn: str) -> Any:
    """A connection to the cluster database, its cluster schema brought up to date (the
    shard map arrived in cluster version 6)."""
    import psycopg

    from flowtide.errors import StoreError
    from flowtide.store import pgschema
    from flowtide.store.postgres import display_dsn
    from flowtide.urls import scrub_url

    where = display_dsn(dsn)
    try:
        conn = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        typer.echo(f"error: {where}: {scrub_url(str(exc), dsn)}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    try:
        pgschema.upgrade(conn, [pgschema.CLUSTER], where=where)
    except StoreError as exc:
        conn.close()
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    return conn


def _check_credential(conn: Any, alias: str) -> None:
    from flowtide.store import pg

    if not pg.credentials.Credentials(conn).exists(alias):
        typer.echo(
            f"error: no credential {alias!r} in the cluster database: store the shard's login"
            f" first (`flowtide credential set {alias} --kind postgres --json"
            ' \'{"user": ..., "password": ...}\' --db CLUSTER_URL`)',
            err=True,
        )
        raise typer.Exit(EXIT_INVALID)


@shards_app.command("add")
def add_cmd(
    index: Annotated[int, typer.Argument(min=0, help="The shard's index (0..N-1).")],
    host: Annotated[str, typer.Option("--host", help="Host of the shard's PostgreSQL.")],
    database: Annotated[str, typer.Option("--database", help="The shard's database name.")],
    credential: Annotated[
        str,
        typer.Option(
            "--credential",
            help="Alias of the credential (`user`, `password`) the servers log in with:"
            " the password stays in the encrypted credential store.",
        ),
    ],
    port: Annotated[int, typer.Option("--port", min=1, max=65535)] = 5432,
    cluster_db: _ClusterOpt = None,
    db: _DbOpt = None,
) -> None:
    """Add shard INDEX to the cluster database's shard map (the servers read it
    when FLOWTIDE_SHARDS is not set)."""
    from flowtide.store import pg

    with _connect(_cluster(cluster_db, db)) as conn:
        _check_credential(conn, credential)
        if not pg.shards.add(conn, index, host, port, database, credential):
            typer.echo(
                f"error: shard {index} is in the map already: change it with"
                f" `flowtide shards set {index} ...`",
                err=True,
            )
            raise typer.Exit(EXIT_INVALID)
        indexes = [e.shard_index for e in pg.shards.endpoints(conn)]
    typer.echo(f"shard {index}: {host}:{port}/{database} (login {credential!r})")
    if indexes != list(range(len(indexes))):
        typer.echo(
            f"note: the active shards are {indexes}; servers start once they are 0..N-1",
            err=True,
        )


@shards_app.command("set")
def set_cmd(
    index: Annotated[int, typer.Argument(min=0, help="The shard's index.")],
    host: Annotated[str | None, typer.Option("--host", show_default=False)] = None,
    port: Annotated[int | None, typer.Option("--port", min=1, max=65535)] = None,
    database: Annotated[str | None, typer.Option("--database", show_default=False)] = None,
    credential: Annotated[str | None, typer.Option("--credential", show_default=False)] = None,
    active: Annotated[
        bool | None,
        typer.Option(
            "--active/--inactive",
            help="Whether servers use this row (a shard moved to a new endpoint: add"
            " nothing, set its host/port).",
            show_default=False,
        ),
    ] = None,
    cluster_db: _ClusterOpt = None,
    db: _DbOpt = None,
) -> None:
    """Change shard INDEX's endpoint, login or state in the shard map."""
    from flowtide.store import pg

    changes = {
        k: v
        for k, v in {
            "host": host,
            "port": port,
            "database": database,
            "credential": credential,
            "active": active,
        }.items()
        if v is not None
    }
    if not changes:
        typer.echo(
            "error: nothing to change: give --host, --port, --database,"
            " --credential or --active/--inactive",
            err=True,
        )
        raise typer.Exit(EXIT_INVALID)
    with _connect(_cluster(cluster_db, db)) as conn:
        if credential is not None:
            _check_credential(conn, credential)
        if not pg.shards.update(conn, index, changes):
            typer.echo(f"error: no shard {index} in the map (`flowtide shards list`)", err=True)
            raise typer.Exit(EXIT_INVALID)
    typer.echo(f"shard {index}: " + ", ".join(f"{k} {v}" for k, v in changes.items()))


@shards_app.command("list")
def list_cmd(
    cluster_db: _ClusterOpt = None,
    db: _DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show the cluster database's shard map (credential aliases, never passwords)."""
    from flowtide.store import pg

    with _connect(_cluster(cluster_db, db)) as conn:
        rows = pg.shards.endpoints(conn, active_only=False)
    if as_json:
        print_json([r.as_dict() for r in rows])
        return
    if not rows:
        typer.echo("no shard map: one database (or FLOWTIDE_SHARDS) holds the executions")
        return
    for r in rows:
        state = "active" if r.active else "inactive"
        typer.echo(
            f"shard {r.shard_index}  {r.host}:{r.port}/{r.database}"
            f"  login {r.credential!r}  {state}"
        )


def _parse_backends(given: list[str]) -> dict[int, list[str]]:
    backends: dict[int, list[str]] = {}
    for item in given:
        index, sep, url = item.partition("=")
        if not sep or not index.strip().isdigit() or not url.strip():
            typer.echo(
                f"error: --backend {item!r}: expected SHARD=URL (0=http://h0:8082)", err=True
            )
            raise typer.Exit(EXIT_INVALID)
        backends.setdefault(int(index), []).append(url.strip())
    return backends


def _registered_backends(cluster: str) -> dict[int, list[str]]:
    """The live servers of the cluster database's registry, by shard."""
    from flowtide.server.servers import FORGET_AFTER, LIVE_WITHIN
    from flowtide.store import pg

    with _connect(cluster) as conn:
        rows = pg.servers.live(conn, LIVE_WITHIN, forget_after=FORGET_AFTER)
    backends: dict[int, list[str]] = {}
    for row in rows:
        if row.url:
            backends.setdefault(row.shard_index, []).append(row.url)
    if not backends:
        typer.echo(
            "error: no live server has registered in the cluster database: start them, or"
            " name them with --backend SHARD=URL",
            err=True,
        )
        raise typer.Exit(EXIT_INVALID)
    return backends


@shards_app.command("gateway-config")
def gateway_config_cmd(
    out: Annotated[
        Path,
        typer.Option("--out", help="Folder to write haproxy.cfg and flowtide_shard.lua into."),
    ],
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="The gateway: haproxy (HAProxy 2.x with Lua) or nginx (with the njs"
            " module, libnginx-mod-http-js).",
        ),
    ] = "haproxy",
    backend: Annotated[
        list[str] | None,
        typer.Option(
            "--backend",
            help="SHARD=URL of a server of that shard (repeat; several per shard are"
            " balanced). Default: the live servers registered in the cluster database.",
            show_default=False,
        ),
    ] = None,
    listen: Annotated[
        str, typer.Option("--listen", help="Address:port the gateway listens on.")
    ] = "127.0.0.1:8080",
    ca: Annotated[
        Path | None,
        typer.Option(
            "--ca", help="CA file that signed https backends' certificates.", show_default=False
        ),
    ] = None,
    njs_module: Annotated[
        str,
        typer.Option("--njs-module", help="nginx only: the njs module's file."),
    ] = "/usr/lib/nginx/modules/ngx_http_js_module.so",
    cluster_db: _ClusterOpt = None,
    db: _DbOpt = None,
) -> None:
    """Write a gateway configuration that sends each request to the shard it is for, by
    the servers' own rule, first match wins: the execution id in the path, the
    X-Flowtide-Shard header (a shard index), the X-Flowtide-Execution header (an id),
    hashed with the same function as the servers. Other requests, and an invalid
    X-Flowtide-Shard, go to any server."""
    from flowtide import gateway

    if fmt not in ("haproxy", "nginx"):
        typer.echo(f"error: --format {fmt!r}: expected haproxy or nginx", err=True)
        raise typer.Exit(EXIT_INVALID)
    backends = (
        _parse_backends(backend) if backend else _registered_backends(_cluster(cluster_db, db))
    )
    out.mkdir(parents=True, exist_ok=True)
    try:
        if fmt == "haproxy":
            script = (out / gateway.LUA_FILE).absolute()
            config_file = out / "haproxy.cfg"
            config = gateway.haproxy_config(
                backends,
                listen=listen,
                lua_path=str(script),
                ca_file=str(ca.absolute()) if ca else None,
            )
            source = gateway.lua_source(len(backends))
            run = f"haproxy -f {config_file}"
        else:
            script = (out / gateway.JS_FILE).absolute()
            config_file = out / "nginx.conf"
            config = gateway.nginx_config(
                backends, listen=listen, js_path=str(script), njs_module=njs_module
            )
            source = gateway.njs_source(len(backends))
            run = f"nginx -c {config_file.absolute()}"
    except gateway.GatewayError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_INVALID) from None
    script.write_text(source)
    config_file.write_text(config)
    typer.echo(
        f"wrote {config_file} and {script} ({len(backends)} shard"
        f"{'s' if len(backends) != 1 else ''}); run: {run}"
    )
