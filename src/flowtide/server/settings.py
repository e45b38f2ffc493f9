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
from flowtide.server.access import DEFAULT_MAX_BODY

__all__ = ["ServerSettings"]


@dataclass
class ServerSettings:
    db: str
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

    @classmethod
    def from_env(cls) -> ServerSettings:
        db = os.environ.get("FLOWTIDE_DB")
        if not db:
            raise FlowtideError("FLOWTIDE_DB must name the PostgreSQL database")
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
            cluster_db=os.environ.get("FLOWTIDE_CLUSTER_DB") or None,
            lease=float(os.environ.get("FLOWTIDE_LEASE", "30")),
            insecure_no_auth=os.environ.get("FLOWTIDE_INSECURE_NO_AUTH") == "1",
            jwt=jwt,
            max_body=int(os.environ.get("FLOWTIDE_MAX_BODY") or DEFAULT_MAX_BODY),
            public_metrics=os.environ.get("FLOWTIDE_PUBLIC_METRICS") == "1",
            nats_auth=NatsAuth.from_env(),
        )
