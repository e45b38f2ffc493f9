"""`flowtide subscription ...`: subscriptions on the local store, or on a server with
--server; and `kind: Subscription` documents for `flowtide catalog register`.

A subscription's messages start runs while a long-running process listens: `flowtide
scheduler` or `flowtide ui` on a local store, the servers of the shard that owns it on a
cluster.
"""

from __future__ import annotations

import json
import re
import time
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer

from flowtide.cli.backends import open_store, remote_or_exit, server_client
from flowtide.cli.options import EXIT_INVALID, DbOpt, HomeOpt, JsonOpt, ServerOpt, err, print_json
from flowtide.cli.run import PayloadOpt, SetOpt, _overrides

subscription_app = typer.Typer(
    help="Subscriptions: each message of a NATS subject or JetStream stream (or a plugin's "
    "source) starts one run. They listen while `flowtide scheduler` or `flowtide ui` runs "
    "on this store (the servers of the shard that owns them, on a cluster).",
    no_args_is_help=True,
)

NameArg = Annotated[str, typer.Argument(help="The subscription's name.", show_default=False)]
KIND = "subscription"


def _fail(message: str, code: int = EXIT_INVALID) -> typer.Exit:
    err(f"error: {message}")
    return typer.Exit(code)


@subscription_app.command("add")
def subscription_add(
    name: NameArg,
    playbook: Annotated[
        str,
        typer.Argument(
            help="Catalog path of the playbook (a file too, on the local store).",
            show_default=False,
        ),
    ],
    source: Annotated[
        str, typer.Option("--source", help="nats, or a plugin's source (flowtide.sources).")
    ] = "nats",
    auth: Annotated[
        str | None,
        typer.Option(
            "--auth",
            help="Credential alias whose body has the server's url and user/password, token"
            " or creds.",
            show_default=False,
        ),
    ] = None,
    url: Annotated[
        str | None,
        typer.Option("--url", help="Server URL (overrides the credential's).", show_default=False),
    ] = None,
    subject: Annotated[
        str | None,
        typer.Option(
            "--subject",
            help="Core NATS subject (a queue group shares it), or a JetStream filter.",
            show_default=False,
        ),
    ] = None,
    stream: Annotated[
        str | None, typer.Option("--stream", help="JetStream stream.", show_default=False)
    ] = None,
    consumer: Annotated[
        str | None,
        typer.Option(
            "--consumer", help="Durable consumer (default flowtide-sub-NAME).", show_default=False
        ),
    ] = None,
    set_: SetOpt = None,
    payload: PayloadOpt = None,
    batch: Annotated[
        int | None,
        typer.Option("--batch", help="One run per this many messages.", show_default=False),
    ] = None,
    max_wait: Annotated[
        str | None,
        typer.Option(
            "--max-wait", help="A batch starts after this even if short (1s).", show_default=False
        ),
    ] = None,
    rate: Annotated[
        str | None,
        typer.Option("--rate", help="At most this many messages: 100/s, 30/m.", show_default=False),
    ] = None,
    ack_wait: Annotated[
        str | None,
        typer.Option("--ack-wait", help="JetStream redelivery after (30s).", show_default=False),
    ] = None,
    max_deliver: Annotated[
        int | None,
        typer.Option(
            "--max-deliver",
            min=1,
            help="Deliveries of a message whose run cannot start (5).",
            show_default=False,
        ),
    ] = None,
    config: Annotated[
        list[str] | None,
        typer.Option(
            "--config",
            help="A plugin source's field: KEY=VALUE (repeatable).",
            show_default=False,
        ),
    ] = None,
    version: Annotated[
        int | None, typer.Option("--version", min=1, help="Catalog version (default: the latest).")
    ] = None,
    paused: Annotated[bool, typer.Option("--paused", help="Add it paused.")] = False,
    description: Annotated[
        str | None, typer.Option("--description", help="One line for lists.", show_default=False)
    ] = None,
    replace: Annotated[
        bool, typer.Option("--replace", help="Replace a subscription of this name.")
    ] = False,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
    server: ServerOpt = None,
) -> None:
    """Add a subscription: each message starts PLAYBOOK with the workload of
    --set/--payload, where `{{ message.data }}` (JSON-decoded), `{{ message.subject }}`,
    `{{ message.headers }}`, `{{ message.seq }}` are the message's (without a workload:
    `message` itself; with --batch: `messages`).

    Example: flowtide subscription add orders shop/order --auth nats_events
    --stream ORDERS --set order="{{ message.data }}"
    """
    from flowtide.errors import TriggerError
    from flowtide.triggers.subscriptions import subscription_from_fields

    workload = _overrides(set_, payload) or None
    batch_fields = None
    if batch is not None:
        batch_fields = {"size": batch} | ({"max_wait": max_wait} if max_wait else {})
    elif max_wait is not None:
        raise _fail("--max-wait goes with --batch")
    source_config: dict[str, str] = {}
    for item in config or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise _fail(f"--config {item!r}: write KEY=VALUE")
        source_config[key] = value
    fields: dict[str, Any] = {
        "playbook": playbook,
        "version": version,
        "source": source,
        "auth": auth,
        "url": url,
        "subject": subject,
        "stream": stream,
        "consumer": consumer,
        "workload": workload,
        "batch": batch_fields,
        "rate": rate,
        "ack_wait": ack_wait,
        "max_deliver": max_deliver,
        "config": source_config or None,
        "paused": paused or None,
        "description": description,
    }
    if server:
        with server_client(server) as api:
            doc = remote_or_exit(
                lambda: api.api(
                    "POST",
                    "/api/subscriptions",
                    json={"name": name, "replace": replace}
                    | {k: v for k, v in fields.items() if v is not None},
                )
            )
        _added(doc, as_json)
        return
    from flowtide.documents.subscriptions import subscription_document
    from flowtide.ids import default_generator
    from flowtide.triggers.subscription import subscription_from_json
    from flowtide.triggers.subscriptions import define_subscription

    try:
        spec = subscription_from_fields(name, fields)
    except TriggerError as exc:
        raise _fail(str(exc)) from None
    store = open_store(home, db)
    try:
        row = define_subscription(
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
    doc = subscription_document(row, subscription_from_json(row.spec), firings=[])
    _added(dict(doc), as_json)
    if not as_json:
        err(
            "it listens while `flowtide scheduler` (or `flowtide ui`) runs on this store"
            + (f" (--home {home})" if home else "")
        )


def _added(doc: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(doc)
        return
    state = " (paused)" if doc["paused"] else ""
    typer.echo(f"subscription {doc['name']}: {doc['what']} -> {doc['playbook']}{state}")


@subscription_app.command("list")
def subscription_list(
    as_json: JsonOpt = False, home: HomeOpt = None, db: DbOpt = None, server: ServerOpt = None
) -> None:
    """Every subscription: its source and playbook."""
    if server:
        with server_client(server) as api:
            items = list(remote_or_exit(lambda: api.api("GET", "/api/subscriptions"))["items"])
    else:
        from flowtide.documents.subscriptions import subscription_item
        from flowtide.triggers.subscription import subscription_from_json

        store = open_store(home, db)
        try:
            rows = store.list_triggers(KIND)
        finally:
            store.close()
        items = [dict(subscription_item(r, subscription_from_json(r.spec))) for r in rows]
    if as_json:
        print_json(items)
        return
    if not items:
        typer.echo("no subscriptions (add one: flowtide subscription add NAME PLAYBOOK ...)")
        return
    width = max(len(i["name"]) for i in items)
    for i in items:
        state = "paused" if i["paused"] else "active"
        typer.echo(f"{i['name']:<{width}}  {state:<6}  {i['what']}  -> {i['playbook']}")


@subscription_app.command("show")
def subscription_show(
    name: NameArg,
    as_json: JsonOpt = False,
    home: HomeOpt = None,
    db: DbOpt = None,
    server: ServerOpt = None,
) -> None:
    """A subscription: its definition and latest firings (messages that started a run,
    and those that could not, with why)."""
    if server:
        with server_client(server) as api:
            doc = remote_or_exit(lambda: api.api("GET", f"/api/subscriptions/{name}"))
    else:
        from flowtide.documents.subscriptions import read_subscription
        from flowtide.errors import NotFoundError
        from flowtide.triggers.subscription import subscription_from_json

        store = open_store(home, db)
        try:
            row = store.get_trigger(KIND, name)
            doc = dict(read_subscription(store, row, subscription_from_json(row.spec), limit=20))
        except NotFoundError as exc:
            raise _fail(str(exc)) from None
        finally:
            store.close()
    if as_json:
        print_json(doc)
        return
    _show(doc)


def _show(doc: dict[str, Any]) -> None:
    echo = typer.echo
    echo(f"subscription {doc['name']}" + (f": {doc['description']}" if doc["description"] else ""))
    echo(
        f"  playbook  {doc['playbook']}" + (f" version {doc['version']}" if doc["version"] else "")
    )
    echo(f"  source    {doc['what']}")
    if doc["auth"]:
        echo(f"  auth      {doc['auth']}")
    if doc["batch"]:
        echo(f"  batch     {doc['batch']['size']} (max wait {doc['batch']['max_wait']:g}s)")
    if doc["rate"]:
        echo(f"  rate      {doc['rate']:g}/s")
    echo(f"  state     {'paused' if doc['paused'] else 'active'}")
    if doc["workload"]:
        echo(f"  workload  {json.dumps(doc['workload'])}")
    if doc.get("listener"):
        echo(f"  listener  {json.dumps(doc['listener'])}")
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
            remote_or_exit(lambda: api.api("POST", f"/api/subscriptions/{name}/{verb}"))
    else:
        from flowtide.errors import NotFoundError

        store = open_store(home, db)
        try:
            store.set_trigger_paused(KIND, name, paused, now=time.time())
        except NotFoundError as exc:
            raise _fail(str(exc)) from None
        finally:
            store.close()
    typer.echo(f"subscription {name}: {'paused' if paused else 'resumed'}")


@subscription_app.command("pause")
def subscription_pause(
    name: NameArg, home: HomeOpt = None, db: DbOpt = None, server: ServerOpt = None
) -> None:
    """Pause: its listeners stop (JetStream messages wait in the stream)."""
    _toggle(name, True, home, db, server)


@subscription_app.command("resume")
def subscription_resume(
    name: NameArg, home: HomeOpt = None, db: DbOpt = None, server: ServerOpt = None
) -> None:
    """Resume: its listeners start again where the consumer is."""
    _toggle(name, False, home, db, server)


@subscription_app.command("delete")
def subscription_delete(
    name: NameArg, home: HomeOpt = None, db: DbOpt = None, server: ServerOpt = None
) -> None:
    """Delete a subscription (the runs it started stay, and say it started them)."""
    if server:
        with server_client(server) as api:
            remote_or_exit(lambda: api.api("DELETE", f"/api/subscriptions/{name}"))
    else:
        from flowtide.errors import NotFoundError

        store = open_store(home, db)
        try:
            store.delete_trigger(KIND, name)
        except NotFoundError as exc:
            raise _fail(str(exc)) from None
        finally:
            store.close()
    typer.echo(f"subscription {name}: deleted")


# -- kind: Subscription documents (flowtide catalog register) ----------------------------


def is_subscription(file: Path) -> bool:
    """Whether the file is a `kind: Subscription` document (its `kind:` line)."""
    try:
        with file.open(encoding="utf-8", errors="replace") as f:
            head = f.read(65536)
    except OSError:
        return False
    return re.search(r"(?m)^kind:\s*['\"]?Subscription['\"]?\s*(#.*)?$", head) is not None


def register_subscription(file: Path, api: Any, store: Any) -> bool:
    """Add or replace the subscription a `kind: Subscription` file defines; False when
    refused (the error, with file:line, on stderr)."""
    from flowtide.errors import FlowtideError
    from flowtide.playbook.source import load_yaml
    from flowtide.triggers.subscription import subscription_from_document

    try:
        text = file.read_text(encoding="utf-8")
        doc, positions = load_yaml(text, str(file))
        spec = subscription_from_document(doc, source=str(file), positions=positions)
    except OSError as exc:
        err(f"skipped: {file}: {exc.strerror}")
        return False
    except FlowtideError as exc:
        err(f"skipped: {exc}")
        return False
    if api is not None:
        fields = dict(doc.get("spec") or {})
        playbook = fields.get("playbook")
        if isinstance(playbook, dict):
            fields["playbook"] = playbook.get("path")
            fields["version"] = playbook.get("version")
        description = (doc.get("metadata") or {}).get("description")
        body = fields | {"name": spec.name, "replace": True, "description": description}
        body = {k: v for k, v in body.items() if v is not None}
        remote_or_exit(partial(api.api, "POST", "/api/subscriptions", json=body))
    else:
        from flowtide.ids import default_generator
        from flowtide.triggers.subscriptions import define_subscription

        try:
            define_subscription(
                store,
                spec,
                new_id=default_generator().next_id,
                now=time.time(),
                local=True,
                base=file.parent,
            )
        except FlowtideError as exc:
            err(f"skipped: {file}: {exc}")
            return False
    typer.echo(f"subscription {spec.name}  ({file})")
    return True
