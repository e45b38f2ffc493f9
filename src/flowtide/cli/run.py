"""`flowtide run|resume|validate|execute|cancel`: start executions and see them end.

`run` and `resume` run embedded (`flowtide.embedded.run_to_end`) or, with --server, on a
flowtide server; `execute` and `cancel` only talk to a server.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from flowtide.cli.backends import (
    close_kv,
    open_kv,
    open_store,
    remote_or_exit,
    server_client,
)
from flowtide.cli.options import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_INVALID,
    EXIT_OK,
    DbOpt,
    ExecutionIdArg,
    HomeOpt,
    JsonOpt,
    KvBucketOpt,
    KvOpt,
    KvTtlOpt,
    NatsCredsOpt,
    ServerOpt,
    ServerUrlOpt,
    SparkMasterOpt,
    default,
    err,
    home_dir,
    print_json,
)
from flowtide.cli.overrides import AllowExtraOpt, refuse_undeclared, refuse_undeclared_remote
from flowtide.cli.summary import print_summary, print_warnings
from flowtide.kv.errors import KVUnavailable
from flowtide.urls import redact_url, scrub_url

if TYPE_CHECKING:
    from flowtide.client import ServerClient
    from flowtide.engine.state import ExecutionState
    from flowtide.runtime.local import LocalRuntime
    from flowtide.runtime.progress import ProgressView
    from flowtide.store.base import Store

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


def _show_progress(as_json: bool) -> bool:
    return not as_json and sys.stderr.isatty() and os.environ.get("FLOWTIDE_NO_PROGRESS") is None


# ------------------------------------------------------------------------ on a server


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


def _catalog_parts(catalog_id: str) -> tuple[str, int | None]:
    path, _, version = catalog_id.partition("@")
    return path, int(version) if version.isdigit() else None


def _follow_remote(
    api: ServerClient, execution_id: int, text: str | None, title: str
) -> dict[str, Any]:
    """Wait for a remote execution, with the embedded run's live display when stderr is a
    terminal (the state is folded here from the events the server logs). Either way the
    run is followed on its event stream, and its document (every result) is fetched once,
    when the stream says it has ended: what following costs per iteration does not grow
    with the iterations done."""
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
        return dict(api.final(execution_id))
    return dict(api.wait(execution_id))


def _run_remote(
    server: str,
    target: str,
    overrides: dict[str, Any],
    *,
    as_json: bool,
    pool: str | None,
    allow_extra: bool = False,
) -> int:
    """Submit `target` to a server and follow it to the end."""
    from flowtide.client import ServerError
    from flowtide.errors import PlaybookError

    try:
        text, catalog_id = _remote_target(target)
    except typer.BadParameter as exc:
        err(f"error: {exc}")
        return EXIT_INVALID
    if text is not None:
        from flowtide.playbook.loader import parse_playbook

        with contextlib.suppress(PlaybookError):  # the server reports what is invalid
            print_warnings(parse_playbook(text, target), target)
    eid: int | None = None
    with server_client(server) as api:
        try:
            if not allow_extra:
                refuse_undeclared_remote(api, text, target, overrides)
        except PlaybookError as exc:
            err(f"error: {exc}")
            return EXIT_INVALID
        try:
            eid = api.execute(playbook=text, catalog_id=catalog_id, payload=overrides, pool=pool)
            if not as_json:
                err(f"execution {eid} started on {redact_url(api.url)}")
            if text is None and _show_progress(as_json):
                with contextlib.suppress(ServerError):
                    text = api.get_playbook(*_catalog_parts(target)).get("content")
            doc = _follow_remote(api, eid, text, target)
        except ServerError as exc:
            err(f"error: {target}: {exc}" if eid is None else f"error: {exc}")
            return EXIT_INVALID if 400 <= exc.status < 500 and eid is None else EXIT_FAILED
        except KeyboardInterrupt:
            if eid is not None:
                err(
                    f"\ninterrupted; the execution goes on on the server: "
                    f"`flowtide status {eid} --server {redact_url(api.url)}`, "
                    f"`flowtide cancel {eid} --server ...` stops it"
                )
            return EXIT_INTERRUPTED
    # The same document as `flowtide run` embedded (a run started here has no trigger).
    doc.pop("playbook", None)
    doc.pop("trigger", None)
    if as_json:
        print_json(doc)
    else:
        print_summary(doc)
    return EXIT_OK if doc["status"] == "completed" else EXIT_FAILED


# --------------------------------------------------------------------------- embedded


def _load_target(
    target: str, store: Store, references: tuple[str, ...] = ()
) -> tuple[Any, int | None]:
    """The playbook `target` names (a file, or a catalog entry) and its version, every
    template's names resolved (`references`: more names the run is given).

    Raises:
        PlaybookError: no such playbook, or an invalid one.
    """
    from flowtide.errors import NotFoundError
    from flowtide.playbook.loader import load_playbook, parse_playbook

    path = Path(target)
    if path.exists():
        return load_playbook(path, references=references), None
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
    return parse_playbook(row.text, row.source_file, references=references), row.version


def _execute(
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
    allow_extra: bool = False,
) -> int:
    """Run `target` (or resume `execution_id`) embedded and report it (`allow_extra`:
    overrides need not be declared by the workload). Returns the exit code."""
    import asyncio

    if spark_master:
        from flowtide.spark.session import set_master

        set_master(spark_master)

    from flowtide.documents.execution import error_location, shown
    from flowtide.embedded import run_to_end
    from flowtide.errors import FlowtideError, PlaybookError, TemplateError
    from flowtide.kv import KVError
    from flowtide.redaction import install_log_masking

    install_log_masking()
    store = open_store(home, db)
    started_id: list[int] = []
    same_kv = "" if kv_url.startswith("memory:") else " (with the same --kv)"
    show_progress = _show_progress(as_json)
    view: ProgressView | None = None

    async def start(runtime: LocalRuntime) -> int:
        if target is not None:
            given = tuple(overrides or {}) if allow_extra else ()
            playbook, version = _load_target(target, store, given)
            if not allow_extra:
                refuse_undeclared(playbook.workload, overrides or {}, target)
            print_warnings(playbook, target)
            eid = await runtime.start(playbook, workload=overrides or {}, catalog_version=version)
        else:
            assert execution_id is not None
            eid = execution_id
            await runtime.resume(eid)
        started_id.append(eid)
        return eid

    def watch(eid: int) -> contextlib.AbstractContextManager[Any]:
        if view is None:
            return contextlib.nullcontext()
        view.track(eid)
        return view

    async def main() -> ExecutionState:
        nonlocal view
        if show_progress:
            from rich.console import Console

            from flowtide.runtime.progress import ProgressView

            view = ProgressView(Console(stderr=True), title=target or f"execution {execution_id}")
        # Connected before anything starts, so a bad --kv runs nothing.
        kv = await open_kv(kv_url, kv_bucket, ttl=kv_ttl or None, nats_creds=nats_creds)
        try:
            return await run_to_end(
                store,
                home_dir(home),
                start,
                kv=kv,
                listener=view.on_events if view is not None else None,
                watch=watch,
            )
        finally:
            await close_kv(kv)

    try:
        state = asyncio.run(main())
    except KVUnavailable as exc:
        err(f"error: {exc}")
        return EXIT_INVALID
    except (PlaybookError, TemplateError) as exc:
        err(f"error: {scrub_url(str(exc), kv_url)}")
        return EXIT_INVALID
    except KVError as exc:
        # The KV went away mid-run: a failure, not bad input, and the log still holds
        # everything that finished.
        err(f"error: {scrub_url(exc.message, kv_url)}")
        if started_id:
            err(
                f"execution {started_id[0]} stopped; once the KV is back, "
                f"`flowtide resume {started_id[0]}`{same_kv} continues it"
            )
        return EXIT_FAILED
    except FlowtideError as exc:
        err(f"error: {scrub_url(str(exc), kv_url)}")
        return EXIT_INVALID
    except KeyboardInterrupt:
        if started_id:
            err(
                f"\ninterrupted: execution {started_id[0]} can continue with `flowtide resume {started_id[0]}`{same_kv}"
            )
        return EXIT_INTERRUPTED
    finally:
        store.close()
    # Printed, not used: values of the execution's secret set are masked.
    doc: dict[str, Any] = dict(shown(state))
    if as_json:
        print_json(doc)
    else:
        print_summary(doc, error_location(state))
    return EXIT_OK if doc["status"] == "completed" else EXIT_FAILED


# --------------------------------------------------------------------------- commands


def run(
    target: TargetArg,
    set_: SetOpt = None,
    payload: PayloadOpt = None,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
    spark_master: SparkMasterOpt = None,
    kv: KvOpt = default("server.kv"),
    kv_bucket: KvBucketOpt = default("server.kv_bucket"),
    kv_ttl: KvTtlOpt = 3600.0,
    nats_creds: NatsCredsOpt = None,
    server: ServerOpt = None,
    allow_extra: AllowExtraOpt = False,
) -> None:
    """Run a playbook embedded (or on a flowtide server with --server), to the end.

    Exit code 0: completed; 1: failed or cancelled; 2: invalid playbook or input
    (nothing ran). Ctrl-C stops the run; `flowtide resume ID` continues it.
    """
    try:
        overrides = _overrides(set_, payload)
    except typer.BadParameter as exc:
        err(f"error: {exc}")
        raise typer.Exit(EXIT_INVALID) from None
    if server:
        raise typer.Exit(
            _run_remote(
                server, target, overrides, as_json=as_json, pool=None, allow_extra=allow_extra
            )
        )
    raise typer.Exit(
        _execute(
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
            allow_extra=allow_extra,
        )
    )


def resume(
    execution_id: Annotated[int, typer.Argument(help="Execution to continue.")],
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
    spark_master: SparkMasterOpt = None,
    kv: KvOpt = default("server.kv"),
    kv_bucket: KvBucketOpt = default("server.kv_bucket"),
    kv_ttl: KvTtlOpt = 3600.0,
    nats_creds: NatsCredsOpt = None,
) -> None:
    """Continue a stopped run from its event log (completed steps and iterations are kept)."""
    raise typer.Exit(
        _execute(
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


def validate(
    files: Annotated[list[Path], typer.Argument(help="Playbook files to check.")],
    as_json: JsonOpt = False,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict",
            help="Templates pasted into SQL text are errors, not warnings (exit code 2).",
        ),
    ] = False,
) -> None:
    """Check playbooks without running anything. Exit code 2 when any is invalid (with
    --strict: or pastes a template into SQL text)."""
    from flowtide.errors import PlaybookError, PlaybookErrors
    from flowtide.playbook.loader import load_playbook, warning_text
    from flowtide.playbook.sqllint import lint_playbook

    report = []
    bad = False
    for file in files:
        try:
            playbook = load_playbook(file, references=())
        except PlaybookError as exc:
            bad = True
            errors = exc.errors if isinstance(exc, PlaybookErrors) else [exc]
            report.append(
                {"file": str(file), "valid": False, "errors": [e.to_dict() for e in errors]}
            )
            if not as_json:
                for e in errors:
                    err(e.render())
            continue
        warnings = lint_playbook(playbook, str(file))
        if not as_json:
            for key_warning in playbook.warnings:
                err(warning_text(key_warning))
            for warning in warnings:
                err(warning.render("error" if strict else "warning"))
        found = [w.to_dict() for w in warnings]
        keys_found = [w.to_dict() for w in playbook.warnings]
        if strict and warnings:
            bad = True
            report.append({"file": str(file), "valid": False, "errors": found})
            if not as_json:
                err(f"{file}: invalid with --strict ({len(warnings)} SQL template(s) pasted)")
            continue
        report.append(
            {
                "file": str(file),
                "valid": True,
                "name": playbook.name,
                "steps": len(playbook.steps),
                "warnings": keys_found + found,
            }
        )
        if not as_json:
            typer.echo(f"{file}: ok ({len(playbook.steps)} steps, entry '{playbook.entry}')")
    if as_json:
        print_json(report)
    raise typer.Exit(EXIT_INVALID if bad else EXIT_OK)


def execute(
    target: TargetArg,
    server: ServerUrlOpt,
    set_: SetOpt = None,
    payload: PayloadOpt = None,
    pool: Annotated[
        str | None, typer.Option("--pool", help="Worker pool to run on (default: default).")
    ] = None,
    as_json: JsonOpt = False,
    allow_extra: AllowExtraOpt = False,
) -> None:
    """Start a playbook on a server and return at once with its execution id (follow it
    with `flowtide status ID` / `flowtide events ID --follow`)."""
    from flowtide.errors import PlaybookError

    try:
        overrides = _overrides(set_, payload)
        text, catalog_id = _remote_target(target)
    except typer.BadParameter as exc:
        err(f"error: {exc}")
        raise typer.Exit(EXIT_INVALID) from None
    with server_client(server) as api:
        try:
            if not allow_extra:
                refuse_undeclared_remote(api, text, target, overrides)
        except PlaybookError as exc:
            err(f"error: {exc}")
            raise typer.Exit(EXIT_INVALID) from None
        eid = remote_or_exit(
            lambda: api.execute(playbook=text, catalog_id=catalog_id, payload=overrides, pool=pool)
        )
    if as_json:
        print_json({"execution_id": str(eid), "status": "running"})
    else:
        typer.echo(eid)


def cancel(
    execution_id: ExecutionIdArg,
    server: ServerUrlOpt,
    reason: Annotated[str, typer.Option("--reason", help="Recorded in the event log.")] = (
        "cancelled from the command line"
    ),
    as_json: JsonOpt = False,
) -> None:
    """Cancel an execution on a server: no new commands are issued, running workers see
    the cancellation and stop. (An embedded run stops with Ctrl-C.)"""

    with server_client(server) as api:
        doc = remote_or_exit(lambda: api.cancel(execution_id, reason))
    if as_json:
        print_json(doc)
    else:
        typer.echo(f"execution {execution_id}: {doc.get('status', 'cancel requested')}")
