"""`flowtide server` and `flowtide worker`: the two long-running processes of a
distributed deployment."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from flowtide.cli.options import (
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_OK,
    ClusterDbOpt,
    HomeOpt,
    KvBucketOpt,
    KvOpt,
    NatsCredsOpt,
    ServerUrlOpt,
    ShardListOpt,
    err,
    home_dir,
)
from flowtide.urls import redact_url

if TYPE_CHECKING:
    from flowtide.natsauth import NatsAuth


def _check_nats(url: str, auth: NatsAuth) -> None:
    """Connect to NATS once (waiting while it cannot be reached); exit 1 with the reason
    when it refuses the credentials."""
    import asyncio

    from flowtide.errors import NatsError
    from flowtide.natsauth import connect_nats

    async def probe() -> None:
        nc = await connect_nats(url, auth, name="flowtide-server-check")
        await nc.close()

    try:
        asyncio.run(probe())
    except NatsError as exc:
        err(f"error: {exc}")
        raise typer.Exit(EXIT_FAILED) from None


def _check_advertised(topo: Any, host: str, advertise_url: str | None) -> None:
    """A server of several shards is reached by the others' (they forward requests for
    its executions to it): it needs an address they can use."""
    from flowtide.topology import TopologyError

    if topo.count > 1 and not advertise_url and host in ("0.0.0.0", "::", ""):
        raise TopologyError(
            f"a server of a cluster of {topo.count} shards listening on {host or 'every'}"
            " address needs --advertise-url (FLOWTIDE_ADVERTISE_URL): the URL the other"
            " shards' servers and the workers reach it at"
        )


def _nats_auth(creds: Path | None) -> NatsAuth:
    """NATS credentials from --nats-creds and FLOWTIDE_NATS_USER/PASSWORD; exit 2 when
    they are incomplete or the file is unusable."""
    from flowtide.errors import NatsError
    from flowtide.natsauth import NatsAuth

    auth = NatsAuth.from_env(creds=str(creds) if creds else None)
    try:
        auth.check()
    except NatsError as exc:
        err(f"error: {exc}")
        raise typer.Exit(EXIT_INVALID) from None
    return auth


def server_cmd(
    nats_url: Annotated[
        str,
        typer.Option("--nats", envvar="FLOWTIDE_NATS", help="NATS URL for command notifications."),
    ],
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            envvar="FLOWTIDE_DB",
            help="PostgreSQL URL of the event store (one database; or --shards with"
            " --cluster-db, or a shard map in --cluster-db).",
            show_default=False,
        ),
    ] = None,
    shards: ShardListOpt = None,
    shard_index: Annotated[
        int,
        typer.Option(
            "--shard-index",
            envvar="FLOWTIDE_SHARD_INDEX",
            min=0,
            help="The shard this server serves (0..N-1).",
        ),
    ] = 0,
    advertise_url: Annotated[
        str | None,
        typer.Option(
            "--advertise-url",
            envvar="FLOWTIDE_ADVERTISE_URL",
            help="The URL other servers and workers reach this server at"
            " [default: SCHEME://HOST:PORT].",
            show_default=False,
        ),
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8082,
    workers: Annotated[
        int, typer.Option("--workers", min=1, help="Server processes (all stateless).")
    ] = 1,
    kv: KvOpt = "memory://",
    kv_bucket: KvBucketOpt = "flowtide_state",
    lease: Annotated[
        float,
        typer.Option(
            "--lease", min=1, help="Seconds a claimed command survives without a heartbeat."
        ),
    ] = 30.0,
    cluster_db: ClusterDbOpt = None,
    insecure_no_auth: Annotated[
        bool,
        typer.Option(
            "--insecure-no-auth",
            help="Serve every request without a token: anyone who reaches the port may run "
            "code on the workers. Only for a machine nobody else can reach.",
        ),
    ] = False,
    jwks_url: Annotated[
        str | None,
        typer.Option(
            "--jwks-url",
            envvar="FLOWTIDE_JWKS_URL",
            help="Also accept bearer JWTs signed by a key of this JWKS (single sign-on).",
            show_default=False,
        ),
    ] = None,
    jwt_issuer: Annotated[
        str | None,
        typer.Option("--jwt-issuer", envvar="FLOWTIDE_JWT_ISSUER", help="Required `iss`."),
    ] = None,
    jwt_audience: Annotated[
        str | None,
        typer.Option("--jwt-audience", envvar="FLOWTIDE_JWT_AUDIENCE", help="Required `aud`."),
    ] = None,
    jwt_roles_claim: Annotated[
        str,
        typer.Option(
            "--jwt-roles-claim",
            envvar="FLOWTIDE_JWT_ROLES_CLAIM",
            help="Claim holding the caller's roles or groups (a string or a list).",
        ),
    ] = "flowtide_roles",
    jwt_role: Annotated[
        list[str] | None,
        typer.Option(
            "--jwt-role",
            help="VALUE=ROLE: a value of the roles claim that grants ROLE (repeat it). "
            "Without any, the values must be role names.",
            show_default=False,
        ),
    ] = None,
    jwt_pool_claim: Annotated[
        str,
        typer.Option(
            "--jwt-pool-claim",
            envvar="FLOWTIDE_JWT_POOL_CLAIM",
            help="Claim naming a worker's pool (absent: any pool).",
        ),
    ] = "flowtide_pool",
    max_body: Annotated[
        int,
        typer.Option(
            "--max-body",
            envvar="FLOWTIDE_MAX_BODY",
            min=1024,
            help="Largest request body in bytes; larger ones get 413 unread.",
        ),
    ] = 16 * 1024 * 1024,
    public_metrics: Annotated[
        bool,
        typer.Option("--public-metrics", help="Serve /metrics without a token."),
    ] = False,
    state_cache_mb: Annotated[
        int,
        typer.Option(
            "--state-cache-mb",
            envvar="FLOWTIDE_STATE_CACHE_MB",
            min=1,
            help="Memory for the executions' states each server process keeps (MiB,"
            " estimated): running executions first, finished ones only briefly.",
        ),
    ] = 256,
    tls_cert: Annotated[
        Path | None,
        typer.Option(
            "--tls-cert",
            envvar="FLOWTIDE_TLS_CERT",
            exists=True,
            dir_okay=False,
            help="Serve HTTPS with this certificate (PEM, with its chain).",
            show_default=False,
        ),
    ] = None,
    tls_key: Annotated[
        Path | None,
        typer.Option(
            "--tls-key",
            envvar="FLOWTIDE_TLS_KEY",
            exists=True,
            dir_okay=False,
            help="The certificate's private key (PEM).",
            show_default=False,
        ),
    ] = None,
    client_ca: Annotated[
        Path | None,
        typer.Option(
            "--client-ca",
            envvar="FLOWTIDE_CLIENT_CA",
            exists=True,
            dir_okay=False,
            help="Mutual TLS: require a client certificate signed by this CA (PEM).",
            show_default=False,
        ),
    ] = None,
    nats_creds: NatsCredsOpt = None,
) -> None:
    """Run the API server: executions, events, claims, the outbox relay and the reaper.

    Several processes (or machines) may serve one database: state is the event log in
    PostgreSQL and loop state in the KV (use a nats:// --kv when there is more than one
    process). The schema is upgraded on start.

    Every request but /healthz and /readyz needs a token (`flowtide token create`) or, with
    --jwks-url, a JWT of your identity provider; the server refuses to start when neither
    can authenticate anybody, unless --insecure-no-auth.
    """
    import shutil
    import tempfile

    import uvicorn

    from flowtide.auth.oidc import parse_role_map
    from flowtide.errors import FlowtideError

    if workers > 1 and kv.startswith("memory:"):
        err("error: --workers > 1 needs a shared --kv (nats://...): loop state must be shared")
        raise typer.Exit(EXIT_INVALID)
    try:
        role_map = parse_role_map(jwt_role)
    except FlowtideError as exc:
        err(f"error: {exc}")
        raise typer.Exit(EXIT_INVALID) from None
    if (tls_cert is None) != (tls_key is None) or (client_ca is not None and tls_cert is None):
        err("error: --tls-cert and --tls-key go together, and --client-ca needs both")
        raise typer.Exit(EXIT_INVALID)
    # Where this server's databases are (flowtide.topology), decided here so that a
    # contradiction is one line, not a traceback from every process: what the settings
    # alone say first, what the cluster database's shard map says after the NATS check.
    from flowtide import topology

    try:
        if shards or not (db or cluster_db):
            topo = topology.from_settings(db=db, shards=shards, cluster_db=cluster_db)
            topo.served_shard(shard_index)
            _check_advertised(topo, host, advertise_url)
    except FlowtideError as exc:
        err(f"error: {exc}")
        raise typer.Exit(EXIT_INVALID) from None
    nats_auth = _nats_auth(nats_creds)
    # Refused NATS credentials stop the server here with one line, rather than as a
    # traceback from each of its processes' start-up.
    _check_nats(nats_url, nats_auth)
    try:
        from flowtide.server.vault import server_home

        # The shard map's credentials open with the master key the server processes use.
        topo = topology.load(db=db, shards=shards, cluster_db=cluster_db, home=server_home())
        shard = topo.served_shard(shard_index)
        _check_advertised(topo, host, advertise_url)
    except FlowtideError as exc:
        err(f"error: {exc}")
        invalid = isinstance(exc, topology.TopologyError)
        raise typer.Exit(EXIT_INVALID if invalid else EXIT_FAILED) from None
    scheme = "https" if tls_cert else "http"
    env = {
        "FLOWTIDE_DB": db or "",
        "FLOWTIDE_SHARDS": shards or "",
        "FLOWTIDE_SHARD_INDEX": str(shard_index),
        "FLOWTIDE_ADVERTISE_URL": advertise_url or f"{scheme}://{host}:{port}",
        "FLOWTIDE_NATS": nats_url,
        "FLOWTIDE_KV": kv,
        "FLOWTIDE_KV_BUCKET": kv_bucket,
        "FLOWTIDE_LEASE": str(lease),
        "FLOWTIDE_MAX_BODY": str(max_body),
        "FLOWTIDE_INSECURE_NO_AUTH": "1" if insecure_no_auth else "",
        "FLOWTIDE_PUBLIC_METRICS": "1" if public_metrics else "",
        "FLOWTIDE_STATE_CACHE_MB": str(state_cache_mb),
        "FLOWTIDE_JWKS_URL": jwks_url or "",
        "FLOWTIDE_JWT_ISSUER": jwt_issuer or "",
        "FLOWTIDE_JWT_AUDIENCE": jwt_audience or "",
        "FLOWTIDE_JWT_ROLES_CLAIM": jwt_roles_claim,
        "FLOWTIDE_JWT_ROLES": ",".join(f"{k}={v}" for k, v in role_map.items()),
        "FLOWTIDE_JWT_POOL_CLAIM": jwt_pool_claim,
    }
    if cluster_db:
        env["FLOWTIDE_CLUSTER_DB"] = cluster_db
    # The server processes read their NATS credentials from the environment
    # (ServerSettings.from_env), never from their command line.
    env.update(nats_auth.env())
    # Prometheus multiprocess mode (flowtide.server.metrics): a fresh directory per server
    # run, set before any process imports prometheus_client; old files would be counted.
    metrics_dir = tempfile.mkdtemp(prefix="flowtide-metrics-")
    env["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    os.environ.update(env)
    # Upgrade once here, not racing in N processes (it would be safe, only slower).
    store = _open_shard(shard.dsn, topo.cluster)
    try:
        if not insecure_no_auth and not jwks_url:
            from flowtide.auth.tokens import TokenStore

            if not TokenStore(store).any_active():
                err(
                    "error: no way to authenticate anybody: the database has no active API"
                    " token and no --jwks-url is given. Create the first admin token with\n"
                    f"  flowtide token create --role admin --db {_display(topo.cluster)}\n"
                    "or give --jwks-url, or (on a machine nobody else can reach)"
                    " --insecure-no-auth."
                )
                raise typer.Exit(EXIT_INVALID)
    finally:
        store.close()
    auth = (
        "OFF (--insecure-no-auth)"
        if insecure_no_auth
        else "tokens" + (f" + JWTs of {redact_url(jwks_url)}" if jwks_url else "")
    )
    tls = "mutual TLS" if client_ca else "TLS" if tls_cert else "no TLS"
    err(
        f"flowtide server on {scheme}://{host}:{port} (db {shard.display}, nats"
        f" {redact_url(nats_url)}, authentication: {auth}, {tls})"
    )
    ssl_options: dict[str, Any] = {}
    if tls_cert:
        import ssl

        ssl_options = {"ssl_certfile": str(tls_cert), "ssl_keyfile": str(tls_key)}
        if client_ca:
            ssl_options |= {"ssl_ca_certs": str(client_ca), "ssl_cert_reqs": ssl.CERT_REQUIRED}
    try:
        uvicorn.run(
            "flowtide.server.app:app_factory",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            log_level="warning",
            # Requests in flight get this long to finish on SIGTERM; then open streams
            # (SSE followers, other shards' keep-alive connections) are closed.
            timeout_graceful_shutdown=5,
            **ssl_options,
        )
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


def _display(dsn: str) -> str:
    from flowtide.store.postgres import display_dsn

    return display_dsn(dsn)


def _open_shard(dsn: str, cluster: str) -> Any:
    """The store of this server's shard (and the cluster database), schema upgraded; a
    store that cannot open ends the command."""
    from flowtide.errors import StoreError
    from flowtide.sealing import Sealer
    from flowtide.store.postgres import PostgresStore

    try:
        return PostgresStore(
            dsn, cluster_dsn=None if cluster == dsn else cluster, sealer=Sealer(home_dir(None))
        )
    except StoreError as exc:
        err(f"error: {exc}")
        raise typer.Exit(EXIT_FAILED) from None


def worker_cmd(
    server: ServerUrlOpt,
    nats_url: Annotated[
        str, typer.Option("--nats", envvar="FLOWTIDE_NATS", help="NATS URL (same as the server's).")
    ],
    pool: Annotated[str, typer.Option("--pool", help="Worker pool to serve.")] = "default",
    concurrency: Annotated[
        int, typer.Option("--concurrency", min=1, help="Commands run at once.")
    ] = 8,
    worker_id: Annotated[
        str | None, typer.Option("--worker-id", help="Default: HOSTNAME-PID.")
    ] = None,
    home: HomeOpt = None,
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file",
            help="File holding the worker's token (a `flowtide token create --role worker`);"
            " default: FLOWTIDE_TOKEN, or the file in FLOWTIDE_TOKEN_FILE.",
            show_default=False,
        ),
    ] = None,
    ca: Annotated[
        str | None,
        typer.Option(
            "--ca",
            envvar="FLOWTIDE_CA",
            help="CA file (PEM) that signed an https server's certificate; for mutual TLS"
            " the worker shows FLOWTIDE_CLIENT_CERT / FLOWTIDE_CLIENT_KEY.",
            show_default=False,
        ),
    ] = None,
    nats_creds: NatsCredsOpt = None,
    grace: Annotated[
        float,
        typer.Option(
            "--grace",
            min=0,
            help="On SIGTERM/SIGINT: seconds running commands get to finish; then they are"
            " stopped and handed back to the server for another worker.",
        ),
    ] = 10.0,
    python_isolation: Annotated[
        str,
        typer.Option(
            "--python-isolation",
            envvar="FLOWTIDE_PYTHON_ISOLATION",
            help="process: python steps run in child processes that cancel and timeouts"
            " kill; thread: in the worker process (cannot be stopped).",
        ),
    ] = "process",
    python_user: Annotated[
        str | None,
        typer.Option(
            "--python-user",
            envvar="FLOWTIDE_PYTHON_USER",
            help="User the python child processes run as when the worker runs as root"
            " [default: nobody].",
            show_default=False,
        ),
    ] = None,
    python_memory_mb: Annotated[
        int,
        typer.Option(
            "--python-memory-mb",
            envvar="FLOWTIDE_PYTHON_MEMORY_MB",
            min=0,
            help="Address space of a python child process, MiB (0: no limit).",
        ),
    ] = 2048,
    python_cpu_seconds: Annotated[
        float,
        typer.Option(
            "--python-cpu-seconds",
            envvar="FLOWTIDE_PYTHON_CPU_SECONDS",
            min=0,
            help="CPU seconds one python step may use (0: no limit).",
        ),
    ] = 0.0,
    file_root: Annotated[
        list[str] | None,
        typer.Option(
            "--file-root",
            help="A folder whose files duckdb, transfer and artifact steps and script files"
            " may use (repeat for more; FLOWTIDE_FILE_ROOTS, ':'-separated). Default: the"
            " working directory. The flowtide home is never reachable but for its data"
            " folder. '*': any file the worker's user can reach.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Claim and run commands of one pool until interrupted (SIGINT/SIGTERM: running
    commands get --grace seconds, then are handed back)."""
    import asyncio
    import signal

    from flowtide.auth.login import read_token_file
    from flowtide.errors import AuthError, FlowtideError, NatsError, ToolError
    from flowtide.tools.python_pool import Isolation
    from flowtide.worker import Worker as RemoteWorker

    try:
        python = Isolation(
            mode=python_isolation,
            memory_mb=python_memory_mb or None,
            cpu_seconds=python_cpu_seconds or None,
            user=python_user or None,
            embedded=False,
        )
        token = read_token_file(token_file) if token_file else None
        worker = RemoteWorker(
            server,
            nats_url,
            pool=pool,
            concurrency=concurrency,
            worker_id=worker_id,
            home=home_dir(home),
            token=token,
            nats_auth=_nats_auth(nats_creds),
            ca=ca,
            python=python,
            grace=grace,
            file_roots=file_root or None,
        )
    except FlowtideError as exc:
        err(f"error: {exc}")
        raise typer.Exit(EXIT_INVALID) from None

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, worker.stop)
        await worker.run()

    err(f"flowtide worker {worker.worker_id} (pool {pool}) -> {redact_url(server)}")
    err(f"steps' files: {worker.files.describe()}")
    try:
        try:
            import uvloop
        except ImportError:
            asyncio.run(main())
        else:
            uvloop.run(main())
    except (NatsError, AuthError, ToolError) as exc:
        # Credentials refused (NATS or the API), the pool's consumer out of reach, or
        # python steps unable to start: say which and stop, instead of a traceback.
        err(f"error: {exc}")
        raise typer.Exit(EXIT_FAILED) from None
    if worker.stuck:
        # Threads still in code that cannot be interrupted (their commands were handed
        # back): the interpreter would wait for them at exit.
        from flowtide.tools.registry import cancel_running

        cancel_running(None)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_OK)
