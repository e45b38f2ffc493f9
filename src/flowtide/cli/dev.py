"""`flowtide dev up|down|status|logs`: the command-line face of `flowtide.dev.stack`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from flowtide.cli.options import (
    EXIT_FAILED,
    EXIT_INVALID,
    JsonOpt,
    choose_home,
    err,
    home_dir,
    setting,
)

if TYPE_CHECKING:
    from flowtide.dev.stack import DevStack
    from flowtide.dev.status import Component

dev_app = typer.Typer(
    help=(
        "A complete distributed stack on this machine, loopback only: PostgreSQL "
        "(initdb/pg_ctl into .flowtide/dev/pg), nats-server, `flowtide server` and workers "
        "(or, with `dev up --shards N`, a cluster of N shards). "
        "Run playbooks on it with `flowtide run FILE --server URL`."
    ),
    no_args_is_help=True,
)

# The stack lives under HOME/dev: this --home says so, unlike the one in `options`.
HomeOpt = Annotated[
    Path | None,
    setting(
        "home.home",
        "--home",
        help=(
            "State folder; the stack lives in HOME/dev (default: FLOWTIDE_HOME, else the"
            " nearest .flowtide folder from here up, else ~/.local/share/flowtide)."
        ),
        show_default=False,
        callback=choose_home,
    ),
]


def home_hint(stack_home: Path, cwd: Path | None = None) -> tuple[str, str]:
    """How other commands find the stack's home: on their own when a command run here
    without --home finds it, else with `--home` (what to add to a command line)."""
    from flowtide.home import discovered_home

    if discovered_home(cwd).absolute() == stack_home.absolute():
        return "commands run from this directory find it on their own", ""
    return (
        f"other commands find it with --home {stack_home} or FLOWTIDE_HOME={stack_home}",
        f" --home {stack_home}",
    )


def _stack(home: Path | None) -> DevStack:
    from flowtide.dev.stack import DevStack, DevStackError

    try:
        return DevStack(home_dir(home))
    except DevStackError as exc:
        err(f"error: {exc}")
        raise typer.Exit(EXIT_FAILED) from None


def _progress(line: str) -> None:
    err(f"  {line}")


def _print_status(stack: DevStack, components: list[Component], as_json: bool) -> None:
    from flowtide.dev.natsnodes import stream_report

    shards = stack.shard_status(components)
    if as_json:
        doc = {
            "dir": str(stack.dir),
            "server": stack.server_url,
            "servers": [s["server"]["url"] for s in shards["shards"]],
            "nats": stack.nats_url,
            "nats_streams": stream_report(stack) if stack.config.nats_nodes > 1 else [],
            "components": [c.to_dict() for c in components],
            **shards,
        }
        typer.echo(json.dumps(doc, indent=2))
        return
    width = max(len(c.name) for c in components)
    for c in components:
        pid = f"pid {c.pid}" if c.pid else ""
        where = c.url or c.detail
        typer.echo(f"{c.name:<{width}}  {c.state:<9}  {pid:<10}  {where}")
    for shard in shards["shards"]:
        typer.echo(_health_line(shard["shard"], shard["health"]))
    if stack.config.nats_nodes > 1:
        _print_streams(stack)
    if shards["count"] > 1:

        def up(part: dict[str, object]) -> str:
            return "up" if part["up"] else f"DOWN ({part['state']})"

        cluster = shards["cluster_database"]
        typer.echo(
            f"\n{shards['count']} shards; cluster database on 127.0.0.1:{cluster['port']}"
            f" {up(cluster)}"
        )
        for shard in shards["shards"]:
            pg, server = shard["postgres"], shard["server"]
            typer.echo(
                f"shard {shard['shard']}:  postgres 127.0.0.1:{pg['port']} {up(pg)},"
                f"  server {server['url']} {up(server)}"
            )


def _print_streams(stack: DevStack) -> None:
    """Each stream's leader and replicas, as `dev status` prints them for a cluster."""
    from flowtide.dev.natsnodes import stream_report

    report = stream_report(stack)
    if not report:
        typer.echo("NATS streams:  unknown (no node answers)")
        return
    for doc in report:
        if "error" in doc:
            typer.echo(f"NATS stream {doc['stream']}:  {doc['error']}")
            continue
        peers = [peer_text(peer, stack.procs.alive(peer["name"])) for peer in doc["peers"]]
        leader = "" if doc["leader"] else "NO LEADER (electing)  "
        count = doc["messages"]
        typer.echo(
            f"NATS stream {doc['stream']}:  R{doc['replicas']}, {leader}{', '.join(peers)};"
            f" {count} message{'' if count == 1 else 's'}"
        )


def peer_text(peer: dict[str, Any], running: bool) -> str:
    """One replica of a stream as `dev status` prints it (`running`: its node's process
    is alive). A stopped node's replica said "BEHIND by 0" until JetStream marked it
    offline."""
    name = peer["name"]
    if peer["leader"]:
        return f"{name} leader"
    seen = f"seen {peer['active_seconds']} s ago"
    if peer.get("offline") or not running:
        return f"{name} OFFLINE ({'stopped, ' if not running else ''}{seen})"
    if not peer["current"]:
        lag = peer["lag"]
        return f"{name} {'BEHIND by ' + str(lag) if lag else 'NOT CURRENT'} ({seen})"
    return f"{name} current"


def _health_line(shard: int, health: dict[str, float] | None) -> str:
    """One shard's backlog, as `flowtide dev status` prints it."""
    if health is None:
        return f"shard {shard} health:  unknown (its server is not running or not answering)"
    return (
        f"shard {shard} health:  outbox {health['outbox_pending']:g} pending"
        f" (oldest {health['outbox_oldest_age_seconds']:.1f} s),"
        f"  {health['open_executions']:g} open executions"
        f" (oldest {health['oldest_open_age_seconds']:.1f} s),"
        f"  {health['idle_past_stalled_after']:g} idle past FLOWTIDE_STALLED_AFTER,"
        f"  {health['stalled']:g} failed as stalled so far"
        f" ({health['redriven']:g} re-driven)"
    )


@dev_app.command("up")
def dev_up(
    shards: Annotated[
        int | None,
        typer.Option(
            "--shards",
            min=1,
            help="Shards of the cluster (default 1, or what the stack already has). With N >"
            " 1: one PostgreSQL server per shard (on the ports after --pg-port's, or free"
            " ones if those are taken), the cluster database on one of its own"
            " (--pg-port), one `flowtide server` per shard (on --port, then the ports"
            " after it, each with its own --advertise-url), the workers spread over them."
            " Remembered; flowtide does not re-shard, so changing it needs `flowtide dev"
            " down --purge` first.",
            show_default=False,
        ),
    ] = None,
    workers: Annotated[
        int | None, typer.Option("--workers", min=0, help="Worker processes (default 2).")
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            "--port", help="The flowtide server's port, shard 0's with --shards (default 8082)."
        ),
    ] = None,
    nats_port: Annotated[
        int | None,
        typer.Option(
            "--nats-port",
            help="nats-server's port (default 4222); a cluster's first node's, the others"
            " on the ports after it.",
        ),
    ] = None,
    nats_cluster: Annotated[
        int | None,
        typer.Option(
            "--nats-cluster",
            help="NATS as a JetStream cluster of 3 (or 5) nats-servers on loopback, routed"
            " to each other over TLS, the server's streams and bucket at 3 replicas: any one"
            " node may die. 1: a single nats-server (the default). Remembered; changing it"
            " needs `flowtide dev down` first.",
        ),
    ] = None,
    pg_port: Annotated[
        int | None,
        typer.Option(
            "--pg-port",
            help="PostgreSQL's port, the cluster database's with --shards (default 55432).",
        ),
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option("--concurrency", min=1, help="Commands each worker runs at once (default 8)."),
    ] = None,
    lease: Annotated[
        float | None,
        typer.Option(
            "--lease",
            min=1,
            help="Seconds a claimed command survives without its worker's heartbeat (default 30).",
        ),
    ] = None,
    workdir: Annotated[
        Path | None,
        typer.Option(
            "--workdir",
            file_okay=False,
            help="Directory the workers run in: relative paths in playbooks (a python"
            " step's script file) resolve against it, as embedded runs resolve them against"
            " the current directory (default: the current directory of the first `up`).",
        ),
    ] = None,
    tls: Annotated[
        bool | None,
        typer.Option(
            "--tls/--no-tls",
            help="Every part over TLS with certificates of a local CA made in HOME/dev/tls:"
            " the API (mutual TLS), nats-server and PostgreSQL (default: on; remembered;"
            " changing it needs `dev down` first).",
            show_default=False,
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", min=1, help="Seconds to wait for each part.")
    ] = 60.0,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
) -> None:
    """Start the stack (what already runs is left alone) and print where it listens.

    Ports, sizes and the shard count are remembered in HOME/dev/stack.json for the next
    `up`.
    """
    from flowtide.dev.stack import DevStackError

    stack = _stack(home)
    err(f"flowtide dev stack in {stack.dir}")
    try:
        components = stack.up(
            shards=shards,
            workers=workers,
            server_port=port,
            nats_port=nats_port,
            nats_cluster=nats_cluster,
            pg_port=pg_port,
            concurrency=concurrency,
            lease=lease,
            workdir=workdir,
            tls=tls,
            timeout=timeout,
            progress=_progress,
        )
    except DevStackError as exc:
        err(f"error: {exc}")
        if stack.running():
            err("the parts that started keep running; `flowtide dev down` stops them")
        raise typer.Exit(EXIT_FAILED) from None
    _print_status(stack, components, as_json)
    if not as_json:
        admin = stack.tokens().get("admin", "")
        finds, home_flag = home_hint(stack.home)
        others = [s.url for s in stack.servers()[1:]]
        shard_lines = (
            f"other shards' servers: {', '.join(others)}\n"
            "                       (the CLI finds their token and TLS files on its own too)\n"
            if others
            else ""
        )
        typer.echo(
            f"\nserver:                {stack.server_url}"
            + (" (shard 0's; any server answers for every shard)" if others else "")
            + "\n"
            + shard_lines
            + f"admin token:           export FLOWTIDE_TOKEN={admin}\n"
            f"                       ({finds}: it is kept in {stack.tokens_path}, mode 0600)\n"
            f"run a playbook on it:  flowtide run examples/quickstart.yaml "
            f"--server {stack.server_url}{home_flag}\n"
            + (
                f"TLS:                   the stack's CA is {stack.ca.ca}; clients"
                f" {'given' + home_flag if home_flag else 'here'} use it (and the admin's"
                " client certificate) on their own;\n"
                "                       nats-server and PostgreSQL take TLS only (for NATS"
                f" clients: export FLOWTIDE_NATS_CA={stack.ca.ca})\n"
                if stack.config.tls
                else ""
            )
            + (
                "web UI:                flowtide dev ui  (a proxy on 127.0.0.1 that holds the"
                " admin's client certificate,\n"
                "                       which a browser lacks; it prints the URL to open)\n"
                if stack.config.tls
                else f"web UI:                {stack.server_url}/ui  (or `flowtide dev ui`)\n"
            )
            + f"API docs:              {stack.server_url}/docs\n"
            "stop it:               flowtide dev down"
        )


@dev_app.command("down")
def dev_down(
    purge: Annotated[
        bool,
        typer.Option(
            "--purge",
            help="Also delete HOME/dev: all the stack made (its databases, streams, logs,"
            " the workers' data and result files, tokens, certificates, master key, shard"
            " count); the home's own runs stay.",
        ),
    ] = False,
    home: HomeOpt = None,
) -> None:
    """Stop workers, servers, nats-server and PostgreSQL (the data stays unless --purge)."""
    from flowtide.dev.stack import DevStackError

    stack = _stack(home)
    try:
        stack.down(purge=purge, progress=_progress)
    except DevStackError as exc:
        err(f"error: {exc}")
        raise typer.Exit(EXIT_FAILED) from None
    err("flowtide dev stack stopped")


@dev_app.command("status")
def dev_status(as_json: JsonOpt = False, home: HomeOpt = None) -> None:
    """Show each part: running, unhealthy (alive but not answering) or stopped.

    Exits 0 when everything runs, 1 otherwise.
    """
    stack = _stack(home)
    components = stack.status()
    _print_status(stack, components, as_json)
    if any(c.state != "running" for c in components):
        raise typer.Exit(EXIT_FAILED)


@dev_app.command("logs")
def dev_logs(
    part: Annotated[
        str,
        typer.Argument(
            help="server, nats, postgres or worker-N; with shards also server-K and"
            " postgres-K (`server` is shard 0's, `postgres` the cluster database's); with"
            " --nats-cluster, nats-0, nats-1, ..."
        ),
    ] = "server",
    lines: Annotated[int, typer.Option("--lines", "-n", min=0, help="How many lines.")] = 50,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines (Ctrl-C stops).")
    ] = False,
    home: HomeOpt = None,
) -> None:
    """Print the end of one part's log (and follow it with -f)."""
    import time

    stack = _stack(home)
    known = {c.name: Path(c.log) for c in stack.status()}
    if part == "server" and part not in known:
        part = stack.servers()[0].name  # shard 0's
    path = known.get(part)
    if path is None:
        err(f"error: no part {part!r}; the parts are {', '.join(known)}")
        raise typer.Exit(EXIT_INVALID)
    if not path.exists():
        err(f"error: {path} does not exist yet (has `flowtide dev up` run?)")
        raise typer.Exit(EXIT_FAILED)
    with open(path, errors="replace") as handle:
        tail = handle.readlines()[-lines:] if lines else []
        typer.echo("".join(tail), nl=False)
        if not follow:
            return
        try:
            while True:
                line = handle.readline()
                if line:
                    typer.echo(line, nl=False)
                else:
                    time.sleep(0.2)
        except KeyboardInterrupt:
            return


#: Where `flowtide dev ui` listens unless told otherwise (the server's default is 8082).
UI_PORT = 8083


@dev_app.command("ui")
def dev_ui(
    port: Annotated[
        int,
        typer.Option("--port", min=0, max=65535, help="Port to listen on (0: any free one)."),
    ] = UI_PORT,
    host: Annotated[
        str,
        typer.Option(
            "--host", help="Loopback address to listen on (127.0.0.1, ::1 or localhost only)."
        ),
    ] = "127.0.0.1",
    open_browser: Annotated[
        bool,
        typer.Option(
            "--open/--no-open",
            help="Open the UI in the default browser (when there is a display).",
        ),
    ] = True,
    home: HomeOpt = None,
) -> None:
    """Serve the dev stack's web UI to a browser on this machine: a proxy on loopback (plain
    HTTP) that sends every request on to the stack's server over mutual TLS, with the
    stack's CA and the admin's client certificate, which a browser does not hold.

    The proxy adds no token: it prints the URL to open, whose `#token=` (the stack's admin
    token) signs the browser in. Stop with Ctrl-C.
    """
    import os
    import sys

    import uvicorn

    from flowtide.dev.stack import DevStackError
    from flowtide.dev.uiproxy import UiProxy, is_loopback, listen_loopback
    from flowtide.errors import FlowtideError
    from flowtide.logsetup import config_dict
    from flowtide.settings import ServerSection, read

    if not is_loopback(host):
        err(
            f"error: --host {host}: `flowtide dev ui` listens on loopback only (127.0.0.1,"
            " ::1 or localhost): it holds the admin's client certificate"
        )
        raise typer.Exit(EXIT_INVALID)
    stack = _stack(home)
    server = stack.servers()[0]
    if not stack.procs.alive(server.name):
        err(f"error: the dev stack's server is not running ({stack.dir}); `flowtide dev up`")
        raise typer.Exit(EXIT_FAILED)
    try:
        verify = stack.admin_tls()
        sock = listen_loopback(host, port)
    except (DevStackError, FlowtideError) as exc:
        err(f"error: {exc}")
        raise typer.Exit(EXIT_FAILED) from None
    port = sock.getsockname()[1]
    shown = f"[{host.strip('[]')}]" if ":" in host else host
    hosts = {f"{shown}:{port}"}
    if host in ("127.0.0.1", "localhost"):
        hosts |= {f"127.0.0.1:{port}", f"localhost:{port}"}
    app = UiProxy(server.url, verify=verify, hosts=hosts, max_body=read(ServerSection).max_body)
    url = f"http://{shown}:{port}/ui"
    admin = stack.tokens().get("admin", "")
    typer.echo(
        f"flowtide dev ui: {url} -> {server.url}"
        + (" (with the admin's client certificate)" if stack.config.tls else "")
    )
    typer.echo(f"open {url}#token={admin}")
    typer.echo("  (signs in as the stack's admin; or sign in there with any token)")
    if open_browser and (
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY") or sys.platform == "darwin"
    ):
        import webbrowser

        # Without the token: a browser's command line is readable by other users.
        if webbrowser.open(url):
            typer.echo("  (the browser opened at its sign-in form: the link above signs in)")
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, log_config=config_dict("WARNING")
    )
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
