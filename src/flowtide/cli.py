"""The `flowtide` command line. Thin: every command calls the runtimes or the store."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from flowtide.auth.cli import token_app
from flowtide.dev.cli import dev_app
from flowtide.urls import redact_url, scrub_url

if TYPE_CHECKING:
    from flowtide.store.base import Store

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2

app = typer.Typer(
    help=(
        "flowtide runs NoETL-style YAML playbooks: HTTP, SQL, Python, DuckDB and Spark steps "
        "wired by conditional arcs, loops and fan-in barriers.\n\n"
        "Everything runs embedded by default: events in a SQLite file under .flowtide/, loop "
        "state in an in-process key-value store, workers as threads, Spark in local mode "
        "(started on the first spark step)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
catalog_app = typer.Typer(
    help="Register and list playbooks by their metadata.path.", no_args_is_help=True
)
credential_app = typer.Typer(
    help="Store credential aliases (encrypted at rest).", no_args_is_help=True
)
db_app = typer.Typer(
    help="The event store's schema: show its version, apply pending migrations.",
    no_args_is_help=True,
)
app.add_typer(catalog_app, name="catalog")
app.add_typer(credential_app, name="credential")
app.add_typer(db_app, name="db")
app.add_typer(dev_app, name="dev")
app.add_typer(token_app, name="token")

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
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
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


def _home(home: Path | None) -> Path:
    return home or Path(".flowtide")


def _check_nats(url: str, auth: Any) -> None:
    """Connect to NATS once (waiting while it cannot be reached); exit 1 with the reason
    when it refuses the credentials."""
    import asyncio

    from flowtide.errors import NatsError
    from flowtide.natsauth import connect_nats

    async def probe() -> None:
        nc = await connect_nats(url, auth, name="flowtide-server-check")
        await nc.close()

    try:
        asyncio.run(probe())
    except NatsError as exc:
        _err(f"error: {exc}")
        raise typer.Exit(EXIT_FAILED) from None


def _nats_auth(creds: Path | None) -> Any:
    """NATS credentials from --nats-creds and FLOWTIDE_NATS_USER/PASSWORD; exit 2 when
    they are incomplete or the file is unusable."""
    from flowtide.errors import NatsError
    from flowtide.natsauth import NatsAuth

    auth = NatsAuth.from_env(creds=str(creds) if creds else None)
    try:
        auth.check()
    except NatsError as exc:
        _err(f"error: {exc}")
        raise typer.Exit(EXIT_INVALID) from None
    return auth


def _store(home: Path | None, db: str | None) -> Store:
    """Open the event store `--db` names; a store that cannot open ends the command."""
    from flowtide.errors import StoreError
    from flowtide.sealing import Sealer
    from flowtide.store.postgres import PostgresStore, is_postgres_url
    from flowtide.store.sqlite import SQLiteStore

    # What holds a secret is sealed with the master key the credentials use.
    sealer = Sealer(_home(home))
    try:
        if db and is_postgres_url(db):
            return PostgresStore(db, sealer=sealer)
        return SQLiteStore(Path(db) if db else _home(home) / "flowtide.db", sealer=sealer)
    except StoreError as exc:
        _err(f"error: {exc}")
        raise typer.Exit(EXIT_FAILED) from None


def _err(message: str) -> None:
    typer.echo(message, err=True)


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _overrides(sets: list[str] | None, payload: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if payload:
        source = payload
        try:
            if payload.startswith("@"):
                source = Path(payload[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise typer.BadParameter(
                f"--payload {payload}: cannot read file: {exc.strerror}"
            ) from exc
        try:
            data = json.loads(source)
        except ValueError as exc:
            raise typer.BadParameter(f"--payload is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise typer.BadParameter("--payload must be a JSON object")
        out.update(data)
    for item in sets or []:
        if "=" not in item:
            raise typer.BadParameter(f"--set expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        target = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        target[parts[-1]] = _parse_value(value)
    return out


def _execution_or_exit(store: Store, execution_id: int) -> Any:
    """The execution's row; exit 2 with a message when there is no such execution."""
    from flowtide.errors import NotFoundError

    try:
        return store.get_execution(execution_id)
    except NotFoundError as exc:
        store.close()
        _err(f"error: {exc}")
        raise typer.Exit(EXIT_INVALID) from None


def _folded(store: Store, execution_id: int) -> tuple[Any, Any]:
    """(execution row, state rebuilt from its event log); exit 2 when there is none."""
    from flowtide.engine.state import fold
    from flowtide.playbook.loader import parse_playbook

    row = _execution_or_exit(store, execution_id)
    playbook = parse_playbook(row.playbook_text, row.playbook_file)
    return row, fold(playbook, execution_id, store.events(execution_id))


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def _print_summary(doc: dict[str, Any], location: str | None = None) -> None:
    from rich.console import Console
    from rich.pretty import Pretty

    console = Console(stderr=False)
    style = {"completed": "green", "failed": "red", "cancelled": "yellow"}.get(doc["status"], "")
    console.print(f"execution [bold]{doc['execution_id']}[/] [{style}]{doc['status']}[/]")
    if doc["error"]:
        err = doc["error"]
        where = f" ({location})" if location else ""
        console.print(
            f"[red]error[/] in step [bold]{err.get('step')}[/]{where} ({err.get('kind')}): "
            f"{err.get('message')}"
        )
    console.print("result:")
    console.print(Pretty(doc["result"], max_length=20, max_string=400))


TargetArg = Annotated[
    str, typer.Argument(help="Playbook file, or a catalog path (PATH or PATH@VERSION).")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        help="Override a workload key: KEY=VALUE (VALUE parsed as JSON when it can be).",
    ),
]
PayloadOpt = Annotated[
    str | None,
    typer.Option("--payload", help="Workload overrides as a JSON object (or @file)."),
]
ServerOpt = Annotated[
    str | None,
    typer.Option(
        "--server",
        envvar="FLOWTIDE_SERVER",
        help="Run on a flowtide server (http://HOST:PORT) and its workers instead of embedded.",
        show_default=False,
    ),
]


def _warn_pasted_sql(playbook: Any, file: str) -> list[dict[str, Any]]:
    """Print (on stderr) and return the playbook's SQL warnings: templates pasted inside
    SQL string literals, where `params` belongs. Warnings never stop a run."""
    from flowtide.playbook.sqllint import lint_playbook

    warnings = lint_playbook(playbook, file)
    for warning in warnings:
        _err(warning.render())
    return [warning.to_dict() for warning in warnings]


def _show_progress(as_json: bool) -> bool:
    return not as_json and sys.stderr.isatty() and os.environ.get("FLOWTIDE_NO_PROGRESS") is None


def _remote_target(target: str) -> tuple[str | None, str | None]:
    """(inline playbook text, catalog id) for `target`: a file is sent inline, anything
    else names a catalog entry (PATH or PATH@VERSION)."""
    path = Path(target)
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8"), None
        except OSError as exc:
            raise typer.BadParameter(f"{target}: {exc}") from None
    return None, target


def _follow_remote(api: Any, execution_id: int, text: str | None, title: str) -> dict[str, Any]:
    """Wait for a remote execution, with the embedded run's live display when stderr is a
    terminal (the state is folded here from the events the server logs)."""
    if text is not None and _show_progress(False):
        from rich.console import Console

        from flowtide.engine.events import Event
        from flowtide.engine.state import ExecutionState
        from flowtide.playbook.loader import parse_playbook
        from flowtide.runtime.progress import ProgressView

        state = ExecutionState(parse_playbook(text, None), execution_id)
        view = ProgressView(Console(stderr=True), title=title)
        view.track(execution_id)
        with view:
            for page in api.follow(execution_id):
                batch = [Event.from_dict(doc) for doc in page]
                for event in batch:
                    state.apply(event)
                view.on_events(batch, {execution_id: state})
    return dict(api.wait(execution_id))


def _run_remote(
    server: str, target: str, overrides: dict[str, Any], *, as_json: bool, pool: str | None
) -> int:
    """Submit `target` to a server and follow it to the end."""
    from flowtide.client import ServerError

    try:
        text, catalog_id = _remote_target(target)
    except typer.BadParameter as exc:
        _err(f"error: {exc}")
        return EXIT_INVALID
    if text is not None:
        from flowtide.errors import PlaybookError
        from flowtide.playbook.loader import parse_playbook

        with contextlib.suppress(PlaybookError):  # the server reports what is invalid
            _warn_pasted_sql(parse_playbook(text, target), target)
    eid: int | None = None
    with _client(server) as api:
        try:
            eid = api.execute(playbook=text, catalog_id=catalog_id, payload=overrides, pool=pool)
            if not as_json:
                _err(f"execution {eid} started on {redact_url(api.url)}")
            if text is None and _show_progress(as_json):
                with contextlib.suppress(ServerError):
                    text = api.get_playbook(*_catalog_parts(target)).get("content")
            doc = _follow_remote(api, eid, text, target)
        except ServerError as exc:
            _err(f"error: {target}: {exc}" if eid is None else f"error: {exc}")
            return EXIT_INVALID if 400 <= exc.status < 500 and eid is None else EXIT_FAILED
        except KeyboardInterrupt:
            if eid is not None:
                _err(
                    f"\ninterrupted; the execution goes on on the server: "
                    f"`flowtide status {eid} --server {redact_url(api.url)}`, "
                    f"`flowtide cancel {eid} --server ...` stops it"
                )
            return 130
    doc.pop("playbook", None)
    if as_json:
        _print_json(doc)
    else:
        _print_summary(doc)
    return EXIT_OK if doc["status"] == "completed" else EXIT_FAILED


def _catalog_parts(catalog_id: str) -> tuple[str, int | None]:
    path, _, version = catalog_id.partition("@")
    return path, int(version) if version.isdigit() else None


def _load_target(target: str, store: Store) -> tuple[Any, int | None]:
    from flowtide.errors import NotFoundError
    from flowtide.playbook.loader import load_playbook, parse_playbook

    path = Path(target)
    if path.exists():
        return load_playbook(path), None
    path_part, _, version = target.partition("@")
    try:
        row = store.get_playbook(path_part, int(version) if version else None)
    except NotFoundError:
        from flowtide.errors import PlaybookError

        raise PlaybookError(
            "no such file, and no playbook with this catalog path "
            "(register one with `flowtide catalog register FILE`)",
            file=target,
        ) from None
    return parse_playbook(row.text, row.source_file), row.version


def _execute(
    action: str,
    *,
    target: str | None = None,
    execution_id: int | None = None,
    overrides: dict[str, Any] | None = None,
    home: Path | None,
    db: str | None,
    as_json: bool,
    spark_master: str | None = None,
    kv_url: str = "memory://",
    kv_bucket: str = "flowtide_state",
    kv_ttl: float = 3600.0,
    nats_creds: Path | None = None,
) -> int:
    """Run (or resume) one execution embedded and report it. Returns the exit code."""
    import asyncio

    if spark_master:
        from flowtide.spark.session import set_master

        set_master(spark_master)

    from flowtide.credentials import CredentialVault
    from flowtide.errors import FlowtideError, PlaybookError, TemplateError
    from flowtide.kv import KVError
    from flowtide.redaction import install_log_masking, mask_value
    from flowtide.runtime.local import LocalRuntime
    from flowtide.runtime.report import error_location, execution_document

    install_log_masking()
    store = _store(home, db)
    vault = CredentialVault(store, _home(home))
    show_progress = _show_progress(as_json)
    view = None
    started_id: list[int] = []
    location: list[str | None] = []
    same_kv = "" if kv_url.startswith("memory:") else " (with the same --kv)"

    async def main() -> dict[str, Any]:
        nonlocal view
        listener = None
        if show_progress:
            from rich.console import Console

            from flowtide.runtime.progress import ProgressView

            view = ProgressView(Console(stderr=True), title=target or f"execution {execution_id}")
            listener = view.on_events
        # Connected before anything starts, so a bad --kv runs nothing.
        kv = await _open_kv(kv_url, kv_bucket, ttl=kv_ttl or None, nats_creds=nats_creds)
        try:
            async with LocalRuntime(
                store, kv=kv, credentials=vault, listener=listener, data_dir=_home(home) / "data"
            ) as runtime:
                if action == "run":
                    assert target is not None
                    playbook, version = _load_target(target, store)
                    _warn_pasted_sql(playbook, target)
                    eid = await runtime.start(
                        playbook, workload=overrides or {}, catalog_version=version
                    )
                else:
                    assert execution_id is not None
                    eid = execution_id
                    await runtime.resume(eid)
                started_id.append(eid)
                if view is not None:
                    view.track(eid)
                    with view:
                        state = await runtime.wait(eid)
                else:
                    state = await runtime.wait(eid)
                location.append(error_location(state))
                # Printed, not used: values of the execution's secret set are masked.
                masked: dict[str, Any] = mask_value(execution_document(state), state.secrets)
                return masked
        finally:
            await _close_kv(kv)

    try:
        doc = asyncio.run(main())
    except _KVUnavailable as exc:
        _err(f"error: {exc}")
        return EXIT_INVALID
    except (PlaybookError, TemplateError) as exc:
        _err(f"error: {scrub_url(str(exc), kv_url)}")
        return EXIT_INVALID
    except KVError as exc:
        # The KV went away mid-run: a failure, not bad input, and the log still holds
        # everything that finished.
        _err(f"error: {scrub_url(exc.message, kv_url)}")
        if started_id:
            _err(
                f"execution {started_id[0]} stopped; once the KV is back, "
                f"`flowtide resume {started_id[0]}`{same_kv} continues it"
            )
        return EXIT_FAILED
    except FlowtideError as exc:
        _err(f"error: {scrub_url(str(exc), kv_url)}")
        return EXIT_INVALID
    except KeyboardInterrupt:
        if started_id:
            _err(
                f"\ninterrupted: execution {started_id[0]} can continue with `flowtide resume {started_id[0]}`{same_kv}"
            )
        return 130
    finally:
        store.close()
    if as_json:
        _print_json(doc)
    else:
        _print_summary(doc, location[0] if location else None)
    return EXIT_OK if doc["status"] == "completed" else EXIT_FAILED


@app.command()
def run(
    target: TargetArg,
    set_: SetOpt = None,
    payload: PayloadOpt = None,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
    spark_master: SparkMasterOpt = None,
    kv: KvOpt = "memory://",
    kv_bucket: KvBucketOpt = "flowtide_state",
    kv_ttl: KvTtlOpt = 3600.0,
    nats_creds: NatsCredsOpt = None,
    server: ServerOpt = None,
) -> None:
    """Run a playbook embedded (or on a flowtide server with --server), to the end.

    Exit code 0: completed; 1: failed or cancelled; 2: invalid playbook or input
    (nothing ran). Ctrl-C stops the run; `flowtide resume ID` continues it.
    """
    try:
        overrides = _overrides(set_, payload)
    except typer.BadParameter as exc:
        _err(f"error: {exc}")
        raise typer.Exit(EXIT_INVALID) from None
    if server:
        raise typer.Exit(_run_remote(server, target, overrides, as_json=as_json, pool=None))
    raise typer.Exit(
        _execute(
            "run",
            target=target,
            overrides=overrides,
            home=home,
            db=db,
            as_json=as_json,
            spark_master=spark_master,
            kv_url=kv,
            kv_bucket=kv_bucket,
            kv_ttl=kv_ttl,
            nats_creds=nats_creds,
        )
    )


@app.command()
def resume(
    execution_id: Annotated[int, typer.Argument(help="Execution to continue.")],
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
    spark_master: SparkMasterOpt = None,
    kv: KvOpt = "memory://",
    kv_bucket: KvBucketOpt = "flowtide_state",
    kv_ttl: KvTtlOpt = 3600.0,
    nats_creds: NatsCredsOpt = None,
) -> None:
    """Continue a stopped run from its event log (completed steps and iterations are kept)."""
    raise typer.Exit(
        _execute(
            "resume",
            execution_id=execution_id,
            home=home,
            db=db,
            as_json=as_json,
            spark_master=spark_master,
            kv_url=kv,
            kv_bucket=kv_bucket,
            kv_ttl=kv_ttl,
            nats_creds=nats_creds,
        )
    )


@app.command()
def validate(
    files: Annotated[list[Path], typer.Argument(help="Playbook files to check.")],
    as_json: JsonOpt = False,
) -> None:
    """Check playbooks without running anything. Exit code 2 when any is invalid."""
    from flowtide.errors import PlaybookError, PlaybookErrors
    from flowtide.playbook.loader import load_playbook

    report = []
    bad = False
    for file in files:
        try:
            playbook = load_playbook(file)
            if as_json:
                from flowtide.playbook.sqllint import lint_playbook

                warnings = [w.to_dict() for w in lint_playbook(playbook, str(file))]
            else:
                warnings = _warn_pasted_sql(playbook, str(file))
            report.append(
                {
                    "file": str(file),
                    "valid": True,
                    "name": playbook.name,
                    "steps": len(playbook.steps),
                    "warnings": warnings,
                }
            )
            if not as_json:
                typer.echo(f"{file}: ok ({len(playbook.steps)} steps, entry '{playbook.entry}')")
        except PlaybookError as exc:
            bad = True
            errors = exc.errors if isinstance(exc, PlaybookErrors) else [exc]
            report.append(
                {"file": str(file), "valid": False, "errors": [e.to_dict() for e in errors]}
            )
            if not as_json:
                for e in errors:
                    _err(e.render())
    if as_json:
        _print_json(report)
    raise typer.Exit(EXIT_INVALID if bad else EXIT_OK)


@app.command()
def status(
    execution_id: Annotated[int, typer.Argument(help="Execution id.")],
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
    server: ServerOpt = None,
) -> None:
    """Show an execution's status, steps and result (rebuilt from its event log)."""
    if server:
        with _client(server) as api:
            doc = _remote_or_exit(lambda: api.execution(execution_id))
        label = doc.pop("playbook", None)
    else:
        from flowtide.redaction import mask_value
        from flowtide.runtime.report import execution_document

        store = _store(home, db)
        row, state = _folded(store, execution_id)
        doc = mask_value(execution_document(state), state.secrets)
        if not state.terminal:
            doc["status"] = "running" if row.status == "running" else row.status
        store.close()
        label = row.playbook_path or row.playbook_file
    if as_json:
        _print_json(doc)
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"execution [bold]{doc['execution_id']}[/] {doc['status']}  playbook {label}")
    table = Table(box=None)
    for col in ("step", "status", "runs", "error"):
        table.add_column(col)
    for name, step in doc["steps"].items():
        err = (step["error"] or {}).get("message", "") if step["error"] else ""
        table.add_row(name, step["status"], str(step["runs"]), str(err)[:80])
    console.print(table)
    if doc["error"]:
        console.print(f"[red]error[/]: {doc['error']}")


def _client(server: str) -> Any:
    """A ServerClient for `server`; a token that cannot be read ends the command (exit 2)."""
    from flowtide.client import ServerClient, ServerError

    try:
        return ServerClient(server)
    except ServerError as exc:
        _err(f"error: {exc}")
        raise typer.Exit(EXIT_INVALID) from None


def _remote_or_exit(call: Any) -> Any:
    """`call()` against the server; a refusal or an unreachable server ends the command
    (exit 2 for a 4xx: bad input or unknown id; 1 otherwise)."""
    from flowtide.client import ServerError

    try:
        return call()
    except ServerError as exc:
        _err(f"error: {exc}")
        raise typer.Exit(EXIT_INVALID if 400 <= exc.status < 500 else EXIT_FAILED) from None


@app.command()
def events(
    execution_id: Annotated[int, typer.Argument(help="Execution id.")],
    as_json: JsonOpt = False,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow", "-f", help="With --server: keep printing new events until the run ends."
        ),
    ] = False,
    home: HomeOpt = None,
    db: DbOpt = None,
    server: ServerOpt = None,
) -> None:
    """Print an execution's event log in order."""
    from flowtide.engine.events import Event

    if server:
        with _client(server) as api:
            if follow and not as_json:
                _remote_or_exit(lambda: api.execution(execution_id))
                try:
                    for page in _remote_or_exit(lambda: api.follow(execution_id)):
                        for doc in page:
                            _print_event(Event.from_dict(doc))
                except KeyboardInterrupt:
                    raise typer.Exit(130) from None
                return
            docs = _remote_or_exit(lambda: list(api.all_events(execution_id)))
        if as_json:
            _print_json(docs)
            return
        log = [Event.from_dict(doc) for doc in docs]
    else:
        from flowtide.engine.events import SECRETS_ADDED
        from flowtide.engine.state import secret_values
        from flowtide.redaction import mask_event_doc

        store = _store(home, db)
        _execution_or_exit(store, execution_id)
        log = store.events(execution_id)
        store.close()
        secrets = frozenset().union(*(secret_values(e) for e in log if e.type == SECRETS_ADDED))
        docs = [mask_event_doc(e.to_dict(), secrets) for e in log]
        if as_json:
            _print_json(
                [
                    doc | {"event_id": str(e.event_id), "execution_id": str(e.execution_id)}
                    for doc, e in zip(docs, log, strict=True)
                ]
            )
            return
        log = [Event.from_dict(doc) for doc in docs]
    for e in log:
        _print_event(e)


def _print_event(e: Any) -> None:
    import datetime

    ts = datetime.datetime.fromtimestamp(e.time).strftime("%H:%M:%S.%f")[:-3]
    extra = ""
    if e.error:
        extra = f" error={e.error.get('kind')}: {str(e.error.get('message'))[:100]}"
    elif e.payload and e.type in ("loop.item", "command.issued") and "loop_index" in e.payload:
        extra = f" index={e.payload.get('loop_index')}"
    elif e.type == "loop.item":
        extra = f" index={(e.payload or {}).get('index')}"
    elif e.worker_id:
        extra = f" worker={e.worker_id}"
    typer.echo(f"{ts} {e.type:<20} {e.step or '':<24} {e.status or '':<10}{extra}")


@app.command()
def execute(
    target: TargetArg,
    server: Annotated[
        str, typer.Option("--server", envvar="FLOWTIDE_SERVER", help="flowtide server URL.")
    ],
    set_: SetOpt = None,
    payload: PayloadOpt = None,
    pool: Annotated[
        str | None, typer.Option("--pool", help="Worker pool to run on (default: default).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Start a playbook on a server and return at once with its execution id (follow it
    with `flowtide status ID` / `flowtide events ID --follow`)."""

    try:
        overrides = _overrides(set_, payload)
        text, catalog_id = _remote_target(target)
    except typer.BadParameter as exc:
        _err(f"error: {exc}")
        raise typer.Exit(EXIT_INVALID) from None
    with _client(server) as api:
        eid = _remote_or_exit(
            lambda: api.execute(playbook=text, catalog_id=catalog_id, payload=overrides, pool=pool)
        )
    if as_json:
        _print_json({"execution_id": str(eid), "status": "running"})
    else:
        typer.echo(eid)


@app.command()
def cancel(
    execution_id: Annotated[int, typer.Argument(help="Execution id.")],
    server: Annotated[
        str, typer.Option("--server", envvar="FLOWTIDE_SERVER", help="flowtide server URL.")
    ],
    reason: Annotated[str, typer.Option("--reason", help="Recorded in the event log.")] = (
        "cancelled from the command line"
    ),
    as_json: JsonOpt = False,
) -> None:
    """Cancel an execution on a server: no new commands are issued, running workers see
    the cancellation and stop. (An embedded run stops with Ctrl-C.)"""

    with _client(server) as api:
        doc = _remote_or_exit(lambda: api.cancel(execution_id, reason))
    if as_json:
        _print_json(doc)
    else:
        typer.echo(f"execution {execution_id}: {doc.get('status', 'cancel requested')}")


@app.command()
def data(
    execution_id: Annotated[int, typer.Argument(help="Execution id.")],
    step: Annotated[str, typer.Argument(help="A spark step of that execution.")],
    limit: Annotated[int, typer.Option(help="Rows to print (0: all).")] = 20,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
) -> None:
    """Print the rows a spark step wrote (its result reference), read with DuckDB: no JVM.

    Works for parquet, csv and json results on this machine's disk (the default for steps
    without a sink: .flowtide/data/<execution_id>/<step>/). A loop step prints iteration 0;
    use `flowtide status` for the references of the others.
    """
    store = _store(home, db)
    _, state = _folded(store, execution_id)
    store.close()
    record = state.steps.get(step)
    if record is None or record.runs == 0:
        _err(f"error: execution {execution_id} has no step '{step}' that ran")
        raise typer.Exit(EXIT_INVALID)
    ref = record.result
    if isinstance(ref, dict) and isinstance(ref.get("results"), list) and ref["results"]:
        ref = ref["results"][0]  # a loop of spark steps
    if not (isinstance(ref, dict) and "uri" in ref and "format" in ref):
        _err(f"error: step '{step}' did not produce a dataset reference (not a spark step?)")
        raise typer.Exit(EXIT_INVALID)
    uri, fmt = ref.get("uri"), str(ref.get("format"))
    readers = {"parquet": "read_parquet", "csv": "read_csv_auto", "json": "read_json_auto"}
    if not isinstance(uri, str) or not uri.startswith(("file:", "/")) or fmt not in readers:
        _err(
            f"error: step '{step}' wrote {fmt} to {uri}: only parquet, csv and json on this "
            "machine's disk can be read here; read it with Spark"
        )
        raise typer.Exit(EXIT_INVALID)
    import duckdb

    path = Path(uri.removeprefix("file://"))
    pattern = str(path / "**" / "*") if path.is_dir() else str(path)
    if fmt == "parquet" and path.is_dir():
        pattern = str(path / "**" / "*.parquet")
    options = ", hive_partitioning = true" if fmt == "parquet" else ""
    source = f"{readers[fmt]}('{pattern.replace(chr(39), chr(39) * 2)}'{options})"
    con = duckdb.connect()
    try:
        total = con.execute(f"SELECT count(*) FROM {source}").fetchone()
        cursor = con.execute(f"SELECT * FROM {source}" + (f" LIMIT {limit}" if limit else ""))
        columns = [d[0] for d in cursor.description]
        rows = cursor.fetchall()
    except duckdb.Error as exc:
        _err(f"error: cannot read {uri}: {exc}")
        raise typer.Exit(EXIT_FAILED) from None
    finally:
        con.close()
    from flowtide.errors import ToolError
    from flowtide.jsonvalues import records as json_records

    try:
        records = json_records(columns, rows, root="rows")
    except ToolError as exc:
        _err(f"error: cannot show {uri}: {exc.message}")
        raise typer.Exit(EXIT_FAILED) from None
    count = int(total[0]) if total else len(records)
    if as_json:
        _print_json({"uri": uri, "format": fmt, "row_count": count, "rows": records})
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{step}: {uri} ({fmt}, {count} rows)", title_justify="left")
    for column in columns:
        table.add_column(column)
    for record_row in records:
        table.add_row(*("" if v is None else str(v) for v in record_row.values()))
    Console().print(table)
    if limit and count > len(records):
        typer.echo(f"... {count - len(records)} more rows (--limit 0 for all)")


@app.command("list")
def list_executions(
    limit: Annotated[int, typer.Option(help="How many, newest first.")] = 20,
    status_filter: Annotated[str | None, typer.Option("--status", help="Only this status.")] = None,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
    server: ServerOpt = None,
) -> None:
    """List recent executions."""
    import datetime

    if server:
        with _client(server) as api:
            items = _remote_or_exit(lambda: api.list_executions(status=status_filter, limit=limit))
        if as_json:
            _print_json(items)
            return
        for item in items:
            ts = datetime.datetime.fromtimestamp(item["created"]).strftime("%Y-%m-%d %H:%M:%S")
            typer.echo(f"{item['execution_id']}  {ts}  {item['status']:<10} {item['playbook']}")
        return
    store = _store(home, db)
    rows = store.list_executions(status=status_filter, limit=limit)
    store.close()
    if as_json:
        _print_json(
            [
                {
                    "execution_id": str(r.execution_id),
                    "status": r.status,
                    "playbook": r.playbook_path,
                    "created": r.created,
                    "updated": r.updated,
                }
                for r in rows
            ]
        )
        return
    for r in rows:
        ts = datetime.datetime.fromtimestamp(r.created).strftime("%Y-%m-%d %H:%M:%S")
        typer.echo(f"{r.execution_id}  {ts}  {r.status:<10} {r.playbook_path or r.playbook_file}")


@catalog_app.command("register")
def catalog_register(
    paths: Annotated[
        list[Path], typer.Argument(help="Playbook files or folders (searched for *.yaml).")
    ],
    home: HomeOpt = None,
    db: DbOpt = None,
    server: ServerOpt = None,
) -> None:
    """Validate and record playbooks under their metadata.path (a new version when changed).

    With --server they go to the server's catalog (run them with `flowtide run PATH
    --server URL`)."""
    import time

    from flowtide.errors import PlaybookError
    from flowtide.playbook.loader import load_playbook

    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            files.extend(sorted(list(p.rglob("*.yaml")) + list(p.rglob("*.yml"))))
        else:
            files.append(p)
    api = None
    store = None
    if server:
        api = _client(server)
    else:
        store = _store(home, db)
    bad = 0
    for file in files:
        try:
            playbook = load_playbook(file)
        except PlaybookError as exc:
            bad += 1
            _err(f"skipped: {exc}")
            continue
        if not playbook.path:
            bad += 1
            _err(f"skipped: {file}: playbook has no metadata.path")
            continue
        if api is not None:
            doc = _remote_or_exit(lambda text=playbook.text: api.register_playbook(text))
            version = doc["version"]
        else:
            assert store is not None
            version = store.register_playbook(
                playbook.path, playbook.text, source_file=str(file.resolve()), created=time.time()
            )
        typer.echo(f"{playbook.path} v{version}  ({file})")
    if api is not None:
        api.close()
    if store is not None:
        store.close()
    raise typer.Exit(EXIT_INVALID if bad and bad == len(files) else EXIT_OK)


@catalog_app.command("list")
def catalog_list(
    as_json: JsonOpt = False, home: HomeOpt = None, db: DbOpt = None, server: ServerOpt = None
) -> None:
    """List registered playbooks (latest version of each path)."""
    if server:
        with _client(server) as api:
            items = _remote_or_exit(api.list_playbooks)
        if as_json:
            _print_json(items)
            return
        for item in items:
            typer.echo(f"{item.get('path')}  v{item.get('version')}")
        return
    store = _store(home, db)
    rows = store.list_playbooks()
    store.close()
    if as_json:
        _print_json(
            [
                {
                    "path": r.path,
                    "version": r.version,
                    "versions": r.versions,
                    "source_file": r.source_file,
                }
                for r in rows
            ]
        )
        return
    for r in rows:
        typer.echo(f"{r.path}  v{r.version}  ({r.versions} versions)  {r.source_file or ''}")


CredServerOpt = Annotated[
    str | None,
    typer.Option(
        "--server",
        help="Store it on this flowtide server (the server encrypts it; needs an admin "
        "FLOWTIDE_TOKEN) instead of --db / the local store.",
        show_default=False,
    ),
]


@credential_app.command("set")
def credential_set(
    name: Annotated[str, typer.Argument(help="Alias used in playbooks (auth: NAME).")],
    body: Annotated[
        str, typer.Option("--json", help="Credential body as a JSON object (or @file).")
    ],
    kind: Annotated[str, typer.Option(help="Credential kind, e.g. postgres, http.")] = "generic",
    home: HomeOpt = None,
    db: DbOpt = None,
    server: CredServerOpt = None,
) -> None:
    """Store (or replace) a credential alias, encrypted with the master key."""
    from flowtide.credentials import CredentialVault

    try:
        text = Path(body[1:]).read_text(encoding="utf-8") if body.startswith("@") else body
    except OSError as exc:
        _err(f"error: --json {body}: cannot read file: {exc.strerror}")
        raise typer.Exit(EXIT_INVALID) from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        _err(f"error: --json is not valid JSON: {exc}")
        raise typer.Exit(EXIT_INVALID) from None
    if not isinstance(data, dict):
        _err("error: --json must be a JSON object")
        raise typer.Exit(EXIT_INVALID)
    if server:
        with _client(server) as api:
            _remote_or_exit(lambda: api.set_credential(name, data, kind))
        typer.echo(f"credential '{name}' stored on {redact_url(server)}")
        return
    from flowtide.redaction import weak_fields, weak_message

    store = _store(home, db)
    CredentialVault(store, _home(home)).set(name, data, kind=kind)
    store.close()
    typer.echo(f"credential '{name}' stored")
    for field, reason in weak_fields(data):
        _err(f"warning: {weak_message(name, field, reason)}")


@credential_app.command("list")
def credential_list(
    as_json: JsonOpt = False, home: HomeOpt = None, db: DbOpt = None, server: CredServerOpt = None
) -> None:
    """List credential aliases (never their values)."""
    if server:
        with _client(server) as api:
            rows = _remote_or_exit(api.list_credentials)
    else:
        store = _store(home, db)
        rows = store.list_credentials()
        store.close()
    if as_json:
        _print_json(rows)
        return
    for r in rows:
        typer.echo(f"{r['name']}  {r['kind']}")


@credential_app.command("delete")
def credential_delete(
    name: str, home: HomeOpt = None, db: DbOpt = None, server: CredServerOpt = None
) -> None:
    """Delete a credential alias."""
    from flowtide.errors import NotFoundError

    if server:
        with _client(server) as api:
            _remote_or_exit(lambda: api.delete_credential(name))
        typer.echo(f"credential '{name}' deleted on {redact_url(server)}")
        return

    store = _store(home, db)
    try:
        store.delete_credential(name)
    except NotFoundError as exc:
        _err(f"error: {exc}")
        raise typer.Exit(EXIT_INVALID) from None
    finally:
        store.close()
    typer.echo(f"credential '{name}' deleted")


@credential_app.command("rotate-key")
def credential_rotate_key(
    home: HomeOpt = None,
    db: DbOpt = None,
    retire: Annotated[
        bool,
        typer.Option(
            "--retire",
            help="Second step: re-encrypt once more with the newest key and drop the older"
            " ones (run it when every process has the new key).",
        ),
    ] = False,
    new_key_file: Annotated[
        Path | None,
        typer.Option(
            "--new-key-file",
            help="Where the keys go when they are in FLOWTIDE_MASTER_KEY (default:"
            " HOME/master.key.new); with the key file, the file itself is updated.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Re-encrypt every credential, keychain entry and sealed value with a new master key.

    Two steps, so that nothing is ever unreadable: `rotate-key` makes a new key, puts it
    first (it encrypts from now on) and keeps the old ones for decryption only; once every
    process has the new key, `rotate-key --retire` re-encrypts what was sealed meanwhile
    and drops the old keys. Run it where the store's master key is (the server's machine
    for --db postgresql://)."""
    from flowtide.credentials import MASTER_KEY_ENV, CredentialVault
    from flowtide.errors import CredentialError, StoreError

    store = _store(home, db)
    try:
        done = CredentialVault(store, _home(home)).rotate_key(new_key_file, retire=retire)
    except (CredentialError, StoreError) as exc:
        _err(f"error: {exc}")
        raise typer.Exit(EXIT_FAILED) from None
    finally:
        store.close()
    typer.echo(f"{done.resealed} sealed values re-encrypted with the newest master key")
    if done.from_env:
        typer.echo(
            f"the keys are in {done.key_file} (mode 0600, {done.keys} of them): put its"
            f" lines, comma-separated, in {MASTER_KEY_ENV} of every process that reads"
            " credentials, then delete the file"
        )
    else:
        typer.echo(f"the key file {done.key_file} holds {done.keys} key(s)")
    if not retire:
        typer.echo(
            "the old keys still decrypt; once every process has the new one, run"
            " `flowtide credential rotate-key --retire`"
        )


# -------------------------------------------------------------------- server, worker


@app.command("server")
def server_cmd(
    db: Annotated[
        str,
        typer.Option("--db", envvar="FLOWTIDE_DB", help="PostgreSQL URL of the event store."),
    ],
    nats_url: Annotated[
        str,
        typer.Option("--nats", envvar="FLOWTIDE_NATS", help="NATS URL for command notifications."),
    ],
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8082,
    workers: Annotated[
        int, typer.Option("--workers", min=1, help="Server processes (all stateless).")
    ] = 1,
    kv: KvOpt = "memory://",
    kv_bucket: KvBucketOpt = "flowtide_state",
    lease: Annotated[
        float,
        typer.Option(
            "--lease", min=1, help="Seconds a claimed command survives without a heartbeat."
        ),
    ] = 30.0,
    cluster_db: ClusterDbOpt = None,
    insecure_no_auth: Annotated[
        bool,
        typer.Option(
            "--insecure-no-auth",
            help="Serve every request without a token: anyone who reaches the port may run "
            "code on the workers. Only for a machine nobody else can reach.",
        ),
    ] = False,
    jwks_url: Annotated[
        str | None,
        typer.Option(
            "--jwks-url",
            envvar="FLOWTIDE_JWKS_URL",
            help="Also accept bearer JWTs signed by a key of this JWKS (single sign-on).",
            show_default=False,
        ),
    ] = None,
    jwt_issuer: Annotated[
        str | None,
        typer.Option("--jwt-issuer", envvar="FLOWTIDE_JWT_ISSUER", help="Required `iss`."),
    ] = None,
    jwt_audience: Annotated[
        str | None,
        typer.Option("--jwt-audience", envvar="FLOWTIDE_JWT_AUDIENCE", help="Required `aud`."),
    ] = None,
    jwt_roles_claim: Annotated[
        str,
        typer.Option(
            "--jwt-roles-claim",
            envvar="FLOWTIDE_JWT_ROLES_CLAIM",
            help="Claim holding the caller's roles or groups (a string or a list).",
        ),
    ] = "flowtide_roles",
    jwt_role: Annotated[
        list[str] | None,
        typer.Option(
            "--jwt-role",
            help="VALUE=ROLE: a value of the roles claim that grants ROLE (repeat it). "
            "Without any, the values must be role names.",
            show_default=False,
        ),
    ] = None,
    jwt_pool_claim: Annotated[
        str,
        typer.Option(
            "--jwt-pool-claim",
            envvar="FLOWTIDE_JWT_POOL_CLAIM",
            help="Claim naming a worker's pool (absent: any pool).",
        ),
    ] = "flowtide_pool",
    max_body: Annotated[
        int,
        typer.Option(
            "--max-body",
            envvar="FLOWTIDE_MAX_BODY",
            min=1024,
            help="Largest request body in bytes; larger ones get 413 unread.",
        ),
    ] = 16 * 1024 * 1024,
    public_metrics: Annotated[
        bool,
        typer.Option("--public-metrics", help="Serve /metrics without a token."),
    ] = False,
    tls_cert: Annotated[
        Path | None,
        typer.Option(
            "--tls-cert",
            envvar="FLOWTIDE_TLS_CERT",
            exists=True,
            dir_okay=False,
            help="Serve HTTPS with this certificate (PEM, with its chain).",
            show_default=False,
        ),
    ] = None,
    tls_key: Annotated[
        Path | None,
        typer.Option(
            "--tls-key",
            envvar="FLOWTIDE_TLS_KEY",
            exists=True,
            dir_okay=False,
            help="The certificate's private key (PEM).",
            show_default=False,
        ),
    ] = None,
    client_ca: Annotated[
        Path | None,
        typer.Option(
            "--client-ca",
            envvar="FLOWTIDE_CLIENT_CA",
            exists=True,
            dir_okay=False,
            help="Mutual TLS: require a client certificate signed by this CA (PEM).",
            show_default=False,
        ),
    ] = None,
    nats_creds: NatsCredsOpt = None,
) -> None:
    """Run the API server: executions, events, claims, the outbox relay and the reaper.

    Several processes (or machines) may serve one database: state is the event log in
    PostgreSQL and loop state in the KV (use a nats:// --kv when there is more than one
    process). The schema is upgraded on start.

    Every request but /healthz and /readyz needs a token (`flowtide token create`) or, with
    --jwks-url, a JWT of your identity provider; the server refuses to start when neither
    can authenticate anybody, unless --insecure-no-auth.
    """
    import shutil
    import tempfile

    import uvicorn

    from flowtide.auth.oidc import parse_role_map
    from flowtide.errors import FlowtideError

    if workers > 1 and kv.startswith("memory:"):
        _err("error: --workers > 1 needs a shared --kv (nats://...): loop state must be shared")
        raise typer.Exit(EXIT_INVALID)
    try:
        role_map = parse_role_map(jwt_role)
    except FlowtideError as exc:
        _err(f"error: {exc}")
        raise typer.Exit(EXIT_INVALID) from None
    if (tls_cert is None) != (tls_key is None) or (client_ca is not None and tls_cert is None):
        _err("error: --tls-cert and --tls-key go together, and --client-ca needs both")
        raise typer.Exit(EXIT_INVALID)
    nats_auth = _nats_auth(nats_creds)
    # Refused NATS credentials stop the server here with one line, rather than as a
    # traceback from each of its processes' start-up.
    _check_nats(nats_url, nats_auth)
    env = {
        "FLOWTIDE_DB": db,
        "FLOWTIDE_NATS": nats_url,
        "FLOWTIDE_KV": kv,
        "FLOWTIDE_KV_BUCKET": kv_bucket,
        "FLOWTIDE_LEASE": str(lease),
        "FLOWTIDE_MAX_BODY": str(max_body),
        "FLOWTIDE_INSECURE_NO_AUTH": "1" if insecure_no_auth else "",
        "FLOWTIDE_PUBLIC_METRICS": "1" if public_metrics else "",
        "FLOWTIDE_JWKS_URL": jwks_url or "",
        "FLOWTIDE_JWT_ISSUER": jwt_issuer or "",
        "FLOWTIDE_JWT_AUDIENCE": jwt_audience or "",
        "FLOWTIDE_JWT_ROLES_CLAIM": jwt_roles_claim,
        "FLOWTIDE_JWT_ROLES": ",".join(f"{k}={v}" for k, v in role_map.items()),
        "FLOWTIDE_JWT_POOL_CLAIM": jwt_pool_claim,
    }
    if cluster_db:
        env["FLOWTIDE_CLUSTER_DB"] = cluster_db
    # The server processes read their NATS credentials from the environment
    # (ServerSettings.from_env), never from their command line.
    env.update(nats_auth.env())
    # Prometheus multiprocess mode (flowtide.server.metrics): a fresh directory per server
    # run, set before any process imports prometheus_client; old files would be counted.
    metrics_dir = tempfile.mkdtemp(prefix="flowtide-metrics-")
    env["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    os.environ.update(env)
    # Upgrade once here, not racing in N processes (it would be safe, only slower).
    store = _store(None, db)
    try:
        if not insecure_no_auth and not jwks_url:
            from flowtide.auth.tokens import TokenStore

            if not TokenStore(store).any_active():  # type: ignore[arg-type]
                _err(
                    "error: no way to authenticate anybody: the database has no active API"
                    " token and no --jwks-url is given. Create the first admin token with\n"
                    f"  flowtide token create --role admin --db {redact_url(db)}\n"
                    "or give --jwks-url, or (on a machine nobody else can reach)"
                    " --insecure-no-auth."
                )
                raise typer.Exit(EXIT_INVALID)
    finally:
        store.close()
    auth = (
        "OFF (--insecure-no-auth)"
        if insecure_no_auth
        else "tokens" + (f" + JWTs of {redact_url(jwks_url)}" if jwks_url else "")
    )
    scheme = "https" if tls_cert else "http"
    tls = "mutual TLS" if client_ca else "TLS" if tls_cert else "no TLS"
    _err(
        f"flowtide server on {scheme}://{host}:{port} (db {redact_url(db)}, nats"
        f" {redact_url(nats_url)}, authentication: {auth}, {tls})"
    )
    ssl_options: dict[str, Any] = {}
    if tls_cert:
        import ssl

        ssl_options = {"ssl_certfile": str(tls_cert), "ssl_keyfile": str(tls_key)}
        if client_ca:
            ssl_options |= {"ssl_ca_certs": str(client_ca), "ssl_cert_reqs": ssl.CERT_REQUIRED}
    try:
        uvicorn.run(
            "flowtide.server.app:app_factory",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            log_level="warning",
            **ssl_options,
        )
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


@app.command("worker")
def worker_cmd(
    server: Annotated[
        str, typer.Option("--server", envvar="FLOWTIDE_SERVER", help="flowtide server URL.")
    ],
    nats_url: Annotated[
        str, typer.Option("--nats", envvar="FLOWTIDE_NATS", help="NATS URL (same as the server's).")
    ],
    pool: Annotated[str, typer.Option("--pool", help="Worker pool to serve.")] = "default",
    concurrency: Annotated[
        int, typer.Option("--concurrency", min=1, help="Commands run at once.")
    ] = 8,
    worker_id: Annotated[
        str | None, typer.Option("--worker-id", help="Default: HOSTNAME-PID.")
    ] = None,
    home: HomeOpt = None,
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file",
            help="File holding the worker's token (a `flowtide token create --role worker`);"
            " default: FLOWTIDE_TOKEN, or the file in FLOWTIDE_TOKEN_FILE.",
            show_default=False,
        ),
    ] = None,
    ca: Annotated[
        str | None,
        typer.Option(
            "--ca",
            envvar="FLOWTIDE_CA",
            help="CA file (PEM) that signed an https server's certificate; for mutual TLS"
            " the worker shows FLOWTIDE_CLIENT_CERT / FLOWTIDE_CLIENT_KEY.",
            show_default=False,
        ),
    ] = None,
    nats_creds: NatsCredsOpt = None,
    grace: Annotated[
        float,
        typer.Option(
            "--grace",
            min=0,
            help="On SIGTERM/SIGINT: seconds running commands get to finish; then they are"
            " stopped and handed back to the server for another worker.",
        ),
    ] = 10.0,
    python_isolation: Annotated[
        str,
        typer.Option(
            "--python-isolation",
            envvar="FLOWTIDE_PYTHON_ISOLATION",
            help="process: python steps run in child processes that cancel and timeouts"
            " kill; thread: in the worker process (cannot be stopped).",
        ),
    ] = "process",
    python_user: Annotated[
        str | None,
        typer.Option(
            "--python-user",
            envvar="FLOWTIDE_PYTHON_USER",
            help="User the python child processes run as when the worker runs as root"
            " [default: nobody].",
            show_default=False,
        ),
    ] = None,
    python_memory_mb: Annotated[
        int,
        typer.Option(
            "--python-memory-mb",
            envvar="FLOWTIDE_PYTHON_MEMORY_MB",
            min=0,
            help="Address space of a python child process, MiB (0: no limit).",
        ),
    ] = 2048,
    python_cpu_seconds: Annotated[
        float,
        typer.Option(
            "--python-cpu-seconds",
            envvar="FLOWTIDE_PYTHON_CPU_SECONDS",
            min=0,
            help="CPU seconds one python step may use (0: no limit).",
        ),
    ] = 0.0,
) -> None:
    """Claim and run commands of one pool until interrupted (SIGINT/SIGTERM: running
    commands get --grace seconds, then are handed back)."""
    import asyncio
    import signal

    from flowtide.auth.login import read_token_file
    from flowtide.errors import AuthError, FlowtideError, NatsError, ToolError
    from flowtide.runtime.remote import RemoteWorker
    from flowtide.tools.python_pool import Isolation

    try:
        python = Isolation(
            mode=python_isolation,
            memory_mb=python_memory_mb or None,
            cpu_seconds=python_cpu_seconds or None,
            user=python_user or None,
            embedded=False,
        )
        token = read_token_file(token_file) if token_file else None
        worker = RemoteWorker(
            server,
            nats_url,
            pool=pool,
            concurrency=concurrency,
            worker_id=worker_id,
            home=_home(home),
            token=token,
            nats_auth=_nats_auth(nats_creds),
            ca=ca,
            python=python,
            grace=grace,
        )
    except FlowtideError as exc:
        _err(f"error: {exc}")
        raise typer.Exit(EXIT_INVALID) from None

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, worker.stop)
        await worker.run()

    _err(f"flowtide worker {worker.worker_id} (pool {pool}) -> {redact_url(server)}")
    try:
        try:
            import uvloop
        except ImportError:
            asyncio.run(main())
        else:
            uvloop.run(main())
    except (NatsError, AuthError, ToolError) as exc:
        # Credentials refused (NATS or the API), the pool's consumer out of reach, or
        # python steps unable to start: say which and stop, instead of a traceback.
        _err(f"error: {exc}")
        raise typer.Exit(EXIT_FAILED) from None
    if worker.stuck:
        # Threads still in code that cannot be interrupted (their commands were handed
        # back): the interpreter would wait for them at exit.
        from flowtide.tools.registry import cancel_running

        cancel_running(None)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_OK)


# ------------------------------------------------------------------------------ db

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


def _schema_report(
    home: Path | None, db: str | None, cluster_db: str | None, *, apply: bool
) -> list[dict[str, Any]]:
    """[{database, component, version, latest}] for --db (and --cluster-db); with `apply`,
    migrations are applied first and `from` holds the version found."""
    from flowtide.errors import StoreError
    from flowtide.store.postgres import display_dsn, is_postgres_url

    if not (db and is_postgres_url(db)):
        if cluster_db:
            _err("error: --cluster-db needs a PostgreSQL --db")
            raise typer.Exit(EXIT_INVALID)
        from flowtide.store.sqlite import SCHEMA_VERSION

        path = Path(db) if db else _home(home) / "flowtide.db"
        _store(home, db).close()  # opening a SQLite store migrates it
        return [
            {
                "database": str(path),
                "component": "sqlite",
                "from": SCHEMA_VERSION,
                "version": SCHEMA_VERSION,
                "latest": SCHEMA_VERSION,
            }
        ]
    import psycopg

    from flowtide.store import pgschema

    targets = [
        (db, [pgschema.SHARD] + ([] if cluster_db and cluster_db != db else [pgschema.CLUSTER]))
    ]
    if cluster_db and cluster_db != db:
        targets.append((cluster_db, [pgschema.CLUSTER]))
    rows: list[dict[str, Any]] = []
    for dsn, components in targets:
        where = display_dsn(dsn)
        before: dict[str, int] = {}
        try:
            with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
                if apply:
                    report = pgschema.upgrade(conn, components, where=where)
                    before = {name: old for name, old, _ in report}
                found = pgschema.current_versions(conn)
        except psycopg.Error as exc:
            _err(f"error: {where}: {scrub_url(str(exc), dsn)}")
            raise typer.Exit(EXIT_FAILED) from None
        except StoreError as exc:
            _err(f"error: {exc}")
            raise typer.Exit(EXIT_FAILED) from None
        for c in components:
            rows.append(
                {
                    "database": where,
                    "component": c.name,
                    "from": before.get(c.name, found[c.name]),
                    "version": found[c.name],
                    "latest": c.latest,
                }
            )
    return rows


@db_app.command("upgrade")
def db_upgrade(
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
    cluster_db: ClusterDbOpt = None,
) -> None:
    """Apply pending schema migrations (safe to run from several machines at once)."""
    rows = _schema_report(home, db, cluster_db, apply=True)
    if as_json:
        _print_json(rows)
        return
    for r in rows:
        change = (
            "up to date" if r["from"] == r["version"] else f"upgraded {r['from']} -> {r['version']}"
        )
        typer.echo(f"{r['database']}  {r['component']}: version {r['version']} ({change})")


@db_app.command("status")
def db_status(
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
    cluster_db: ClusterDbOpt = None,
) -> None:
    """Show each schema part's version and whether `flowtide db upgrade` has work to do.
    Exits 1 when a migration is pending."""
    rows = _schema_report(home, db, cluster_db, apply=False)
    pending = any(r["version"] < r["latest"] for r in rows)
    if as_json:
        _print_json(rows)
    else:
        for r in rows:
            state = (
                "current"
                if r["version"] == r["latest"]
                else (
                    f"needs upgrade to {r['latest']}"
                    if r["version"] < r["latest"]
                    else f"newer than this flowtide ({r['latest']})"
                )
            )
            typer.echo(f"{r['database']}  {r['component']}: version {r['version']} ({state})")
    if pending:
        raise typer.Exit(EXIT_FAILED)


# ------------------------------------------------------------------------------ kv

kv_app = typer.Typer(
    help=(
        "Look inside the key-value bucket that holds loop state, like `nats kv`. Keys are "
        "exec.<execution_id>.loop.<step>.<instance>.meta | r.<index> | done, and an "
        "execution's keys are removed when it ends. Needs a store other processes can see: "
        "--url nats://HOST:PORT (or FLOWTIDE_KV)."
    ),
    no_args_is_help=True,
)
app.add_typer(kv_app, name="kv")

KvUrlOpt = Annotated[
    str,
    typer.Option(
        "--url",
        envvar="FLOWTIDE_KV",
        help=(
            "The KV server, nats://[USER:PASS@]HOST:PORT. memory:// lives inside one process, "
            "so there is nothing to see in it from here."
        ),
    ),
]
KvBucketNameOpt = Annotated[
    str, typer.Option("--bucket", envvar="FLOWTIDE_KV_BUCKET", help="Bucket to look at.")
]


class _KVUnavailable(Exception):
    """The KV could not be opened; the message names the URL without its secret."""


async def _open_kv(
    url: str,
    bucket: str,
    *,
    ttl: float | None = 3600.0,
    create: bool = True,
    nats_creds: Path | None = None,
) -> Any:
    """Connect to bucket `bucket` at `url` (created with `ttl` if missing, when `create`),
    with the NATS credentials of --nats-creds or FLOWTIDE_NATS_USER/PASSWORD.

    Raises:
        _KVUnavailable: bad URL or bucket name, server unreachable or refusing.
    """
    from flowtide.kv import KVError, connect
    from flowtide.natsauth import NatsAuth

    shown = redact_url(url)
    auth = NatsAuth.from_env(creds=str(nats_creds) if nats_creds else None)
    try:
        return await connect(url, bucket, ttl=ttl, create=create, nats_auth=auth)
    except KVError as exc:
        reason = auth.scrub(exc.message, url)
    except Exception as exc:  # a driver's error the adapter let through
        reason = auth.scrub(f"{type(exc).__name__}: {exc}", url)
    # The adapters' messages mostly name the URL already; say it once.
    if shown in reason:
        raise _KVUnavailable(reason)
    raise _KVUnavailable(f"cannot open KV bucket {bucket!r} at {shown}: {reason}")


async def _close_kv(kv: Any) -> None:
    # The command's outcome is already decided; a handle that fails to close (server
    # gone) must not turn it into an error.
    try:
        await kv.close()
    except Exception:
        pass


def _require_shared_kv(url: str) -> None:
    """Exit 2 for memory://: each process has its own, so another process's state is
    never in it."""
    if url.partition("://")[0].lower() == "memory":
        _err(
            f"error: {url} is a store inside one process: `flowtide kv` cannot see what a run "
            "keeps there. Run with --kv nats://HOST:PORT and pass the same URL here "
            "(--url nats://HOST:PORT, or FLOWTIDE_KV)."
        )
        raise typer.Exit(EXIT_INVALID)


def _kv_command(
    url: str,
    bucket: str,
    body: Any,
    *,
    interrupt_ok: bool = False,
    nats_creds: Path | None = None,
) -> None:
    """Run `await body(kv)` on an open handle and turn KV errors into exit codes:
    2 for bad input (URL, key, filter, no such key or bucket), 1 for a failure."""
    import asyncio

    from flowtide.kv import BucketNotFoundError, InvalidKeyError, KeyNotFoundError, KVError

    _require_shared_kv(url)

    async def main() -> None:
        from flowtide.loopstate import DEFAULT_BUCKET

        # flowtide's own state bucket may not exist before the first run (`kv watch` in
        # one terminal, `run` in another); any other name must: `--bucket typo` is an
        # error, not a new bucket.
        kv = await _open_kv(url, bucket, create=bucket == DEFAULT_BUCKET, nats_creds=nats_creds)
        try:
            await body(kv)
        finally:
            await _close_kv(kv)

    try:
        asyncio.run(main())
    except typer.Exit:
        raise
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_OK if interrupt_ok else 130) from None
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep Python from reporting
        # the failed flush of stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(EXIT_OK) from None
    except _KVUnavailable as exc:
        _err(f"error: {exc}")
        raise typer.Exit(EXIT_INVALID) from None
    except (InvalidKeyError, KeyNotFoundError, BucketNotFoundError) as exc:
        hint = ""
        if isinstance(exc, KeyNotFoundError) and exc.operation is not None:
            hint = f"; `flowtide kv history {exc.key}` shows what it held"
        _err(f"error: {scrub_url(exc.message, url)}{hint}")
        raise typer.Exit(EXIT_INVALID) from None
    except KVError as exc:
        _err(f"error: {scrub_url(exc.message, url)}")
        raise typer.Exit(EXIT_FAILED) from None
    except Exception as exc:  # never a traceback, and never the URL's password
        _err(f"error: {scrub_url(f'{type(exc).__name__}: {exc}', url)}")
        raise typer.Exit(EXIT_FAILED) from None


def _kv_time(created: float, *, iso: bool = False) -> str:
    import datetime

    if iso:
        return datetime.datetime.fromtimestamp(created, tz=datetime.UTC).isoformat()
    return datetime.datetime.fromtimestamp(created).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _kv_text(value: bytes) -> str | None:
    """The value as text when it is UTF-8, else None."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _kv_entry_doc(entry: Any) -> dict[str, Any]:
    import base64

    doc: dict[str, Any] = {
        "bucket": entry.bucket,
        "key": entry.key,
        "revision": entry.revision,
        "operation": entry.operation.value,
        "created": _kv_time(entry.created, iso=True),
        "delta": entry.delta,
    }
    text = _kv_text(entry.value)
    if text is None:
        doc["value_base64"] = base64.b64encode(entry.value).decode("ascii")
    else:
        doc["value"] = text
    return doc


def _kv_one_line(value: bytes) -> str:
    """A value for a one-line display: text as it is when it is one printable line,
    JSON-quoted when it holds newlines or control characters, base64 when binary."""
    import base64

    text = _kv_text(value)
    if text is None:
        return "base64:" + base64.b64encode(value).decode("ascii")
    return text if text.isprintable() else json.dumps(text)


def _json_line(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    sys.stdout.flush()


@kv_app.command("ls")
def kv_ls(
    filter_: Annotated[
        str,
        typer.Argument(
            metavar="FILTER",
            help="Keys to list: '*' matches one token, a final '>' the rest (e.g. 'exec.>').",
            show_default=False,
        ),
    ] = ">",
    url: KvUrlOpt = "memory://",
    bucket: KvBucketNameOpt = "flowtide_state",
    nats_creds: NatsCredsOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list of keys.")] = False,
) -> None:
    """List the keys that hold a value, sorted, one per line."""

    async def body(kv: Any) -> None:
        keys = await kv.keys(filter_)
        if as_json:
            _print_json(keys)
            return
        for key in keys:
            sys.stdout.write(key + "\n")
        if not keys:
            _err(f"no keys match {filter_!r} in bucket {bucket!r}")

    _kv_command(url, bucket, body, nats_creds=nats_creds)


@kv_app.command("get")
def kv_get(
    key: Annotated[str, typer.Argument(help="The key.")],
    revision: Annotated[
        int | None,
        typer.Option(
            "--revision", min=1, help="That stored revision of the key instead of the newest."
        ),
    ] = None,
    raw: Annotated[
        bool, typer.Option("--raw", help="Print only the value's bytes, as they are.")
    ] = False,
    url: KvUrlOpt = "memory://",
    bucket: KvBucketNameOpt = "flowtide_state",
    nats_creds: NatsCredsOpt = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print the entry as a JSON object: value as text, or value_base64 when binary.",
        ),
    ] = False,
) -> None:
    """Show a key's value, revision, creation time and operation.

    A value that is not UTF-8 is shown as base64, with a note. Exit 2 when
    the key holds no value (`flowtide kv history KEY` shows a deleted one).
    """

    async def body(kv: Any) -> None:
        entry = await kv.get(key, revision)
        if raw:
            sys.stdout.buffer.write(entry.value)
            sys.stdout.flush()
            return
        if as_json:
            _print_json(_kv_entry_doc(entry))
            return
        text = _kv_text(entry.value)
        lines = [
            f"key:       {entry.key}",
            f"bucket:    {entry.bucket}",
            f"revision:  {entry.revision}",
            f"created:   {_kv_time(entry.created)}",
            f"operation: {entry.operation.value}",
        ]
        if text is None:
            import base64

            lines.append(f"value ({len(entry.value)} bytes, not UTF-8: shown as base64):")
            lines.append(base64.b64encode(entry.value).decode("ascii"))
        else:
            lines.append(f"value ({len(entry.value)} bytes):")
            lines.append(text)
        sys.stdout.write("\n".join(lines) + "\n")

    _kv_command(url, bucket, body, nats_creds=nats_creds)


@kv_app.command("history")
def kv_history(
    key: Annotated[str, typer.Argument(help="The key.")],
    url: KvUrlOpt = "memory://",
    bucket: KvBucketNameOpt = "flowtide_state",
    nats_creds: NatsCredsOpt = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list of entries, oldest first.")
    ] = False,
) -> None:
    """Show every stored message of a key, oldest first.

    Delete and purge markers included; the bucket keeps as many messages per
    key as its history setting allows.
    """

    async def body(kv: Any) -> None:
        entries = await kv.history(key)
        if as_json:
            _print_json([_kv_entry_doc(e) for e in entries])
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"{key} in bucket {bucket}", title_justify="left")
        for column in ("revision", "operation", "created", "value"):
            table.add_column(column, overflow="fold")
        for e in entries:
            table.add_row(
                str(e.revision), e.operation.value, _kv_time(e.created), _kv_one_line(e.value)
            )
        Console().print(table)

    _kv_command(url, bucket, body, nats_creds=nats_creds)


@kv_app.command("watch")
def kv_watch(
    filter_: Annotated[
        str,
        typer.Argument(
            metavar="FILTER",
            help="Keys to watch: '*' matches one token, a final '>' the rest.",
            show_default=False,
        ),
    ] = ">",
    history: Annotated[
        bool,
        typer.Option("--history", help="Start with every stored message, not only the newest."),
    ] = False,
    updates_only: Annotated[
        bool, typer.Option("--updates-only", help="Skip what is stored; show only new writes.")
    ] = False,
    url: KvUrlOpt = "memory://",
    bucket: KvBucketNameOpt = "flowtide_state",
    nats_creds: NatsCredsOpt = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help=(
                "JSON lines: one object per entry as it arrives (as `get --json`), and "
                '{"end_of_initial_data": true} after what was stored. The one --json that '
                "is a stream."
            ),
        ),
    ] = False,
) -> None:
    """Print entries as they are written, until Ctrl-C (exit 0).

    One line each: time, operation, key, revision, value. First what is
    stored (the newest message per key; --history: all of them), then a
    line marking the end of it, then every new write, delete and purge.
    """
    if history and updates_only:
        _err("error: --history and --updates-only exclude each other")
        raise typer.Exit(EXIT_INVALID)

    async def body(kv: Any) -> None:
        from flowtide.kv import KVError

        initial = 0
        async with kv.watch(filter_, include_history=history, updates_only=updates_only) as w:
            async for entry in w:
                if entry is None:
                    if as_json:
                        _json_line({"end_of_initial_data": True})
                    else:
                        sys.stdout.write(
                            f"--- end of initial data ({initial} entries); "
                            "watching for updates, Ctrl-C to stop ---\n"
                        )
                        sys.stdout.flush()
                    continue
                initial += 1
                if as_json:
                    _json_line(_kv_entry_doc(entry))
                else:
                    sys.stdout.write(
                        f"{_kv_time(entry.created)}  {entry.operation.value:<5}  {entry.key}  "
                        f"rev={entry.revision}  {_kv_one_line(entry.value)}\n"
                    )
                    sys.stdout.flush()
        raise KVError(f"the watch on bucket {bucket!r} ended (bucket deleted or connection lost)")

    _kv_command(url, bucket, body, interrupt_ok=True, nats_creds=nats_creds)


@kv_app.command("del")
def kv_del(
    key: Annotated[str, typer.Argument(help="The key.")],
    purge: Annotated[
        bool, typer.Option("--purge", help="Drop the key's history too (one PURGE marker stays).")
    ] = False,
    url: KvUrlOpt = "memory://",
    bucket: KvBucketNameOpt = "flowtide_state",
    nats_creds: NatsCredsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Delete a key: a DEL marker is written, its history kept.

    --purge drops the history too (one PURGE marker stays). Exit 2 when the
    key holds no value (with --purge: when nothing of it is stored).
    """

    async def body(kv: Any) -> None:
        # Deleting a missing key succeeds in ADR-8 (it writes a marker); here that is
        # almost always a mistyped key, so it is reported instead.
        if purge:
            await kv.history(key)
            await kv.purge(key)
        else:
            await kv.get(key)
            await kv.delete(key)
        operation = "PURGE" if purge else "DEL"
        if as_json:
            _print_json({"bucket": bucket, "key": key, "operation": operation})
        else:
            sys.stdout.write(
                f"purged {key} (history dropped)\n" if purge else f"deleted {key} (history kept)\n"
            )

    _kv_command(url, bucket, body, nats_creds=nats_creds)


@kv_app.command("status")
def kv_status(
    url: KvUrlOpt = "memory://",
    bucket: KvBucketNameOpt = "flowtide_state",
    nats_creds: NatsCredsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show the bucket's size and configuration.

    Values, history, TTL, bytes, storage, replicas, compression and the
    backing store.
    """

    async def body(kv: Any) -> None:
        import dataclasses

        status = await kv.status()
        if as_json:
            _print_json(dataclasses.asdict(status))
            return
        ttl = "none (values never expire)" if status.ttl is None else f"{status.ttl:g} s"
        max_size = "unlimited" if status.max_value_size is None else f"{status.max_value_size} B"
        rows = [
            ("bucket", status.bucket),
            ("values", status.values),
            ("history", status.history),
            ("ttl", ttl),
            ("max value size", max_size),
            ("bytes", status.bytes),
            ("storage", status.storage),
            ("replicas", status.replicas),
            ("compression", "s2" if status.compression else "none"),
            ("backing store", status.backing_store),
            ("url", redact_url(url)),
        ]
        sys.stdout.write("".join(f"{name + ':':<16}{value}\n" for name, value in rows))

    _kv_command(url, bucket, body, nats_creds=nats_creds)


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
) -> None:
    if ca:
        os.environ["FLOWTIDE_CA"] = ca


def main() -> None:
    app()


if __name__ == "__main__":
    main()
