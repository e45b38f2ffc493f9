"""`flowtide kv ls|get|history|watch|del|status`: inside the key-value bucket that holds
loop state, like `nats kv`; `kv add|edit` (in `cli.kv_admin`) create a bucket and change
its settings."""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from flowtide.cli.backends import close_kv, open_kv
from flowtide.cli.kv_common import (
    KvBucketNameOpt,
    KvUrlOpt,
    _require_shared_kv,
    _run_kv,
    kv_app,
    print_status,
)
from flowtide.cli.options import EXIT_INVALID, JsonOpt, NatsCredsOpt, err, print_json

__all__ = ["kv_app"]


def _kv_command(
    url: str,
    bucket: str,
    body: Callable[[Any], Awaitable[None]],
    *,
    interrupt_ok: bool = False,
    nats_creds: Path | None = None,
) -> None:
    """Run `await body(kv)` on an open handle and turn KV errors into exit codes:
    2 for bad input (URL, key, filter, no such key or bucket), 1 for a failure."""
    _require_shared_kv(url)

    async def main() -> None:
        from flowtide.loopstate import DEFAULT_BUCKET

        # flowtide's own state bucket may not exist before the first run (`kv watch` in
        # one terminal, `run` in another); any other name must: `--bucket typo` is an
        # error, not a new bucket.
        kv = await open_kv(url, bucket, create=bucket == DEFAULT_BUCKET, nats_creds=nats_creds)
        try:
            await body(kv)
        finally:
            await close_kv(kv)

    _run_kv(url, main, interrupt_ok=interrupt_ok)


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
            print_json(keys)
            return
        for key in keys:
            sys.stdout.write(key + "\n")
        if not keys:
            err(f"no keys match {filter_!r} in bucket {bucket!r}")

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
            print_json(_kv_entry_doc(entry))
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
            print_json([_kv_entry_doc(e) for e in entries])
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
        err("error: --history and --updates-only exclude each other")
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
            print_json({"bucket": bucket, "key": key, "operation": operation})
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

    Values, history, TTL, sizes and limits, storage, replicas, compression,
    placement, republish, mirror origin, sources, per-value TTL (limit markers)
    and the backing store.
    """

    async def body(kv: Any) -> None:
        print_status(await kv.status(), url, as_json=as_json)

    _kv_command(url, bucket, body, nats_creds=nats_creds)


# After the commands above, so that `flowtide kv --help` lists add and edit last.
from flowtide.cli import kv_admin as _kv_admin  # noqa: E402, F401  (registers kv add, kv edit)
