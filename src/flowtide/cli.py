"""The `flowtide` command line. Thin: every command calls the runtimes or the store."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

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
app.add_typer(catalog_app, name="catalog")
app.add_typer(credential_app, name="credential")

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
    Path | None,
    typer.Option(
        "--db",
        envvar="FLOWTIDE_DB",
        help="SQLite event store (default: HOME/flowtide.db).",
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


def _home(home: Path | None) -> Path:
    return home or Path(".flowtide")


def _store(home: Path | None, db: Path | None) -> Store:
    from flowtide.store.sqlite import SQLiteStore

    return SQLiteStore(db or _home(home) / "flowtide.db")


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
    db: Path | None,
    as_json: bool,
    spark_master: str | None = None,
) -> int:
    """Run (or resume) one execution embedded and report it. Returns the exit code."""
    import asyncio

    if spark_master:
        from flowtide.spark.session import set_master

        set_master(spark_master)

    from flowtide.credentials import CredentialVault
    from flowtide.errors import FlowtideError, PlaybookError, TemplateError
    from flowtide.runtime.local import LocalRuntime
    from flowtide.runtime.report import error_location, execution_document

    store = _store(home, db)
    vault = CredentialVault(store, _home(home))
    show_progress = (
        not as_json and sys.stderr.isatty() and os.environ.get("FLOWTIDE_NO_PROGRESS") is None
    )
    view = None
    started_id: list[int] = []
    location: list[str | None] = []

    async def main() -> dict[str, Any]:
        nonlocal view
        listener = None
        if show_progress:
            from rich.console import Console

            from flowtide.runtime.progress import ProgressView

            view = ProgressView(Console(stderr=True), title=target or f"execution {execution_id}")
            listener = view.on_events
        async with LocalRuntime(
            store, credentials=vault, listener=listener, data_dir=_home(home) / "data"
        ) as runtime:
            if action == "run":
                assert target is not None
                playbook, version = _load_target(target, store)
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
            return execution_document(state)

    try:
        doc = asyncio.run(main())
    except (PlaybookError, TemplateError) as exc:
        _err(f"error: {exc}")
        return EXIT_INVALID
    except FlowtideError as exc:
        _err(f"error: {exc}")
        return EXIT_INVALID
    except KeyboardInterrupt:
        if started_id:
            _err(
                f"\ninterrupted: execution {started_id[0]} can continue with `flowtide resume {started_id[0]}`"
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
    target: Annotated[
        str, typer.Argument(help="Playbook file, or a catalog path (PATH or PATH@VERSION).")
    ],
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Override a workload key: KEY=VALUE (VALUE parsed as JSON when it can be).",
        ),
    ] = None,
    payload: Annotated[
        str | None,
        typer.Option("--payload", help="Workload overrides as a JSON object (or @file)."),
    ] = None,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
    spark_master: SparkMasterOpt = None,
) -> None:
    """Run a playbook embedded, to the end.

    Exit code 0: completed; 1: failed or cancelled; 2: invalid playbook or input
    (nothing ran). Ctrl-C stops the run; `flowtide resume ID` continues it.
    """
    try:
        overrides = _overrides(set_, payload)
    except typer.BadParameter as exc:
        _err(f"error: {exc}")
        raise typer.Exit(EXIT_INVALID) from None
    raise typer.Exit(
        _execute(
            "run",
            target=target,
            overrides=overrides,
            home=home,
            db=db,
            as_json=as_json,
            spark_master=spark_master,
        )
    )


@app.command()
def resume(
    execution_id: Annotated[int, typer.Argument(help="Execution to continue.")],
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
    spark_master: SparkMasterOpt = None,
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
            report.append(
                {
                    "file": str(file),
                    "valid": True,
                    "name": playbook.name,
                    "steps": len(playbook.steps),
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
) -> None:
    """Show an execution's status, steps and result (rebuilt from its event log)."""
    from flowtide.runtime.report import execution_document

    store = _store(home, db)
    row, state = _folded(store, execution_id)
    doc = execution_document(state)
    if not state.terminal:
        doc["status"] = "running" if row.status == "running" else row.status
    store.close()
    if as_json:
        _print_json(doc)
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(
        f"execution [bold]{doc['execution_id']}[/] {doc['status']}  playbook {row.playbook_path or row.playbook_file}"
    )
    table = Table(box=None)
    for col in ("step", "status", "runs", "error"):
        table.add_column(col)
    for name, step in doc["steps"].items():
        err = (step["error"] or {}).get("message", "") if step["error"] else ""
        table.add_row(name, step["status"], str(step["runs"]), str(err)[:80])
    console.print(table)
    if doc["error"]:
        console.print(f"[red]error[/]: {doc['error']}")


@app.command()
def events(
    execution_id: Annotated[int, typer.Argument(help="Execution id.")],
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
) -> None:
    """Print an execution's event log in order."""
    import datetime

    store = _store(home, db)
    _execution_or_exit(store, execution_id)
    log = store.events(execution_id)
    store.close()
    if as_json:
        _print_json(
            [
                e.to_dict() | {"event_id": str(e.event_id), "execution_id": str(e.execution_id)}
                for e in log
            ]
        )
        return
    for e in log:
        ts = datetime.datetime.fromtimestamp(e.time).strftime("%H:%M:%S.%f")[:-3]
        extra = ""
        if e.error:
            extra = f" error={e.error.get('kind')}: {str(e.error.get('message'))[:100]}"
        elif (
            e.payload
            and e.type in ("loop.item", "command.issued")
            and "loop_index" in (e.payload or {})
        ):
            extra = f" index={e.payload.get('loop_index')}"
        elif e.type == "loop.item":
            extra = f" index={(e.payload or {}).get('index')}"
        typer.echo(f"{ts} {e.type:<20} {e.step or '':<24} {e.status or '':<10}{extra}")


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
    from flowtide.tools.postgres import to_jsonable

    records = [{c: to_jsonable(v) for c, v in zip(columns, r, strict=True)} for r in rows]
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
) -> None:
    """List recent executions."""
    import datetime

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
) -> None:
    """Validate and record playbooks under their metadata.path (a new version when changed)."""
    import time

    from flowtide.errors import PlaybookError
    from flowtide.playbook.loader import load_playbook

    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            files.extend(sorted(list(p.rglob("*.yaml")) + list(p.rglob("*.yml"))))
        else:
            files.append(p)
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
        version = store.register_playbook(
            playbook.path, playbook.text, source_file=str(file.resolve()), created=time.time()
        )
        typer.echo(f"{playbook.path} v{version}  ({file})")
    store.close()
    raise typer.Exit(EXIT_INVALID if bad and bad == len(files) else EXIT_OK)


@catalog_app.command("list")
def catalog_list(as_json: JsonOpt = False, home: HomeOpt = None, db: DbOpt = None) -> None:
    """List registered playbooks (latest version of each path)."""
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


@credential_app.command("set")
def credential_set(
    name: Annotated[str, typer.Argument(help="Alias used in playbooks (auth: NAME).")],
    body: Annotated[
        str, typer.Option("--json", help="Credential body as a JSON object (or @file).")
    ],
    kind: Annotated[str, typer.Option(help="Credential kind, e.g. postgres, http.")] = "generic",
    home: HomeOpt = None,
    db: DbOpt = None,
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
    store = _store(home, db)
    CredentialVault(store, _home(home)).set(name, data, kind=kind)
    store.close()
    typer.echo(f"credential '{name}' stored")


@credential_app.command("list")
def credential_list(as_json: JsonOpt = False, home: HomeOpt = None, db: DbOpt = None) -> None:
    """List credential aliases (never their values)."""
    store = _store(home, db)
    rows = store.list_credentials()
    store.close()
    if as_json:
        _print_json(rows)
        return
    for r in rows:
        typer.echo(f"{r['name']}  {r['kind']}")


@credential_app.command("delete")
def credential_delete(name: str, home: HomeOpt = None, db: DbOpt = None) -> None:
    """Delete a credential alias."""
    from flowtide.errors import NotFoundError

    store = _store(home, db)
    try:
        store.delete_credential(name)
    except NotFoundError as exc:
        _err(f"error: {exc}")
        raise typer.Exit(EXIT_INVALID) from None
    finally:
        store.close()
    typer.echo(f"credential '{name}' deleted")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
