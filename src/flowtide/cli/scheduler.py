"""`flowtide scheduler`: the long-running process that fires a local store's schedules
and listens to its subscriptions (and, with --port, takes webhook deliveries)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from flowtide.cli.backends import open_store
from flowtide.cli.options import DbOpt, HomeOpt, home_dir


def scheduler_cmd(
    home: HomeOpt = None,
    db: DbOpt = None,
    port: Annotated[
        int | None,
        typer.Option(
            "--port",
            min=0,
            max=65535,
            help="Also serve the local API here: webhook deliveries (POST /api/hooks/NAME),"
            " the schedules and the UI, with a token printed at start (0: any free port).",
            show_default=False,
        ),
    ] = None,
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on with --port.")
    ] = "127.0.0.1",
) -> None:
    """Fire the local store's schedules and listen to its subscriptions until stopped
    (Ctrl-C): each due slot and each message starts its run in this process, like
    `flowtide run`. `flowtide ui` does the same while it serves. A run still going when
    this stops is left `running` (`flowtide resume`). With --port it also takes webhook
    deliveries."""
    if port is not None:
        from flowtide.cli.ui import serve_local

        serve_local(home, db, host, port, scheduler=True, name="flowtide scheduler")
        return
    import logging
    import signal

    from flowtide.credentials import CredentialVault
    from flowtide.runlock import run_locks_for
    from flowtide.triggers.listener import Listeners
    from flowtide.triggers.scheduler import Scheduler
    from flowtide.ui.fold import FoldCache
    from flowtide.ui.reads import LocalReads
    from flowtide.web.schedules import ReadsFirer

    store = open_store(home, db)
    where = getattr(store, "path", None) or getattr(store, "dsn_display", "the store")
    count = len(store.list_triggers("schedule"))
    subs = len(store.list_triggers("subscription"))
    listening = f", {subs} subscription{'s' if subs != 1 else ''}" if subs else ""
    typer.echo(
        f"flowtide scheduler: {count} schedule{'s' if count != 1 else ''}{listening}"
        f" in {where}; firing due slots (Ctrl-C stops)"
    )
    from flowtide.logsetup import configure

    configure("WARNING")
    for name in ("flowtide.scheduler", "flowtide.subscriptions"):
        logging.getLogger(name).setLevel(logging.INFO)
    home_path = home_dir(home).absolute()

    async def serve() -> None:
        reads = LocalReads(store, FoldCache(store), home_path, run_locks_for(store, home_path))
        async with reads.open():
            scheduler = Scheduler(ReadsFirer(reads))
            listeners = Listeners(ReadsFirer(reads), CredentialVault(store, home_path).resolve)

            def stop() -> None:
                scheduler.stop()
                listeners.stop()

            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop)
            await asyncio.gather(scheduler.run(), listeners.run())
            typer.echo(f"flowtide scheduler: stopped ({scheduler.started} runs started)")

    try:
        asyncio.run(serve())
    finally:
        store.close()
