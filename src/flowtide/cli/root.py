"""The root `flowtide` command: its help, the global --ca option, and where every
command and group is registered (the order here is the order `flowtide --help` lists)."""

from __future__ import annotations

import inspect
import os
from typing import Annotated

import typer

from flowtide.cli.catalog import catalog_app
from flowtide.cli.credential import credential_app
from flowtide.cli.data import data, prune_cmd
from flowtide.cli.db import db_app
from flowtide.cli.dev import dev_app
from flowtide.cli.executions import events, list_executions, status
from flowtide.cli.gc import gc_cmd
from flowtide.cli.hooks import hook_app
from flowtide.cli.kv import kv_app
from flowtide.cli.logs import logs
from flowtide.cli.options import err
from flowtide.cli.run import cancel, execute, resume, run, validate
from flowtide.cli.scheduler import scheduler_cmd
from flowtide.cli.schedules import schedule_app
from flowtide.cli.server import server_cmd, worker_cmd
from flowtide.cli.shards import shards_app
from flowtide.cli.subscriptions import subscription_app
from flowtide.cli.token import token_app
from flowtide.cli.ui import ui_cmd

app = typer.Typer(
    help=(
        "flowtide runs NoETL-style YAML playbooks: HTTP, SQL, Python, DuckDB and Spark steps "
        "wired by conditional arcs, loops and fan-in barriers.\n\n"
        "Everything runs embedded by default: events in a SQLite file in your flowtide home "
        "(the nearest .flowtide/ folder, else ~/.local/share/flowtide), loop "
        "state in an in-process key-value store, workers as threads, Spark in local mode "
        "(started on the first spark step)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

app.command("run")(run)
app.command("resume")(resume)
app.command("validate")(validate)
app.command("status")(status)
app.command("events")(events)
app.command("logs")(logs)
app.command("execute")(execute)
app.command("cancel")(cancel)
app.command("data")(data)
app.command("prune")(prune_cmd)
app.command("gc")(gc_cmd)
app.command("list")(list_executions)
app.command("ui")(ui_cmd)
app.command("scheduler")(scheduler_cmd)
app.command("server")(server_cmd)
app.command("worker")(worker_cmd)

app.add_typer(schedule_app, name="schedule")
app.add_typer(subscription_app, name="subscription")
app.add_typer(catalog_app, name="catalog")
app.add_typer(credential_app, name="credential")
app.add_typer(db_app, name="db")
app.add_typer(hook_app, name="hook")
app.add_typer(dev_app, name="dev")
app.add_typer(token_app, name="token")
app.add_typer(kv_app, name="kv")
app.add_typer(shards_app, name="shards")


def _one_line_summaries(typer_app: typer.Typer) -> None:
    """Give every command a `short_help`: the first paragraph of its docstring on one
    line. Without it the list of commands in `--help` keeps the docstring's own line
    breaks, which cut its sentences in the middle of the column."""
    for info in typer_app.registered_commands:
        doc = info.help or inspect.getdoc(info.callback) or ""
        if info.short_help is None and doc:
            info.short_help = " ".join(doc.split("\n\n")[0].split())
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _one_line_summaries(group.typer_instance)


_one_line_summaries(app)


def _print_version(value: bool) -> None:
    if value:
        import platform

        from flowtide import __version__

        typer.echo(f"flowtide {__version__} (Python {platform.python_version()})")
        raise typer.Exit()


@app.callback()
def _options(
    ca: Annotated[
        str | None,
        typer.Option(
            "--ca",
            help="CA file (PEM) that signed the https server's certificate, for every"
            " command that talks to a server (same as FLOWTIDE_CA). For mutual TLS, set"
            " FLOWTIDE_CLIENT_CERT and FLOWTIDE_CLIENT_KEY.",
            show_default=False,
        ),
    ] = None,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print flowtide's version (and Python's) and exit.",
            is_eager=True,
            callback=_print_version,
        ),
    ] = False,
) -> None:
    if ca:
        os.environ["FLOWTIDE_CA"] = ca
    # A command's --home is chosen while its options are read (options.choose_home);
    # nothing of an earlier command in this process stays.
    from flowtide.home import choose

    choose(None)


def main() -> None:
    """The `flowtide` command. A flowtide error that no command turned into a message of
    its own still ends with one line on stderr and its exit status (`errors.exit_code`),
    never a traceback."""
    from flowtide.errors import FlowtideError, exit_code

    try:
        app()
    except FlowtideError as exc:
        err(f"error: {exc}")
        raise SystemExit(exit_code(exc)) from None
