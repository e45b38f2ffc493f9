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
    default,
    err,
    home_dir,
    setting,
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
    nats_url: Annotated[str, setting("server.nats", "--nats", show_default=True)],
    db: Annotated[str | None, setting("server.db", "--db")] = default("server.db"),
    shards: ShardListOpt = default("server.shards"),
    shard_index: Annotated[int, setting("server.shard_index", "--shard-index")] = default(
        "server.shard_index"
    ),
    advertise_url: Annotated[str | None, setting("server.advertise_url", "--advertise-url")] = (
        default("server.advertise_url")
    ),
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8082,
    workers: Annotated[
        int, typer.Option("--workers", min=1, help="Server processes (all stateless).")
    ] = 1,
    kv: KvOpt = default("server.kv"),
    kv_bucket: KvBucketOpt = default("server.kv_bucket"),
    nats_replicas: Annotated[int, setting("server.nats_replicas", "--nats-replicas")] = default(
        "server.nats_replicas"
    ),
    nats_placement_cluster: Annotated[
        str | None, setting("server.nats_placement_cluster", "--nats-placement-cluster")
    ] = default("server.nats_placement_cluster"),
    nats_placement_tags: Annotated[
        str | None, setting("server.nats_placement_tags", "--nats-placement-tags")
    ] = default("server.nats_placement_tags"),
    nats_storage: Annotated[str, setting("server.nats_storage", "--nats-storage")] = default(
        "server.nats_storage"
    ),
    nats_commands_max_bytes: Annotated[
        int, setting("server.nats_commands_max_bytes", "--nats-commands-max-bytes")
    ] = default("server.nats_commands_max_bytes"),
    nats_logs_max_bytes: Annotated[
        int, setting("server.nats_logs_max_bytes", "--nats-logs-max-bytes")
    ] = default("server.nats_logs_max_bytes"),
    # --lease, --insecure-no-auth and --public-metrics are flags only (env=False), as
    # they always were: the variables carry them to the server's processes.
    lease: Annotated[float, setting("server.lease", "--lease", env=False)] = default(
        "server.lease"
    ),
    cluster_db: ClusterDbOpt = default("server.cluster_db"),
    insecure_no_auth: Annotated[
        bool, setting("server.insecure_no_auth", "--insecure-no-auth", env=False)
    ] = default("server.insecure_no_auth"),
    jwks_url: Annotated[str | None, setting("server.jwks_url", "--jwks-url")] = default(
        "server.jwks_url"
    ),
    jwt_issuer: Annotated[
        str | None, setting("server.jwt_issuer", "--jwt-issuer", show_default=True)
    ] = default("server.jwt_issuer"),
    jwt_audience: Annotated[
        str | None, setting("server.jwt_audience", "--jwt-audience", show_default=True)
    ] = default("server.jwt_audience"),
    jwt_roles_claim: Annotated[str, setting("server.jwt_roles_claim", "--jwt-roles-claim")] = (
        default("server.jwt_roles_claim")
    ),
    jwt_role: Annotated[
        list[str] | None,
        typer.Option(
            "--jwt-role",
            help="VALUE=ROLE: a value of the roles claim that grants ROLE (repeat it). "
            "Without any, the values must be role names.",
            show_default=False,
        ),
    ] = None,
    jwt_pool_claim: Annotated[str, setting("server.jwt_pool_claim", "--jwt-pool-claim")] = (
        default("server.jwt_pool_claim")
    ),
    max_body: Annotated[int, setting("server.max_body", "--max-body")] = default("server.max_body"),
    public_metrics: Annotated[
        bool, setting("server.public_metrics", "--public-metrics", env=False)
    ] = default("server.public_metrics"),
    state_cache_mb: Annotated[int, setting("server.state_cache_mb", "--state-cache-mb")] = (
        default("server.state_cache_mb")
    ),
    sql_strict: Annotated[bool, setting("server.sql_strict", "--sql-strict")] = default(
        "server.sql_strict"
    ),
    scheduler: Annotated[
        bool, setting("server.scheduler", "--scheduler/--no-scheduler", env=False)
    ] = default("server.scheduler"),
    tls_cert: Annotated[
        Path | None, setting("server.tls_cert", "--tls-cert", exists=True, dir_okay=False)
    ] = default("server.tls_cert"),
    tls_key: Annotated[
        Path | None, setting("server.tls_key", "--tls-key", exists=True, dir_okay=False)
    ] = default("server.tls_key"),
    client_ca: Annotated[
        Path | None, setting("server.client_ca", "--client-ca", exists=True, dir_okay=False)
    ] = default("server.client_ca"),
    nats_creds: NatsCredsOpt = default("nats.creds"),
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
    scheme = "https" if tls_cert else "http"
    # The server's processes read the tree from their environment (ServerSettings.from_env):
    # the flags go there as the tree's variables. Read first: a bad setting is one line
    # even when the databases or NATS cannot be reached.
    from flowtide.errors import SettingsError
    from flowtide.settings import ServerSection, read, to_env

    try:
        tree = read(
            ServerSection,
            {},
            db=db,
            shards=shards,
            cluster_db=cluster_db,
            shard_index=shard_index,
            advertise_url=advertise_url or f"{scheme}://{host}:{port}",
            nats=nats_url,
            kv=kv,
            kv_bucket=kv_bucket,
            nats_replicas=nats_replicas,
            nats_placement_cluster=nats_placement_cluster,
            nats_placement_tags=nats_placement_tags,
            nats_storage=nats_storage,
            nats_commands_max_bytes=nats_commands_max_bytes,
            nats_logs_max_bytes=nats_logs_max_bytes,
            lease=lease,
            max_body=max_body,
            insecure_no_auth=insecure_no_auth,
            public_metrics=public_metrics,
            scheduler=scheduler,
            sql_strict=sql_strict,
            state_cache_mb=state_cache_mb,
            jwks_url=jwks_url,
            jwt_issuer=jwt_issuer,
            jwt_audience=jwt_audience,
            jwt_roles_claim=jwt_roles_claim,
            jwt_roles=",".join(f"{k}={v}" for k, v in role_map.items()),
            jwt_pool_claim=jwt_pool_claim,
        )
        from flowtide.server.jetstream import StreamLayout

        StreamLayout.from_tree(tree)  # its refusals as one line here, not per process
    except SettingsError as exc:
        err(f"error: {exc}")
        raise typer.Exit(EXIT_INVALID) from None
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
    # TLS stays with this process (uvicorn's options), not its children's environment.
    env = to_env(tree, only=set(ServerSection.model_fields) - {"tls_cert", "tls_key", "client_ca"})
    if not cluster_db:
        # Unset, as before: an empty variable would say the same.
        env.pop("FLOWTIDE_CLUSTER_DB")
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
    from flowtide.logsetup import config_dict

    try:
        uvicorn.run(
            "flowtide.server.app:app_factory",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            log_level="warning",
            # Every line with its time and level, uvicorn's too, in each of its processes.
            log_config=config_dict("WARNING"),
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
        str, setting("server.nats", "--nats", help="NATS URL (same as the server's).")
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
        setting(
            "client.ca",
            "--ca",
            help="CA file (PEM) that signed an https server's certificate; for mutual TLS"
            " the worker shows FLOWTIDE_CLIENT_CERT / FLOWTIDE_CLIENT_KEY.",
            show_default=False,
        ),
    ] = None,
    nats_creds: NatsCredsOpt = default("nats.creds"),
    grace: Annotated[
        float,
        typer.Option(
            "--grace",
            min=0,
            help="On SIGTERM/SIGINT: seconds running commands get to finish; then they are"
            " stopped and handed back to the server for another worker.",
        ),
    ] = 10.0,
    # A worker runs python steps in child processes unless told otherwise (embedded
    # runs default to threads: flowtide.tools.python_pool.Isolation.from_env).
    python_isolation: Annotated[
        str, setting("python.isolation", "--python-isolation", show_default=True)
    ] = "process",
    python_user: Annotated[str | None, setting("python.user", "--python-user")] = default(
        "python.user"
    ),
    python_memory_mb: Annotated[int, setting("python.memory_mb", "--python-memory-mb", min=0)] = (
        default("python.memory_mb")
    ),
    python_cpu_seconds: Annotated[
        float, setting("python.cpu_seconds", "--python-cpu-seconds", min=0)
    ] = default("python.cpu_seconds"),
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

    from flowtide.hardening import keep_to_ourselves
    from flowtide.logsetup import configure

    configure("WARNING")  # one line each, with its time and level
    # The steps it runs (same user unless it is root) cannot read its environment, memory
    # or attach to it: its token and NATS credentials are its own.
    keep_to_ourselves()
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
        from flowtide import tracing

        tracing.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_OK)
