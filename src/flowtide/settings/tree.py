"""Every setting of flowtide, declared once: its type, default, bounds, one line of help,
and the environment variable it is read from.

A section is a `BaseSettings` class; a setting's variable is the section's prefix and
the field's name in capitals (`LimitsSection.max_result_bytes` ->
FLOWTIDE_MAX_RESULT_BYTES). The few names that are older than the tree and do not follow
the rule say so with `env=` (`validation_alias`), so that every documented variable
keeps working.

Empty values count as unset (as `os.environ.get(...) or default` did). A flag is `1`
(on) or `0` / empty (off): anything else is refused, never silently off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = [
    "SECTIONS",
    "ClientSection",
    "FaultsSection",
    "Flag",
    "HomeSection",
    "HooksSection",
    "LimitsSection",
    "NatsSection",
    "NotifySection",
    "PythonSection",
    "ServerSection",
    "SessionSection",
    "SparkSection",
    "setting",
]

MIB = 1024 * 1024


def _flag(value: Any) -> Any:
    """`1` on, `0` or empty off; the exact words the server's variables took."""
    if isinstance(value, bool):
        return value
    text = str(value).strip()
    if text in ("1", "0", ""):
        return text == "1"
    raise ValueError("must be 1 (on) or 0 (off)")


#: A switch set as `1` (the `flowtide server` flags hand their processes `1` or nothing).
Flag = Annotated[bool, BeforeValidator(_flag)]


def setting(default: Any, description: str, *, env: str | None = None, **bounds: Any) -> Any:
    """A setting's declaration: its default, one line of help, its bounds (`ge`, `le`...)
    and, only for a name older than the tree, the variable it is read from."""
    return Field(default, description=description, validation_alias=env, **bounds)


def _config(prefix: str) -> SettingsConfigDict:
    return SettingsConfigDict(
        env_prefix=prefix,
        env_ignore_empty=True,
        extra="ignore",
        frozen=True,
        case_sensitive=False,
        populate_by_name=True,
        # "FLOWTIDE_TOKEN= abc " is abc, as `.strip()` made it before the tree.
        str_strip_whitespace=True,
    )


class ServerSection(BaseSettings):
    """`flowtide server`: where its databases, NATS and loop state are, who may call it."""

    model_config = _config("FLOWTIDE_")

    db: str | None = setting(
        None,
        "PostgreSQL URL of the event store (one database; or --shards with --cluster-db,"
        " or a shard map in --cluster-db).",
    )
    shards: str | None = setting(
        None,
        "The shard databases, 'dsn0;dsn1;...' (shard i is the i-th), with --cluster-db for"
        " the cluster tables. Without it, the cluster database's shard map (`flowtide"
        " shards add`), else --db alone.",
    )
    cluster_db: str | None = setting(
        None,
        "PostgreSQL URL of the cluster-wide tables (catalog, credentials), when they live"
        " apart from --db.",
    )
    shard_index: int = setting(0, "The shard this server serves (0..N-1).", ge=0)
    advertise_url: str | None = setting(
        None,
        "The URL other servers and workers reach this server at [default: SCHEME://HOST:PORT].",
    )
    nats: str | None = setting(None, "NATS URL for command notifications.")
    kv: str = setting(
        "memory://",
        "Key-value store for loop state: memory:// (inside this process) or"
        " nats://[USER:PASS@]HOST:PORT (a NATS JetStream server, shared by every process"
        " that points at it; look inside with `flowtide kv`).",
    )
    kv_bucket: str = setting("flowtide_state", "Bucket for loop state (created if missing).")
    nats_replicas: int = setting(
        1,
        "JetStream replicas of what the server creates on NATS (the command stream, the log"
        " stream, the loop-state bucket): 1, 3 or 5; more than 1 needs a NATS cluster of at"
        " least as many nodes. A changed value is applied to existing ones at start.",
        ge=1,
        le=5,
    )
    nats_placement_cluster: str | None = setting(
        None,
        "Put them in this NATS cluster (its `cluster.name`) [default: where JetStream chooses].",
    )
    nats_placement_tags: str | None = setting(
        None, "Put them on NATS nodes having all these tags (`server_tags`), comma-separated."
    )
    nats_storage: str = setting(
        "file",
        "JetStream storage of the command stream and the loop-state bucket: file or memory"
        " (memory: lost when every replica's node restarts). Fixed once they exist.",
        pattern="^(file|memory)$",
    )
    nats_commands_max_bytes: int = setting(
        -1,
        "Largest size of the command stream in bytes (-1: no limit); when full, the outbox"
        " keeps the commands until there is room.",
        ge=-1,
        le=2**63 - 1,
    )
    nats_logs_max_bytes: int = setting(
        256 * MIB,
        "Largest size of the log stream (the steps' live output) in bytes; the oldest go first.",
        ge=1024 * 1024,
        le=2**63 - 1,
    )
    lease: float = setting(30.0, "Seconds a claimed command survives without a heartbeat.", ge=1)
    insecure_no_auth: Flag = setting(
        False,
        "Serve every request without a token: anyone who reaches the port may run code on"
        " the workers. Only for a machine nobody else can reach.",
    )
    max_body: int = setting(
        16 * MIB, "Largest request body in bytes; larger ones get 413 unread.", ge=1024
    )
    public_metrics: Flag = setting(False, "Serve /metrics without a token.")
    retention: str | None = setting(
        None,
        "Remove executions of this server's shard that ended longer ago than this (30d,"
        " 12h, 2w), with their events, commands and deliveries, once an hour (`flowtide gc`"
        " on the shard). Unset: kept forever.",
    )
    stalled_after: float = setting(
        600.0,
        "Seconds a running execution may have nothing in flight (no command issued or"
        " claimed, nothing to publish, no event) before the server re-drives it once and,"
        " if that gives it nothing to do, fails it (error kind stalled). 0: never.",
        ge=0,
    )
    scheduler: Flag = setting(
        True,
        "Fire the schedules this server's shard owns (every server does; each slot starts"
        " one run however many race).",
    )
    state_cache_mb: int = setting(
        256,
        "Memory for the executions' states each server process keeps (MiB, estimated):"
        " running executions first, finished ones only briefly.",
        ge=1,
    )
    jwks_url: str | None = setting(
        None, "Also accept bearer JWTs signed by a key of this JWKS (single sign-on)."
    )
    jwt_issuer: str | None = setting(None, "Required `iss`.")
    jwt_audience: str | None = setting(None, "Required `aud`.")
    jwt_roles_claim: str = setting(
        "flowtide_roles", "Claim holding the caller's roles or groups (a string or a list)."
    )
    jwt_roles: str | None = setting(
        None,
        "VALUE=ROLE,...: the values of the roles claim that grant each role (--jwt-role)."
        " Without any, the values must be role names.",
    )
    jwt_pool_claim: str = setting(
        "flowtide_pool", "Claim naming a worker's pool (absent: any pool)."
    )
    sql_strict: Flag = setting(
        False,
        "Refuse playbooks that paste a template into SQL text (as `flowtide validate"
        " --strict`): at catalog registration and at /api/execute with an inline playbook.",
    )
    tls_cert: Path | None = setting(
        None, "Serve HTTPS with this certificate (PEM, with its chain)."
    )
    tls_key: Path | None = setting(None, "The certificate's private key (PEM).")
    client_ca: Path | None = setting(
        None, "Mutual TLS: require a client certificate signed by this CA (PEM)."
    )


class NatsSection(BaseSettings):
    """Credentials of NATS connections whose URL carries none (flowtide.natsauth)."""

    model_config = _config("FLOWTIDE_NATS_")

    user: str | None = setting(None, "NATS user (with FLOWTIDE_NATS_PASSWORD).")
    password: str | None = setting(None, "The NATS user's password.", repr=False)
    creds: str | None = setting(
        None,
        "NATS .creds file (user JWT + nkey seed) for NATS URLs without user:password@; or"
        " set FLOWTIDE_NATS_USER and FLOWTIDE_NATS_PASSWORD.",
    )
    ca: str | None = setting(
        None, "PEM file of the CA(s) that sign the NATS servers' certificates."
    )


class LimitsSection(BaseSettings):
    """How large a result or a response may be."""

    model_config = _config("FLOWTIDE_")

    max_result_bytes: int = setting(
        4 * MIB,
        "Largest result recorded in events, as JSON; a bigger one is stored by reference.",
        ge=0,
    )
    max_stored_result_bytes: int = setting(
        512 * MIB, "Largest result stored by reference (JSON bytes).", ge=0
    )
    inline_max_bytes: int = setting(
        64 * 1024,
        "Inline limit of a step that declares `output` (NoETL's NOETL_INLINE_MAX_BYTES).",
        ge=0,
    )
    http_max_response_bytes: int = setting(
        256 * MIB, "Largest HTTP response body a `kind: http` step reads by default.", ge=0
    )


class PythonSection(BaseSettings):
    """How python steps run (flowtide.tools.python_pool)."""

    model_config = _config("FLOWTIDE_PYTHON_")

    isolation: str | None = setting(
        None,
        "process: python steps run in child processes that cancel and timeouts kill;"
        " thread: in the worker process (cannot be stopped).",
    )
    user: str | None = setting(
        None,
        "User the python child processes run as when the worker runs as root [default: nobody].",
    )
    # No lower bound: 0 or less has always meant no limit.
    memory_mb: int = setting(2048, "Address space of a python child process, MiB (0: no limit).")
    cpu_seconds: float = setting(0.0, "CPU seconds one python step may use (0: no limit).")


class SparkSection(BaseSettings):
    """Where spark steps run and what they load (flowtide.spark)."""

    model_config = _config("FLOWTIDE_SPARK_")

    master: str | None = setting(
        None,
        "Where spark steps run: local[*] (default), sc://HOST:PORT (Spark Connect),"
        " spark://HOST:PORT, k8s://..., yarn. Wins over the playbook's"
        " executor.spark.master.",
    )
    jars: str | None = setting(
        None, "Jars for the SparkSession, ','- or os.pathsep-separated (default: the JDBC driver)."
    )
    data_dir: str | None = setting(None, "Where spark steps write their datasets.")


class ClientSection(BaseSettings):
    """How the CLI and workers reach a flowtide server."""

    model_config = _config("FLOWTIDE_")

    server: str | None = setting(None, "flowtide server URL.")
    token: str | None = setting(None, "API token sent to the server.", repr=False)
    token_file: str | None = setting(None, "File holding the API token.")
    ca: str | None = setting(None, "CA file (PEM) that signed an https server's certificate.")
    client_cert: str | None = setting(
        None, "Client certificate (PEM) shown to a server that requires mutual TLS."
    )
    client_key: str | None = setting(None, "The client certificate's private key (PEM).")


class HomeSection(BaseSettings):
    """Where a process keeps its state, and what each process of it is."""

    model_config = _config("FLOWTIDE_")

    home: Path | None = setting(
        None,
        "State folder (default: the nearest .flowtide folder from the working directory up,"
        " else ~/.local/share/flowtide).",
    )
    master_key: str | None = setting(
        None,
        "Fernet key(s) that seal credentials, comma-separated (default: HOME/master.key).",
        repr=False,
    )
    file_roots: str | None = setting(
        None,
        "Folders a worker's steps may use, os.pathsep-separated ('*': any); default: the"
        " working directory.",
    )
    result_store: str | None = setting(
        None, "Folder or fsspec URL where results stored by reference go (one folder per tier)."
    )
    result_store_kv: str | None = setting(None, "Location of the kv tier of stored results.")
    result_store_disk: str | None = setting(None, "Location of the disk tier of stored results.")
    result_store_s3: str | None = setting(None, "Location of the s3 tier (s3://bucket/prefix).")
    result_store_gcs: str | None = setting(None, "Location of the gcs tier (gs://bucket/prefix).")
    trace: str | None = setting(
        None, "Folder where each process writes its per-command trace marks (benchmarks)."
    )
    otel_endpoint: str | None = setting(
        None,
        "OTLP/HTTP endpoint that receives traces (http://HOST:4318); none: no traces.",
    )
    otlp_endpoint: str | None = setting(
        None,
        "The OpenTelemetry standard endpoint, used when FLOWTIDE_OTEL_ENDPOINT is unset.",
        env="OTEL_EXPORTER_OTLP_ENDPOINT",
    )
    worker_id: str | None = setting(
        None,
        "Name from which the process's snowflake machine id is hashed (default: HOST:PID).",
        env="WORKER_ID",
    )


class NotifySection(BaseSettings):
    """Notifications (flowtide.notify): the server-wide default, retries, allowed hosts."""

    model_config = _config("FLOWTIDE_NOTIFY_")

    default: str | None = setting(
        None,
        "Server-wide notify list: JSON (a list of targets, as a playbook's `notify:`) or the"
        " path of a YAML/JSON file holding one; applies to every top-level run.",
    )
    allow_hosts: str | None = setting(
        None,
        "Hosts and CIDRs notification targets may reach although loopback, link-local or"
        " this server's own (comma-separated; refused otherwise).",
    )
    attempts: int = setting(6, "Attempts per delivery while its target is down.", ge=1, le=50)
    backoff: float = setting(
        10.0, "Seconds before the first retry of a delivery; doubles on each.", ge=0.0
    )
    max_backoff: float = setting(300.0, "Longest wait between two attempts, seconds.", ge=0.0)
    timeout: float = setting(10.0, "Seconds one attempt may take.", gt=0.0)
    exit_wait: float = setting(
        30.0,
        "Seconds `flowtide run` waits for its run's deliveries before it exits.",
        ge=0.0,
    )
    public_url: str | None = setting(
        None,
        "Base URL of the UI in notification links (default: the server's advertised URL).",
    )


class HooksSection(BaseSettings):
    """Webhooks (`POST /api/hooks/NAME`, flowtide.web.hooks), per server process."""

    model_config = _config("FLOWTIDE_HOOK_")

    replay_window: float = setting(
        300.0,
        "Seconds a signed X-Flowtide-Timestamp may be away from the server's clock.",
        gt=0,
    )
    dedup_window: float = setting(
        86400.0,
        "Seconds a delivery id answers with the run it started instead of starting one.",
        gt=0,
    )
    rate: float = setting(
        50.0,
        "Deliveries a second a hook takes (per server process) when it names no --rate.",
        gt=0,
    )


class SessionSection(BaseSettings):
    """A browser signed in to the web UI (`POST /api/session`, flowtide.web.session), on
    the server and on `flowtide ui`."""

    model_config = _config("FLOWTIDE_SESSION_")

    lifetime: float = setting(
        43200.0,
        "Seconds a browser's sign-in lasts at most, however active (the token's own expiry"
        " and revocation end it sooner).",
        gt=0,
    )
    idle: float = setting(
        3600.0, "Seconds without a request after which a browser's sign-in ends.", gt=0
    )


class FaultsSection(BaseSettings):
    """Fault injection, for fault drills only (bench/faults.py and its test): every one
    is off by default and has no place in a real deployment."""

    model_config = _config("FLOWTIDE_FAULT_")

    duplicate_commands: Flag = setting(
        False,
        "Fault injection (drills only): the server publishes every command to NATS twice,"
        " under two message ids so that JetStream keeps both; each must still run once.",
    )


#: The tree: each section by its name (`flowtide.settings.reading("limits")`), in the order
#: the settings table (docs/cli.md) lists them.
SECTIONS: dict[str, type[BaseSettings]] = {
    "server": ServerSection,
    "nats": NatsSection,
    "client": ClientSection,
    "home": HomeSection,
    "limits": LimitsSection,
    "notify": NotifySection,
    "python": PythonSection,
    "spark": SparkSection,
    "hooks": HooksSection,
    "session": SessionSection,
    "faults": FaultsSection,
}
