"""The server's settings: what one `flowtide server` process is told.

The `flowtide server` command hands its flags to its processes as the FLOWTIDE_*
variables of the settings tree (`ServerSection`, flowtide.settings), which each process
reads when it starts (`ServerSettings.from_env`), so the processes of `uvicorn --workers
N` share them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flowtide.auth.oidc import JwtSettings, parse_role_map
from flowtide.errors import SettingsError
from flowtide.natsauth import NatsAuth
from flowtide.server.jetstream import StreamLayout
from flowtide.web.access import DEFAULT_MAX_BODY

__all__ = ["DEFAULT_STATE_CACHE_MB", "ServerSettings", "state_cache_bytes"]

#: The default memory budget of the executions' states a server process keeps (MiB):
#: the tree's (flowtide.settings.tree.ServerSection.state_cache_mb).
DEFAULT_STATE_CACHE_MB = 256


def state_cache_bytes() -> int:
    """The state cache's budget in bytes: FLOWTIDE_STATE_CACHE_MB (`flowtide server
    --state-cache-mb`), else DEFAULT_STATE_CACHE_MB.

    Raises:
        SettingsError: not a whole number of MiB, or under 1.
    """
    from flowtide.settings import ServerSection, read

    return read(ServerSection).state_cache_mb * 1024 * 1024


@dataclass
class ServerSettings:
    #: The database of a one-shard cluster (with `cluster_db` if the cluster tables live
    #: apart); None with `shards` or a shard map in `cluster_db` (flowtide.topology).
    db: str | None
    nats: str | None = None
    kv: str = "memory://"
    kv_bucket: str = "flowtide_state"
    cluster_db: str | None = None
    lease: float = 30.0
    reap_interval: float = 2.0
    worker_timeout: float = 30.0
    #: Serve every request without authentication (a trusted machine only; logged).
    insecure_no_auth: bool = False
    #: Bearer JWTs of an identity provider, besides flowtide's own tokens.
    jwt: JwtSettings | None = None
    #: Largest request body taken (bytes); larger ones get 413 before they are read.
    max_body: int = DEFAULT_MAX_BODY
    #: /metrics without a credential (for scrapers that cannot send one).
    public_metrics: bool = False
    #: Fire the schedules this server's shard owns (flowtide.triggers.scheduler).
    scheduler: bool = True
    #: Seconds with nothing in flight before a running execution is re-driven, then
    #: failed as stalled (flowtide.server.stalls); 0: never.
    stalled_after: float = 600.0
    #: Seconds after their end that executions are kept (flowtide.server.retention);
    #: None: forever.
    retention: float | None = None
    #: Credentials of the NATS connections (--nats and a nats:// --kv) when their URLs
    #: carry none.
    nats_auth: NatsAuth = field(default_factory=NatsAuth)
    #: The shard databases, "dsn0;dsn1;..." (FLOWTIDE_SHARDS), with `cluster_db`.
    shards: str | None = None
    #: The shard this process serves (FLOWTIDE_SHARD_INDEX).
    shard_index: int = 0
    #: The URL other servers and workers reach this process at (FLOWTIDE_ADVERTISE_URL).
    advertise_url: str | None = None
    #: The estimated bytes of executions' states this process keeps in memory
    #: (FLOWTIDE_STATE_CACHE_MB; flowtide.server.statecache).
    state_cache_bytes: int = DEFAULT_STATE_CACHE_MB * 1024 * 1024
    #: Replicas, placement, storage and sizes of the streams and the bucket the server
    #: keeps in JetStream (FLOWTIDE_NATS_REPLICAS...; flowtide.server.jetstream).
    nats_layout: StreamLayout = field(default_factory=StreamLayout)

    @classmethod
    def from_env(cls) -> ServerSettings:
        """The settings `flowtide server` handed its processes (flowtide.settings.tree:
        ServerSection and NatsSection).

        Raises:
            SettingsError: a value the tree refuses, or no database named.
        """
        from flowtide.settings import ServerSection, read

        tree = read(ServerSection)
        if not (tree.db or tree.shards or tree.cluster_db):
            raise SettingsError(
                "FLOWTIDE_DB must name the PostgreSQL database (or FLOWTIDE_SHARDS and"
                " FLOWTIDE_CLUSTER_DB the shards and the cluster database)",
                env="FLOWTIDE_DB",
            )
        retention = None
        if tree.retention:
            from flowtide.errors import FlowtideError
            from flowtide.prune import parse_age

            try:
                retention = parse_age(tree.retention)
            except FlowtideError as exc:
                raise SettingsError(str(exc), env="FLOWTIDE_RETENTION") from None
        jwt = None
        if tree.jwks_url:
            jwt = JwtSettings(
                jwks_url=tree.jwks_url,
                issuer=tree.jwt_issuer,
                audience=tree.jwt_audience,
                roles_claim=tree.jwt_roles_claim,
                role_map=parse_role_map(tree.jwt_roles),
                pool_claim=tree.jwt_pool_claim,
            )
        return cls(
            db=tree.db,
            nats=tree.nats,
            kv=tree.kv,
            kv_bucket=tree.kv_bucket,
            cluster_db=tree.cluster_db,
            lease=tree.lease,
            insecure_no_auth=tree.insecure_no_auth,
            jwt=jwt,
            max_body=tree.max_body,
            public_metrics=tree.public_metrics,
            scheduler=tree.scheduler,
            stalled_after=tree.stalled_after,
            retention=retention,
            nats_auth=NatsAuth.from_env(),
            shards=tree.shards,
            shard_index=tree.shard_index,
            advertise_url=tree.advertise_url,
            state_cache_bytes=tree.state_cache_mb * 1024 * 1024,
            nats_layout=StreamLayout.from_tree(tree),
        )
