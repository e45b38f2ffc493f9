"""The server's settings: what one `flowtide server` process is told.

The `flowtide server` command fills them from flags and FLOWTIDE_* variables
(`ServerSettings.from_env`), so the processes of `uvicorn --workers N` share them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from flowtide.auth.oidc import JwtSettings, parse_role_map
from flowtide.errors import FlowtideError
from flowtide.natsauth import NatsAuth
from flowtide.web.access import DEFAULT_MAX_BODY

__all__ = ["DEFAULT_STATE_CACHE_MB", "ServerSettings", "state_cache_bytes"]

#: The default memory budget of the executions' states a server process keeps (MiB).
DEFAULT_STATE_CACHE_MB = 256


def state_cache_bytes() -> int:
    """The state cache's budget in bytes: FLOWTIDE_STATE_CACHE_MB (`flowtide server
    --state-cache-mb`), else DEFAULT_STATE_CACHE_MB."""
    text = os.environ.get("FLOWTIDE_STATE_CACHE_MB") or str(DEFAULT_STATE_CACHE_MB)
    try:
        mb = int(text)
    except ValueError:
        raise FlowtideError(
            f"FLOWTIDE_STATE_CACHE_MB must be a whole number of MiB, not {text!r}"
        ) from None
    if mb < 1:
        raise FlowtideError(f"FLOWTIDE_STATE_CACHE_MB must be at least 1, not {mb}")
    return mb * 1024 * 1024


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

    @classmethod
    def from_env(cls) -> ServerSettings:
        db = os.environ.get("FLOWTIDE_DB") or None
        shards = os.environ.get("FLOWTIDE_SHARDS") or None
        cluster_db = os.environ.get("FLOWTIDE_CLUSTER_DB") or None
        if not (db or shards or cluster_db):
            raise FlowtideError(
                "FLOWTIDE_DB must name the PostgreSQL database (or FLOWTIDE_SHARDS and"
                " FLOWTIDE_CLUSTER_DB the shards and the cluster database)"
            )
        try:
            shard_index = int(os.environ.get("FLOWTIDE_SHARD_INDEX") or 0)
        except ValueError:
            raise FlowtideError("FLOWTIDE_SHARD_INDEX must be a shard index (0, 1, ...)") from None
        jwks = os.environ.get("FLOWTIDE_JWKS_URL") or None
        jwt = None
        if jwks:
            jwt = JwtSettings(
                jwks_url=jwks,
                issuer=os.environ.get("FLOWTIDE_JWT_ISSUER") or None,
                audience=os.environ.get("FLOWTIDE_JWT_AUDIENCE") or None,
                roles_claim=os.environ.get("FLOWTIDE_JWT_ROLES_CLAIM") or "flowtide_roles",
                role_map=parse_role_map(os.environ.get("FLOWTIDE_JWT_ROLES")),
                pool_claim=os.environ.get("FLOWTIDE_JWT_POOL_CLAIM") or "flowtide_pool",
            )
        return cls(
            db=db,
            nats=os.environ.get("FLOWTIDE_NATS") or None,
            kv=os.environ.get("FLOWTIDE_KV", "memory://"),
            kv_bucket=os.environ.get("FLOWTIDE_KV_BUCKET", "flowtide_state"),
            cluster_db=cluster_db,
            lease=float(os.environ.get("FLOWTIDE_LEASE", "30")),
            insecure_no_auth=os.environ.get("FLOWTIDE_INSECURE_NO_AUTH") == "1",
            jwt=jwt,
            max_body=int(os.environ.get("FLOWTIDE_MAX_BODY") or DEFAULT_MAX_BODY),
            public_metrics=os.environ.get("FLOWTIDE_PUBLIC_METRICS") == "1",
            nats_auth=NatsAuth.from_env(),
            shards=shards,
            shard_index=shard_index,
            advertise_url=os.environ.get("FLOWTIDE_ADVERTISE_URL") or None,
            state_cache_bytes=state_cache_bytes(),
        )
