"""What `flowtide kv`'s commands share: the command group, the --url option, the exit
codes of KV errors (`_run_kv`) and the status display. The commands are in `cli.kv`
(looking inside a bucket) and `cli.kv_admin` (add, edit)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

import typer

from flowtide.cli.options import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_INVALID,
    EXIT_OK,
    err,
    print_json,
    setting,
)
from flowtide.errors import exit_code
from flowtide.kv.errors import KVUnavailable
from flowtide.urls import redact_url, scrub_url

kv_app = typer.Typer(
    help=(
        "Look inside the key-value bucket that holds loop state, like `nats kv`. Keys are "
        "exec.<execution_id>.loop.<step>.<instance>.meta | r.<index> | done, and an "
        "execution's keys are removed when it ends. `kv add` and `kv edit` create a bucket "
        "and change its settings (size limit, placement, republish, mirror, sources, "
        "per-value TTL). Needs a store other processes can see: --url nats://HOST:PORT "
        "(or FLOWTIDE_KV)."
    ),
    no_args_is_help=True,
)
KvUrlOpt = Annotated[
    str,
    setting(
        "server.kv",
        "--url",
        help=(
            "The KV server, nats://[USER:PASS@]HOST:PORT. memory:// lives inside one process, "
            "so there is nothing to see in it from here."
        ),
    ),
]
KvBucketNameOpt = Annotated[str, setting("server.kv_bucket", "--bucket", help="Bucket to look at.")]


def _require_shared_kv(url: str) -> None:
    """Exit 2 for memory://: each process has its own, so another process's state is
    never in it."""
    if url.partition("://")[0].lower() == "memory":
        err(
            f"error: {url} is a store inside one process: `flowtide kv` cannot see what a run "
            "keeps there. Run with --kv nats://HOST:PORT and pass the same URL here "
            "(--url nats://HOST:PORT, or FLOWTIDE_KV)."
        )
        raise typer.Exit(EXIT_INVALID)


def _run_kv(
    url: str, main: Callable[[], Coroutine[Any, Any, None]], *, interrupt_ok: bool = False
) -> None:
    """`asyncio.run(main())`, its KV errors turned into exit codes (2: bad input, 1: a
    failure) and messages without the URL's password."""
    import asyncio

    from flowtide.kv import KeyNotFoundError, KVError

    try:
        asyncio.run(main())
    except typer.Exit:
        raise
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_OK if interrupt_ok else EXIT_INTERRUPTED) from None
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep Python from reporting
        # the failed flush of stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(EXIT_OK) from None
    except KVUnavailable as exc:
        err(f"error: {exc}")
        raise typer.Exit(exit_code(exc)) from None
    except KVError as exc:
        hint = ""
        if isinstance(exc, KeyNotFoundError) and exc.operation is not None:
            hint = f"; `flowtide kv history {exc.key}` shows what it held"
        err(f"error: {scrub_url(exc.message, url)}{hint}")
        raise typer.Exit(exit_code(exc)) from None
    except Exception as exc:  # never a traceback, and never the URL's password
        err(f"error: {scrub_url(f'{type(exc).__name__}: {exc}', url)}")
        raise typer.Exit(EXIT_FAILED) from None


def _seconds(value: float | None, unset: str) -> str:
    return unset if value is None else f"{value:g} s"


def print_status(status: Any, url: str, *, as_json: bool) -> None:
    """A bucket's `Status` as `kv status` prints it (JSON: every field)."""
    import dataclasses

    if as_json:
        print_json(dataclasses.asdict(status))
        return
    placement = status.placement
    where = (
        "any server"
        if placement is None
        else " ".join(
            ([f"cluster {placement.cluster}"] if placement.cluster else [])
            + [f"tag {t}" for t in placement.tags]
        )
    )
    rp = status.republish
    republish = (
        "none"
        if rp is None
        else f"keys {rp.source} -> {rp.destination}"
        + (" (headers only)" if rp.headers_only else "")
    )
    max_size = "unlimited" if status.max_value_size is None else f"{status.max_value_size} B"
    max_bytes = "unlimited" if status.max_bytes is None else f"{status.max_bytes} B"
    markers = (
        "off (create --ttl refused)"
        if status.limit_marker_ttl is None
        else f"on, markers kept {status.limit_marker_ttl:g} s"
    )
    rows = [
        ("bucket", status.bucket),
        ("values", status.values),
        ("history", status.history),
        ("ttl", _seconds(status.ttl, "none (values never expire)")),
        ("per-value ttl", markers),
        ("max value size", max_size),
        ("max bytes", max_bytes),
        ("bytes", status.bytes),
        ("storage", status.storage),
        ("replicas", status.replicas),
        ("compression", "s2" if status.compression else "none"),
        ("placement", where),
        ("republish", republish),
        ("mirror of", status.mirror or "-"),
        ("sources", ", ".join(status.sources) or "-"),
        ("backing store", status.backing_store),
        ("url", redact_url(url)),
    ]
    sys.stdout.write("".join(f"{name + ':':<16}{value}\n" for name, value in rows))
