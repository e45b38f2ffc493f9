"""`flowtide schedule ...`: schedules on the local store, or on a server with --server.

Schedules fire while a long-running process runs: `flowtide scheduler` or `flowtide ui`
on a local store, every server of a cluster.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from flowtide.cli.backends import open_store, remote_or_exit, server_client
from flowtide.cli.options import (
    EXIT_FAILED,
    EXIT_INVALID,
    DbOpt,
    HomeOpt,
    JsonOpt,
    ServerOpt,
    err,
    home_dir,
    print_json,
)
from flowtide.cli.run import PayloadOpt, SetOpt, _overrides

if TYPE_CHECKING:
    from flowtide.store.base import Store

schedule_app = typer.Typer(
    help="Schedules: runs that start themselves, by cron or at an interval. They fire while "
    "`flowtide scheduler` or `flowtide ui` runs on this store (every server, on a cluster). "
    "Each slot starts one run; a slot missed while nothing ran fires afterwards if it is "
    "inside the catchup window.",
    no_args_is_help=True,
)

NameArg = Annotated[str, typer.Argument(help="The schedule's name.", show_default=False)]


def _fail(message: str, code: int = EXIT_INVALID) -> typer.Exit:
    err(f"error: {message}")
    return typer.Exit(code)


def _local(home: Path | None, db: str | None) -> Store:
    return open_store(home, db)


def _when(at: float | None, zone: str | None = None) -> str:
    if at is None:
        return "-"
    from zoneinfo import ZoneInfo

    # In the zone named, else this machine's, always with the zone's abbreviation.
    if zone:
        stamp = datetime.datetime.fromtimestamp(at, ZoneInfo(zone))
    else:
        stamp = datetime.datetime.fromtimestamp(at).astimezone()
    return stamp.strftime("%Y-%m-%d %H:%M:%S %Z").strip()


@schedule_app.command("add")
def schedule_add(
    name: NameArg,
    playbook: Annotated[
        str,
        typer.Argument(
            help="Catalog path of the playbook (a file too, on the local store).",
            show_default=False,
        ),
    ],
    cron: Annotated[
        str | None,
        typer.Option(
            "--cron",
            help="Cron expression: 5 fields (minute hour day month weekday), or 6 with a"
            " seconds field first, or @hourly, @daily, @weekly, @monthly, @yearly.",
            show_default=False,
        ),
    ] = None,
    timezone: Annotated[
        str | None,
        typer.Option(
            "--timezone",
            help="IANA zone the cron times are in (default UTC). A time that DST skips fires"
            " at the next valid instant; a repeated one fires once.",
            show_default=False,
        ),
    ] = None,
    every: Annotated[
        str | None,
        typer.Option("--every", help="Fire at this interval: 2s, 15m, 1h, 1d.", show_default=False),
    ] = None,
    offset: Annotated[
        str | None,
        typer.Option(
            "--offset", help="Shift --every's slots by this (default 0).", show_default=False
        ),
    ] = None,
    set_: SetOpt = None,
    payload: PayloadOpt = None,
    version: Annotated[
        int | None, typer.Option("--version", min=1, help="Catalog version (default: the latest).")
    ] = None,
    overlap: Annotated[
        str,
        typer.Option(
            "--overlap",
            help="When a slot comes while the last run still goes: skip it, buffer_one (run"
            " one after it), buffer_all, cancel_other (cancel it, then run), or allow.",
        ),
    ] = "skip",
    catchup: Annotated[
        str,
        typer.Option(
            "--catchup",
            help="After a downtime, run the missed slots of this last window (oldest first);"
            " 0 runs none.",
        ),
    ] = "1h",
    jitter: Annotated[
        str | None,
        typer.Option(
            "--jitter", help="Delay each run by up to this (spreads load).", show_default=False
        ),
    ] = None,
    paused: Annotated[bool, typer.Option("--paused", help="Add it paused.")] = False,
    start: Annotated[
        str | None,
        typer.Option(
            "--start", help="No slot before this (ISO 8601 with a zone).", show_default=False
        ),
    ] = None,
    end: Annotated[
        str | None,
        typer.Option(
            "--end", help="No slot after this (ISO 8601 with a zone).", show_default=False
        ),
    ] = None,
    description: Annotated[
        str | None, typer.Option("--description", help="One line for lists.", show_default=False)
    ] = None,
    replace: Annotated[
        bool, typer.Option("--replace", help="Replace a schedule of this name (keeps its history).")
    ] = False,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
    server: ServerOpt = None,
) -> None:
    """Add a schedule: PLAYBOOK runs at each slot of --cron or --every, with the workload
    of --set/--payload, where `{{ schedule.time }}`, `{{ schedule.name }}` and
    `{{ schedule.slot }}` are the slot's.

    Example: flowtide schedule add nightly reports/nightly --cron "0 2 * * *"
    --timezone Europe/Berlin --set day="{{ schedule.time[:10] }}"
    """
    from flowtide.errors import TriggerError
    from flowtide.triggers.schedules import schedule_from_fields

    workload = _overrides(set_, payload) or None
    fields: dict[str, Any] = {
        "playbook": playbook,
        "version": version,
        "cron": cron,
        "timezone": timezone,
        "every": every,
        "offset": offset,
        "workload": workload,
        "overlap": overlap,
        "catchup": catchup,
        "jitter": jitter,
        "paused": paused or None,
        "start": start,
        "end": end,
        "description": description,
    }
    if server:
        with server_client(server) as api:
            doc = remote_or_exit(
                lambda: api.api(
                    "POST",
                    "/api/schedules",
                    json={"name": name, "replace": replace}
                    | {k: v for k, v in fields.items() if v is not None},
                )
            )
        _added(doc, as_json)
        return
    from flowtide.documents.schedules import schedule_document
    from flowtide.ids import default_generator
    from flowtide.triggers.schedules import define_schedule
    from flowtide.triggers.spec import spec_from_json

    try:
        spec = schedule_from_fields(name, fields)
    except TriggerError as exc:
        raise _fail(str(exc)) from None
    store = _local(home, db)
    try:
        row = define_schedule(
            store,
            spec,
            new_id=default_generator().next_id,
            now=time.time(),
            local=True,
            replace_existing=replace,
        )
    except TriggerError as exc:
        raise _fail(str(exc)) from None
    finally:
        store.close()
    doc = schedule_document(row, spec_from_json(row.spec), now=time.time(), firings=[], running=[])
    _added(dict(doc), as_json)
    if not as_json:
        err(
            "it fires while `flowtide scheduler` (or `flowtide ui`) runs on this store"
            + (f" (--home {home})" if home else "")
        )


def _added(doc: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(doc)
        return
    first = doc["next"][0] if doc["next"] else None
    zone = doc.get("timezone")
    state = "paused" if doc["paused"] else "next " + _when(first, zone)
    if not doc["paused"] and first is not None and zone and _when(first, zone) != _when(first):
        state += f", {_when(first)} here"
    typer.echo(f"schedule {doc['name']}: {doc['when']} -> {doc['playbook']} ({state})")


def _items(home: Path | None, db: str | None, server: str | None) -> list[dict[str, Any]]:
    if server:
        with server_client(server) as api:
            return list(remote_or_exit(lambda: api.api("GET", "/api/schedules"))["items"])
    from flowtide.documents.schedules import schedule_item
    from flowtide.triggers.spec import spec_from_json

    store = _local(home, db)
    try:
        rows = store.list_triggers("schedule")
    finally:
        store.close()
    now = time.time()
    return [dict(schedule_item(r, spec_from_json(r.spec), now=now)) for r in rows]


@schedule_app.command("list")
def schedule_list(
    as_json: JsonOpt = False, home: HomeOpt = None, db: DbOpt = None, server: ServerOpt = None
) -> None:
    """Every schedule with its next fire time (in this machine's zone)."""
    items = _items(home, db, server)
    if as_json:
        print_json(items)
        return
    if not items:
        typer.echo("no schedules (add one: flowtide schedule add NAME PLAYBOOK --every 15m)")
        return
    width = max(len(i["name"]) for i in items)
    for i in items:
        state = "paused" if i["paused"] else _when(i["next"][0] if i["next"] else None)
        typer.echo(
            f"{i['name']:<{width}}  {state:<24}  {i['when']}  -> {i['playbook']}  [{i['overlap']}]"
        )


@schedule_app.command("show")
def schedule_show(
    name: NameArg,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
    server: ServerOpt = None,
) -> None:
    """A schedule: its definition, next five fire times (in its zone and this machine's),
    runs still going and latest firings."""
    if server:
        with server_client(server) as api:
            doc = remote_or_exit(lambda: api.api("GET", f"/api/schedules/{name}"))
    else:
        from flowtide.documents.schedules import schedule_document
        from flowtide.errors import NotFoundError
        from flowtide.triggers.spec import spec_from_json

        store = _local(home, db)
        try:
            row = store.get_trigger("schedule", name)
            doc = dict(
                schedule_document(
                    row,
                    spec_from_json(row.spec),
                    now=time.time(),
                    firings=store.firings(row.trigger_id, limit=20),
                    running=store.trigger_running(row.trigger_id),
                )
            )
        except NotFoundError as exc:
            raise _fail(str(exc)) from None
        finally:
            store.close()
    if as_json:
        print_json(doc)
        return
    _show(doc)


def _show(doc: dict[str, Any]) -> None:
    zone = doc["timezone"]
    echo = typer.echo
    echo(f"schedule {doc['name']}" + (f": {doc['description']}" if doc["description"] else ""))
    echo(
        f"  playbook  {doc['playbook']}" + (f" version {doc['version']}" if doc["version"] else "")
    )
    echo(f"  when      {doc['when']}")
    from flowtide.triggers.when import format_duration

    catchup = format_duration(doc["catchup"]) if doc["catchup"] else "none"
    jitter = f", jitter up to {format_duration(doc['jitter'])}" if doc["jitter"] else ""
    echo(f"  policy    overlap {doc['overlap']}, catchup {catchup}{jitter}")
    if doc["start"] or doc["end"]:
        echo(f"  window    {_when(doc['start'], zone)} .. {_when(doc['end'], zone)}")
    echo(f"  state     {'paused' if doc['paused'] else 'active'}")
    if doc["workload"]:
        import json

        echo(f"  workload  {json.dumps(doc['workload'])}")
    if doc["next"]:
        echo("  next")
        for at in doc["next"]:
            echo(f"    {_when(at, zone)}    ({_when(at)} here)")
    if doc["running"]:
        echo(f"  running   {', '.join(doc['running'])}")
    if doc["firings"]:
        echo("  latest firings")
        for f in doc["firings"]:
            what = f"execution {f['execution_id']}" if f["execution_id"] else f["status"]
            why = f" ({f['reason']})" if f["reason"] else ""
            echo(f"    {f['key']}  {f['status']:<8} {what}{why}")


def _toggle(name: str, paused: bool, home: Path | None, db: str | None, server: str | None) -> None:
    verb = "pause" if paused else "resume"
    if server:
        with server_client(server) as api:
            remote_or_exit(lambda: api.api("POST", f"/api/schedules/{name}/{verb}"))
    else:
        from flowtide.errors import NotFoundError

        store = _local(home, db)
        try:
            store.set_trigger_paused("schedule", name, paused, now=time.time())
        except NotFoundError as exc:
            raise _fail(str(exc)) from None
        finally:
            store.close()
    typer.echo(f"schedule {name}: {'paused' if paused else 'resumed (slots from now on fire)'}")


@schedule_app.command("pause")
def schedule_pause(
    name: NameArg, home: HomeOpt = None, db: DbOpt = None, server: ServerOpt = None
) -> None:
    """Pause a schedule: no slot fires until it is resumed."""
    _toggle(name, True, home, db, server)


@schedule_app.command("resume")
def schedule_resume(
    name: NameArg, home: HomeOpt = None, db: DbOpt = None, server: ServerOpt = None
) -> None:
    """Resume a schedule: slots after now fire (those while it was paused do not; run
    them with `flowtide schedule backfill`)."""
    _toggle(name, False, home, db, server)


@schedule_app.command("delete")
def schedule_delete(
    name: NameArg, home: HomeOpt = None, db: DbOpt = None, server: ServerOpt = None
) -> None:
    """Delete a schedule (the runs it started stay, and still say it started them)."""
    if server:
        with server_client(server) as api:
            remote_or_exit(lambda: api.api("DELETE", f"/api/schedules/{name}"))
    else:
        from flowtide.errors import NotFoundError

        store = _local(home, db)
        try:
            store.delete_trigger("schedule", name)
        except NotFoundError as exc:
            raise _fail(str(exc)) from None
        finally:
            store.close()
    typer.echo(f"schedule {name}: deleted")


async def _with_local_firer(store: Store, home: Path, work: Any) -> Any:
    """Run `work(firer, reads)` on an embedded runtime over the local store."""
    from flowtide.runlock import run_locks_for
    from flowtide.ui.fold import FoldCache
    from flowtide.ui.reads import LocalReads
    from flowtide.web.schedules import ReadsFirer

    reads = LocalReads(store, FoldCache(store), home.absolute(), run_locks_for(store, home))
    async with reads.open():
        return await work(ReadsFirer(reads), reads)


@schedule_app.command("trigger")
def schedule_trigger(
    name: NameArg,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
    server: ServerOpt = None,
) -> None:
    """One run of the schedule now, paused or not. On the local store it runs here, like
    `flowtide run` (exit 1 if it fails); with --server the server runs it."""
    if server:
        with server_client(server) as api:
            doc = remote_or_exit(lambda: api.api("POST", f"/api/schedules/{name}/trigger"))
        if as_json:
            print_json(doc)
        else:
            typer.echo(f"schedule {name}: started execution {doc['execution_id']}")
        return
    from flowtide.documents.execution import shown
    from flowtide.errors import FlowtideError, NotFoundError
    from flowtide.ids import default_generator
    from flowtide.triggers.scheduler import fire_now

    store = _local(home, db)
    try:
        row = store.get_trigger("schedule", name)
    except NotFoundError as exc:
        store.close()
        raise _fail(str(exc)) from None

    async def work(firer: Any, reads: Any) -> Any:
        key = f"manual-{default_generator().next_id()}"
        execution_id = await fire_now(firer, row, now=time.time(), key=key)
        err(f"schedule {name}: execution {execution_id} started")
        return await reads.runtime.wait(execution_id)

    try:
        state = asyncio.run(_with_local_firer(store, home_dir(home), work))
    except FlowtideError as exc:
        raise _fail(str(exc)) from None
    finally:
        store.close()
    doc = shown(state)
    if as_json:
        print_json(doc)
    else:
        typer.echo(f"execution {doc['execution_id']} {doc['status']}")
    if doc["status"] != "completed":
        raise typer.Exit(EXIT_FAILED)


@schedule_app.command("backfill")
def schedule_backfill(
    name: NameArg,
    start: Annotated[
        str,
        typer.Option("--from", help="First slot time (ISO 8601 with a zone).", show_default=False),
    ],
    end: Annotated[
        str, typer.Option("--to", help="Last slot time, inclusive.", show_default=False)
    ],
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
    server: ServerOpt = None,
) -> None:
    """Run every slot of the schedule from --from to --to by its overlap policy (catchup
    aside; at most 1,000 slots). Slots that started a run before are left alone, so a
    backfill repeated starts nothing twice. On the local store the runs go here, and
    the command waits for them."""
    if server:
        with server_client(server) as api:
            doc = remote_or_exit(
                lambda: api.api(
                    "POST", f"/api/schedules/{name}/backfill", json={"start": start, "end": end}
                )
            )
        _backfilled(name, doc, as_json)
        return
    from flowtide.errors import FlowtideError, NotFoundError
    from flowtide.triggers.scheduler import run_backfill
    from flowtide.triggers.spec import parse_time

    store = _local(home, db)
    try:
        row = store.get_trigger("schedule", name)
        first, last = parse_time(start, "from"), parse_time(end, "to")
    except (NotFoundError, FlowtideError) as exc:
        store.close()
        raise _fail(str(exc)) from None
    if last < first:
        store.close()
        raise _fail("--to is before --from")

    async def work(firer: Any, reads: Any) -> Any:
        def progress(done: int, total: int) -> None:
            if total > 20 and (done % 50 == 0 or done == total):
                err(f"backfill {name}: {done}/{total} slots")

        result = await run_backfill(
            firer, row, start=first, end=last, now=time.time(), on_progress=progress
        )
        for execution_id in result.started.values():
            await reads.runtime.wait(execution_id)
        return result

    try:
        result = asyncio.run(_with_local_firer(store, home_dir(home), work))
    except FlowtideError as exc:
        raise _fail(str(exc)) from None
    finally:
        store.close()
    doc = {
        "started": {k: str(v) for k, v in result.started.items()},
        "buffered": result.buffered,
        "skipped": result.skipped,
        "already": result.already,
    }
    _backfilled(name, doc, as_json)


def _backfilled(name: str, doc: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(doc)
        return
    typer.echo(
        f"backfill {name}: {len(doc['started'])} started, {len(doc['buffered'])} buffered, "
        f"{len(doc['skipped'])} skipped, {len(doc['already'])} had run before"
    )
