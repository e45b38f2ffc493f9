"""`flowtide ui`: the web UI over the local store (the runs of `flowtide run`)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated

import typer

from flowtide.cli.backends import open_store
from flowtide.cli.options import DbOpt, HomeOpt, err, home_dir

#: Where `flowtide ui` listens unless told otherwise.
DEFAULT_PORT = 8080


def ui_cmd(
    home: HomeOpt = None,
    db: DbOpt = None,
    host: Annotated[
        str,
        typer.Option(
            "--host",
            help="Address to listen on. Anything but loopback lets other machines reach the"
            " UI (with the printed token): only on a network you trust.",
        ),
    ] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option("--port", min=0, max=65535, help="Port to listen on (0: any free one)."),
    ] = DEFAULT_PORT,
    scheduler: Annotated[
        bool,
        typer.Option(
            "--scheduler/--no-scheduler",
            help="Fire the store's due schedules while the UI serves (as `flowtide scheduler`).",
        ),
    ] = True,
) -> None:
    """Serve the web UI over the local store: the executions `flowtide run`
    made (graphs, loop progress, timelines, event logs, live while they run)
    and the catalog (`flowtide catalog register`) with a run form.

    Runs started, re-run or resumed from the page run in this process, like
    `flowtide run`, and stop with it (`flowtide resume` continues them).

    It prints the URL to open once: the token after its `#` is made at start
    and is the only way in. Stop with Ctrl-C.
    """
    serve_local(home, db, host, port, scheduler=scheduler, name="flowtide ui")


def serve_local(
    home: Path | None, db: str | None, host: str, port: int, *, scheduler: bool, name: str
) -> None:
    """Serve the local app (the UI, its API, webhook deliveries) until Ctrl-C, firing
    the store's schedules when `scheduler`; `name` opens the first line."""
    import secrets

    import uvicorn

    from flowtide.ui.local import create_local_app, local_hosts

    store = open_store(home, db)
    # Bind first: a port in use is a clear error, and port 0 gets its number.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        store.close()
        err(f"error: cannot listen on {host}:{port}: {exc.strerror or exc} (try --port)")
        raise typer.Exit(2) from None
    # Listening before the URL is printed: a browser opened at once waits in the
    # backlog while the app starts, instead of being refused.
    sock.listen(128)
    port = sock.getsockname()[1]
    secret = secrets.token_urlsafe(32)
    shown = f"[{host}]" if ":" in host else host
    app = create_local_app(
        store,
        secret=secret,
        hosts=local_hosts(shown, port),
        home=home_dir(home),
        scheduler=scheduler,
    )
    count = len(store.list_executions(limit=1000))
    schedules = len(store.list_triggers("schedule"))
    hooks = len(store.list_triggers("hook"))
    where = getattr(store, "path", None) or getattr(store, "dsn_display", "the store")
    firing = (
        f"; firing its {schedules} schedule{'s' if schedules != 1 else ''}"
        if scheduler
        else "; schedules not fired (--no-scheduler)"
    )
    serving = f"; taking deliveries for {hooks} hook{'s' if hooks != 1 else ''}" if hooks else ""
    typer.echo(
        f"{name}: {count if count < 1000 else '1000+'} executions in {where}{firing}{serving}"
    )
    typer.echo(f"open http://{shown}:{port}/ui#token={secret}")
    if host not in ("127.0.0.1", "localhost", "::1"):
        err(f"warning: listening on {host}: other machines can reach it (the token guards it)")
    from flowtide.logsetup import config_dict

    config = uvicorn.Config(
        app, log_level="warning", access_log=False, log_config=config_dict("WARNING")
    )
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        store.close()
