"""What several command groups share: exit codes, option types, and printing.

An option type is declared once here when its name, environment variable and help are
the same wherever it appears; a group whose option says something else (`token --db`,
`dev --home`) keeps its own.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

# The exit codes are the error tree's (flowtide.errors.exit_code), named here for the
# command groups.
from flowtide.errors import EXIT_FAILED as EXIT_FAILED
from flowtide.errors import EXIT_INVALID as EXIT_INVALID
from flowtide.errors import EXIT_OK as EXIT_OK

# Ctrl-C, as a shell reports a process that SIGINT ended.
EXIT_INTERRUPTED = 130

HomeOpt = Annotated[
    Path | None,
    typer.Option(
        "--home",
        envvar="FLOWTIDE_HOME",
        help="State folder (default: ./.flowtide).",
        show_default=False,
    ),
]
DbOpt = Annotated[
    str | None,
    typer.Option(
        "--db",
        envvar="FLOWTIDE_DB",
        help=(
            "Event store: a SQLite file (default: HOME/flowtide.db) or a PostgreSQL URL "
            "postgresql://USER:PASS@HOST:PORT/DB (schema upgraded on first use)."
        ),
        show_default=False,
    ),
]
ClusterDbOpt = Annotated[
    str | None,
    typer.Option(
        "--cluster-db",
        envvar="FLOWTIDE_CLUSTER_DB",
        help="PostgreSQL URL of the cluster-wide tables (catalog, credentials), when they "
        "live apart from --db.",
        show_default=False,
    ),
]
ShardListOpt = Annotated[
    str | None,
    typer.Option(
        "--shards",
        envvar="FLOWTIDE_SHARDS",
        help="The shard databases, 'dsn0;dsn1;...' (shard i is the i-th), with --cluster-db"
        " for the cluster tables. Without it, the cluster database's shard map"
        " (`flowtide shards add`), else --db alone.",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
ServerOpt = Annotated[
    str | None,
    typer.Option(
        "--server",
        envvar="FLOWTIDE_SERVER",
        help="Run on a flowtide server (http://HOST:PORT) and its workers instead of embedded.",
        show_default=False,
    ),
]
# For commands that only talk to a server.
ServerUrlOpt = Annotated[
    str, typer.Option("--server", envvar="FLOWTIDE_SERVER", help="flowtide server URL.")
]
SparkMasterOpt = Annotated[
    str | None,
    typer.Option(
        "--spark-master",
        envvar="FLOWTIDE_SPARK_MASTER",
        help=(
            "Where spark steps run: local[*] (default), sc://HOST:PORT (Spark Connect), "
            "spark://HOST:PORT, k8s://..., yarn. Wins over the playbook's executor.spark.master."
        ),
        show_default=False,
    ),
]
# Loop state for run/resume. Defaults are spelled out instead of imported from
# flowtide.loopstate so that `flowtide --help` imports nothing of the KV.
KvOpt = Annotated[
    str,
    typer.Option(
        "--kv",
        envvar="FLOWTIDE_KV",
        help=(
            "Key-value store for loop state: memory:// (inside this process) or "
            "nats://[USER:PASS@]HOST:PORT (a NATS JetStream server, shared by every process "
            "that points at it; look inside with `flowtide kv`)."
        ),
    ),
]
KvBucketOpt = Annotated[
    str,
    typer.Option(
        "--kv-bucket",
        envvar="FLOWTIDE_KV_BUCKET",
        help="Bucket for loop state (created if missing).",
    ),
]
KvTtlOpt = Annotated[
    float,
    typer.Option(
        "--kv-ttl",
        min=0,
        help=(
            "Seconds a loop-state value lives when this run creates the bucket (0: forever); "
            "an existing bucket keeps its own TTL."
        ),
    ),
]
# NATS credentials by file or environment, so that no secret is on a command line `ps`
# shows: a URL's user:password@ wins, then this, then FLOWTIDE_NATS_USER/PASSWORD.
NatsCredsOpt = Annotated[
    Path | None,
    typer.Option(
        "--nats-creds",
        envvar="FLOWTIDE_NATS_CREDS",
        help=(
            "NATS .creds file (user JWT + nkey seed) for NATS URLs without user:password@; "
            "or set FLOWTIDE_NATS_USER and FLOWTIDE_NATS_PASSWORD."
        ),
        show_default=False,
    ),
]
ExecutionIdArg = Annotated[int, typer.Argument(help="Execution id.")]


def home_dir(home: Path | None) -> Path:
    return home or Path(".flowtide")


def err(message: str) -> None:
    typer.echo(message, err=True)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
