"""`flowtide status|events|list`: executions as their event logs tell them, from the local
store or (with --server) a flowtide server."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from flowtide.cli.backends import (
    execution_or_exit,
    folded,
    open_store,
    remote_or_exit,
    server_client,
)
from flowtide.cli.options import (
    EXIT_INTERRUPTED,
    EXIT_INVALID,
    DbOpt,
    ExecutionIdArg,
    HomeOpt,
    JsonOpt,
    ServerOpt,
    err,
    home_dir,
    print_json,
)

if TYPE_CHECKING:
    from pathlib import Path

    from flowtide.engine.events import Event
    from flowtide.store.base import Store


def status(
    execution_id: ExecutionIdArg,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
    server: ServerOpt = None,
) -> None:
    """Show an execution's status, steps and result (rebuilt from its event log)."""
    if server:
        with server_client(server) as api:
            doc = remote_or_exit(lambda: api.execution(execution_id))
        label = doc.pop("playbook", None)
    else:
        from flowtide.documents.execution import as_interrupted, shown

        store = open_store(home, db)
        row, state = folded(store, execution_id)
        shown_doc = shown(state)
        if not state.terminal:
            shown_doc["status"] = "running" if row.status == "running" else row.status
            if _stopped(store, home, [execution_id]):
                shown_doc = as_interrupted(shown_doc)
        doc = dict(shown_doc)
        store.close()
        label = row.playbook_path or row.playbook_file
    if as_json:
        print_json(doc)
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.pretty import Pretty
    from rich.table import Table

    from flowtide.cli.summary import print_error

    console = Console()
    console.print(
        f"execution [bold]{doc['execution_id']}[/] {doc['status']}  playbook {escape(str(label))}"
    )
    table = Table(box=None)
    with_items = any(step.get("items") for step in doc["steps"].values())
    columns = ("step", "status", "runs", "attempts", *(("items",) if with_items else ()), "error")
    for col in columns:
        table.add_column(col)
    for name, step in doc["steps"].items():
        error = (step["error"] or {}).get("message", "") if step["error"] else ""
        items = (_items(step.get("items"), step["status"]),) if with_items else ()
        table.add_row(
            escape(name),
            step["status"],
            str(step["runs"]),
            _attempts(step),
            *items,
            escape(str(error)[:80]),
        )
    console.print(table)
    if doc["status"] == "interrupted":
        console.print(
            "its process went away before it ended:"
            f" `flowtide resume {doc['execution_id']}` carries it on"
        )
        for name in _stopped_spark_loops(doc):
            console.print(
                f"spark loop {escape(name)}: its job stopped before its end, a resume runs all"
                " its items again"
            )
    if doc["error"]:
        print_error(console, doc["error"])
    if doc.get("result") is not None:
        console.print("result:")
        console.print(Pretty(doc["result"], max_length=20, max_string=400))


def events(
    execution_id: ExecutionIdArg,
    as_json: JsonOpt = False,
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help="Keep printing new events until the run ends."),
    ] = False,
    home: HomeOpt = None,
    db: DbOpt = None,
    server: ServerOpt = None,
) -> None:
    """Print an execution's event log in order."""
    from flowtide.engine.events import Event

    if server:
        with server_client(server) as api:
            if follow and not as_json:
                remote_or_exit(lambda: api.execution(execution_id))
                try:
                    for page in remote_or_exit(lambda: api.follow(execution_id)):
                        for doc in page:
                            _print_event(Event.from_dict(doc))
                except KeyboardInterrupt:
                    raise typer.Exit(EXIT_INTERRUPTED) from None
                return
            docs = remote_or_exit(lambda: list(api.all_events(execution_id)))
        if as_json:
            print_json(docs)
            return
        log = [Event.from_dict(doc) for doc in docs]
    else:
        from flowtide.documents.events import event_document, log_secrets

        store = open_store(home, db)
        execution_or_exit(store, execution_id)
        if follow and not as_json:
            try:
                _follow_local(store, home, execution_id)
            except KeyboardInterrupt:
                raise typer.Exit(EXIT_INTERRUPTED) from None
            finally:
                store.close()
            return
        log = store.events(execution_id)
        store.close()
        secrets = log_secrets(log)
        docs = [event_document(e, secrets) for e in log]
        if as_json:
            print_json(docs)
            return
        log = [Event.from_dict(dict(doc)) for doc in docs]
    for e in log:
        _print_event(e)


def _follow_local(store: Store, home: Path | None, execution_id: int) -> None:
    """Print an embedded run's events as the process that runs it writes them, until it
    ends or no process runs it any more (interrupted)."""
    from flowtide.documents.events import event_document, grown_secrets
    from flowtide.engine.events import Event
    from flowtide.store.base import ENDED_STATUSES

    secrets: frozenset[str] = frozenset()
    last: int | None = None
    while True:
        # Whether it has ended is read before its events, so the last ones are printed.
        status = store.get_execution(execution_id).status
        ended = status in ENDED_STATUSES or (
            status == "running" and bool(_stopped(store, home, [execution_id]))
        )
        new = store.events(execution_id, after_event_id=last)
        secrets = grown_secrets(secrets, new)
        for e in new:
            _print_event(Event.from_dict(dict(event_document(e, secrets))))
        if new:
            last = new[-1].event_id
            sys.stdout.flush()
        if ended:
            return
        time.sleep(_FOLLOW_POLL_SECONDS)


#: How often `events --follow` looks for new events of an embedded run.
_FOLLOW_POLL_SECONDS = 0.2


def _print_event(e: Event) -> None:
    import datetime

    from flowtide.engine import events as ev

    ts = datetime.datetime.fromtimestamp(e.time).strftime("%H:%M:%S.%f")[:-3]
    extra = ""
    payload = ev.payload_fields(e)
    if e.error:
        extra = f" error={e.error.get('kind')}: {str(e.error.get('message'))[:100]}"
    elif e.type in (ev.LOOP_ITEM, ev.COMMAND_ISSUED) and "loop_index" in payload:
        extra = f" index={payload.get('loop_index')}"
        count = payload.get("loop_count")
        if isinstance(count, int) and count > 1 and isinstance(payload["loop_index"], int):
            extra += f"..{payload['loop_index'] + count - 1}"  # a chunk of iterations
    elif e.type == ev.LOOP_ITEM:
        extra = f" index={ev.payload_of(e, ev.LOOP_ITEM).get('index')}"
    elif e.type == ev.COMMAND_PROGRESS:
        extra = f" items={_items(dict(ev.payload_of(e, ev.COMMAND_PROGRESS)))}"
    elif e.type in (ev.NOTIFICATION_SENT, ev.NOTIFICATION_FAILED):
        note = ev.payload_of(e, ev.NOTIFICATION_SENT)
        extra = f" {note.get('on')} -> {note.get('target')} {note.get('to')} #{note.get('attempt')}"
        if "status_code" in note:
            extra += f" status={note['status_code']}"
        if "error" in note:
            extra += f" error={str(note['error'])[:100]}"
    elif e.worker_id:
        extra = f" worker={e.worker_id}"
    typer.echo(f"{ts} {e.type:<20} {e.step or '':<24} {e.status or '':<10}{extra}")


def list_executions(
    limit: Annotated[int, typer.Option(help="How many, newest first.")] = 20,
    status_filter: Annotated[str | None, typer.Option("--status", help="Only this status.")] = None,
    trigger: Annotated[
        str | None,
        typer.Option(
            "--trigger",
            help="Only runs a trigger started: schedule, hook or subscription, or KIND:NAME "
            "for one (schedule:nightly).",
        ),
    ] = None,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
    server: ServerOpt = None,
) -> None:
    """List recent executions."""
    import datetime

    if server:
        with server_client(server) as api:
            items = remote_or_exit(
                lambda: api.list_executions(status=status_filter, limit=limit, trigger=trigger)
            )
        if as_json:
            print_json(items)
            return
        for item in items:
            ts = datetime.datetime.fromtimestamp(item["created"]).strftime("%Y-%m-%d %H:%M:%S")
            by = _started_by(item.get("trigger"))
            typer.echo(f"{item['execution_id']}  {ts}  {item['status']:<11} {item['playbook']}{by}")
        return
    from flowtide.documents.listing import execution_item

    store = open_store(home, db)
    if trigger is not None:
        _check_trigger_filter(trigger)
    # Rows say running; which of them stopped (interrupted) is known when read.
    by_row = "running" if status_filter in ("running", "interrupted") else status_filter
    rows = store.list_executions(status=by_row, limit=limit, trigger=trigger)
    ended = ("completed", "failed", "cancelled")
    stopped = _stopped(store, home, [r.execution_id for r in rows if r.status not in ended])
    store.close()
    items = [execution_item(r, stopped=stopped.get(r.execution_id)) for r in rows]
    if by_row != status_filter or status_filter == "running":
        items = [item for item in items if item["status"] == status_filter]
    if as_json:
        print_json(items)
        return
    for item in items:
        ts = datetime.datetime.fromtimestamp(item["created"]).strftime("%Y-%m-%d %H:%M:%S")
        by = _started_by(item["trigger"])
        typer.echo(f"{item['execution_id']}  {ts}  {item['status']:<11} {item['playbook']}{by}")


def _stopped(store: Store, home: Path | None, running: list[int]) -> dict[int, float]:
    """Of the `running` executions of an embedded store, those no process runs any more
    (shown `interrupted`), by their run locks."""
    from flowtide.runlock import run_locks_for, stopped_runs

    if not running:
        return {}
    return stopped_runs(store, run_locks_for(store, home_dir(home)), running)


def _stopped_spark_loops(doc: dict[str, Any]) -> list[str]:
    """The steps of `doc` that are spark loops whose job stopped before its end (their
    counts were progress: nothing of the job is kept)."""
    return [
        name
        for name, step in doc["steps"].items()
        if step.get("items")
        and step["status"] not in ("running", "pending")
        and "failed" not in step["items"]
    ]


def _attempts(step: dict[str, Any]) -> str:
    """`3 (2 retries)`: a step's task calls and how many were retries."""
    attempts, retries = step.get("attempts", 0), step.get("retries", 0)
    return f"{attempts} ({retries} retries)" if retries else str(attempts)


def _items(items: dict[str, Any] | None, status: str = "running") -> str:
    """`40,000/100,000 (12,300/s)`: a spark loop's items done of its total, and the rate;
    `, 3 failed` once it ended with failures; `when it stopped` (no rate) when its job
    stopped before its end (interrupted, cancelled: a resume runs it again)."""
    if not items:
        return ""
    text = f"{int(items.get('done', 0)):,}/{int(items.get('total', 0)):,}"
    rate = float(items.get("per_second") or 0)
    if status not in ("running", "pending") and "failed" not in items:
        return text + " when it stopped"
    if rate:
        text += f" ({rate:,.0f}/s)"
    if items.get("failed"):
        text += f", {int(items['failed']):,} failed"
    return text


def _started_by(trigger: dict[str, str] | None) -> str:
    """`  (schedule nightly 2026-11-28T02:00:00Z)`: what started a listed run."""
    if not trigger:
        return ""
    key = next((v for k, v in trigger.items() if k not in ("kind", "name")), "")
    return f"  ({trigger['kind']} {trigger['name']} {key})"


def _check_trigger_filter(trigger: str) -> None:
    kind = trigger.partition(":")[0]
    if kind not in ("schedule", "hook", "subscription"):
        err(f"--trigger: {kind!r} is not a trigger kind (schedule, hook or subscription)")
        raise typer.Exit(EXIT_INVALID)
