"""What several command groups share: exit codes, option types, and printing.

An option that sets a setting of the tree (flowtide.settings) is built from its
declaration (`setting`: its variable, help and bounds; `default`: its default), read
from the generated catalog so that `flowtide --help` imports no pydantic. An option type
is declared once here when its name and help are the same wherever it appears; a group
whose option says something else (`token --db`, `dev --home`) passes its own help.
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
from flowtide.settings.catalog import CATALOG

# Ctrl-C, as a shell reports a process that SIGINT ended.
EXIT_INTERRUPTED = 130


def setting(key: str, *flags: str, env: bool = True, **options: Any) -> Any:
    """The typer option of the tree's setting `key` ("server.db"): its variable (unless
    `env` is False: a flag the environment does not set), help and bounds from the
    declaration; `options` (typer's) win."""
    entry = CATALOG[key]
    options.setdefault("help", entry.help)
    if entry.min is not None:
        options.setdefault("min", entry.min)
    if entry.max is not None:
        options.setdefault("max", entry.max)
    if entry.default is None:
        options.setdefault("show_default", False)
    return typer.Option(*flags, envvar=entry.env if env else None, **options)


def default(key: str) -> Any:
    """The declared default of the tree's setting `key`."""
    return CATALOG[key].default


def choose_home(home: Path | None) -> Path | None:
    """--home's callback: every part of the command that looks for the home (the dev
    stack's token and certificates for --server, too) finds this one."""
    from flowtide.home import choose

    choose(home)
    return home


HomeOpt = Annotated[
    Path | None,
    setting(
        "home.home",
        "--home",
        help=(
            "State folder (default: FLOWTIDE_HOME, else the nearest .flowtide folder from"
            " here up, else ~/.local/share/flowtide)."
        ),
        show_default=False,
        callback=choose_home,
    ),
]
DbOpt = Annotated[
    str | None,
    setting(
        "server.db",
        "--db",
        help=(
            "Event store: a SQLite file (default: HOME/flowtide.db) or a PostgreSQL URL "
            "postgresql://USER:PASS@HOST:PORT/DB (schema upgraded on first use)."
        ),
        show_default=False,
    ),
]
ClusterDbOpt = Annotated[
    str | None,
    setting("server.cluster_db", "--cluster-db"),
]
ShardListOpt = Annotated[
    str | None,
    setting("server.shards", "--shards"),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
ServerOpt = Annotated[
    str | None,
    setting(
        "client.server",
        "--server",
        help="Run on a flowtide server (http://HOST:PORT) and its workers instead of embedded.",
        show_default=False,
    ),
]
# For commands that only talk to a server.
ServerUrlOpt = Annotated[str, setting("client.server", "--server", show_default=True)]
SparkMasterOpt = Annotated[
    str | None,
    setting("spark.master", "--spark-master"),
]
# Loop state for run/resume (defaults: `default("server.kv")`, `default("server.kv_bucket")`).
KvOpt = Annotated[str, setting("server.kv", "--kv")]
KvBucketOpt = Annotated[str, setting("server.kv_bucket", "--kv-bucket")]
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
    setting("nats.creds", "--nats-creds"),
]
ExecutionIdArg = Annotated[int, typer.Argument(help="Execution id.")]


_home_said = False  # the user's own home is new: said once per command


def home_dir(home: Path | None) -> Path:
    """--home, else FLOWTIDE_HOME, else the nearest .flowtide up from here, else the
    user's own home (flowtide.home); the first use of the user's own says so on stderr."""
    from flowtide.home import find_home, user_home

    global _home_said
    found = find_home(home)
    if home is None and found == user_home() and not found.exists() and not _home_said:
        _home_said = True
        err(
            f"flowtide: state goes to {found} (FLOWTIDE_HOME, --home or a .flowtide folder"
            " in a project keep it elsewhere)"
        )
    return found


def err(message: str) -> None:
    typer.echo(message, err=True)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
