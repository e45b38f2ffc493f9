"""`flowtide kv add BUCKET` and `flowtide kv edit BUCKET`: create a bucket with its
settings, and change the settings of an existing one, like `nats kv add/edit`.

`edit` changes only the settings given on the command line (the others stay as they
are), in place (JetStream STREAM.UPDATE); what JetStream cannot change in place
(storage, the mirror setting) is refused with what to do instead.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from flowtide.cli.backends import close_kv, open_kv
from flowtide.cli.kv_common import (
    KvUrlOpt,
    _require_shared_kv,
    _run_kv,
    kv_app,
    print_status,
)
from flowtide.cli.options import EXIT_INVALID, JsonOpt, NatsCredsOpt, err

BucketArg = Annotated[str, typer.Argument(help="The bucket name: letters, digits, _ and -.")]
HistoryOpt = Annotated[
    int | None,
    typer.Option("--history", min=1, max=64, help="Values kept per key, 1..64 (new bucket: 1)."),
]
TtlOpt = Annotated[
    float | None,
    typer.Option(
        "--ttl",
        min=0,
        help="Seconds a value lives; 0: values never expire (new bucket: never).",
    ),
]
MaxBytesOpt = Annotated[
    int | None,
    typer.Option(
        "--max-bytes",
        min=0,
        help=(
            "Bucket size limit in bytes: a write into a full bucket is refused (nothing "
            "older is dropped). 0: unlimited (new bucket: unlimited)."
        ),
    ),
]
MaxValueSizeOpt = Annotated[
    int | None,
    typer.Option("--max-value-size", min=0, help="Largest value in bytes; 0: unlimited."),
]
StorageOpt = Annotated[
    str | None,
    typer.Option(
        "--storage",
        metavar="file|memory",
        help="JetStream storage (new bucket: file). Cannot change later.",
    ),
]
ReplicasOpt = Annotated[
    int | None,
    typer.Option("--replicas", min=1, max=5, help="JetStream replicas, 1..5 (new bucket: 1)."),
]
CompressionOpt = Annotated[
    bool | None,
    typer.Option("--compression/--no-compression", help="JetStream s2 compression on disk."),
]
PlacementClusterOpt = Annotated[
    str | None,
    typer.Option("--placement-cluster", help="Place the bucket's stream in this cluster."),
]
PlacementTagOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--placement-tag",
        help=(
            "Place it on servers carrying this tag (server_tags in their config); "
            "repeat for several (all must match). With edit, the placement given "
            "replaces the whole placement."
        ),
    ),
]
RepublishOpt = Annotated[
    tuple[str, str] | None,
    typer.Option(
        "--republish",
        metavar="KEYS SUBJECT",
        help=(
            "Republish every write to the keys matching KEYS ('>' for all, 'orders.>') "
            "on the NATS subject SUBJECT, which may reuse KEYS' wildcards ('out.>')."
        ),
    ),
]
HeadersOnlyOpt = Annotated[
    bool,
    typer.Option("--republish-headers-only", help="Republish the headers only, without the value."),
]
SourceOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--source",
        metavar="BUCKET",
        help=(
            "Aggregate the keys of BUCKET into this one (the bucket follows it); repeat "
            "for several. With edit, the sources given replace the list."
        ),
    ),
]
MarkerTtlOpt = Annotated[
    float | None,
    typer.Option(
        "--limit-marker-ttl",
        "--per-value-ttl",
        min=1,
        help=(
            "Turn on per-value TTL (create with a TTL; ADR-48 limit markers): a key "
            "whose value expired leaves a marker watchers see, kept this many seconds "
            "(at least 1). Needs nats-server 2.11+; cannot be turned off once on."
        ),
    ),
]


def _settings(
    *,
    history: int | None,
    ttl: float | None,
    max_bytes: int | None,
    max_value_size: int | None,
    storage: str | None,
    replicas: int | None,
    compression: bool | None,
    placement_cluster: str | None,
    placement_tags: list[str] | None,
    no_placement: bool = False,
    republish: tuple[str, str] | None,
    headers_only: bool,
    no_republish: bool = False,
    mirror: str | None = None,
    sources: list[str] | None,
    limit_marker_ttl: float | None,
) -> dict[str, Any]:
    """connect's keyword arguments for the options given (those not given are left
    out, so `edit` leaves them as they are). 0 means "no limit" for the limits."""
    from flowtide.kv import KVError, Placement, Republish

    out: dict[str, Any] = {}
    if history is not None:
        out["history"] = history
    if ttl is not None:
        out["ttl"] = ttl or None
    if max_bytes is not None:
        out["max_bytes"] = max_bytes or None
    if max_value_size is not None:
        out["max_value_size"] = max_value_size or None
    if storage is not None:
        if storage not in ("file", "memory"):
            err(f"error: --storage is 'file' or 'memory', got {storage!r}")
            raise typer.Exit(EXIT_INVALID)
        out["storage"] = storage
    if replicas is not None:
        out["replicas"] = replicas
    if compression is not None:
        out["compression"] = compression
    try:
        if placement_cluster or placement_tags:
            out["placement"] = Placement(placement_cluster, tuple(placement_tags or ()))
        elif no_placement:
            out["placement"] = None
        if republish and all(republish):
            out["republish"] = Republish(
                republish[1], source=republish[0], headers_only=headers_only
            )
        elif headers_only:
            err("error: --republish-headers-only goes with --republish KEYS SUBJECT")
            raise typer.Exit(EXIT_INVALID)
        elif no_republish:
            out["republish"] = None
    except KVError as exc:  # a placement or republish that is no valid setting
        err(f"error: {exc}")
        raise typer.Exit(EXIT_INVALID) from None
    if mirror is not None:
        out["mirror"] = mirror
    if sources:
        out["sources"] = tuple(sources)
    if limit_marker_ttl is not None:
        out["limit_marker_ttl"] = limit_marker_ttl
    return out


@kv_app.command("add")
def kv_add(
    bucket: BucketArg,
    history: HistoryOpt = None,
    ttl: TtlOpt = None,
    max_bytes: MaxBytesOpt = None,
    max_value_size: MaxValueSizeOpt = None,
    storage: StorageOpt = None,
    replicas: ReplicasOpt = None,
    compression: CompressionOpt = None,
    placement_cluster: PlacementClusterOpt = None,
    placement_tag: PlacementTagOpt = None,
    republish: RepublishOpt = None,
    republish_headers_only: HeadersOnlyOpt = False,
    mirror: Annotated[
        str | None,
        typer.Option(
            "--mirror",
            metavar="ORIGIN",
            help=(
                "Make the bucket a read-only mirror of bucket ORIGIN (a read replica, "
                "e.g. on a far site with --placement-cluster): writes go to ORIGIN, and "
                "reads sent to ORIGIN are answered by the nearest of ORIGIN and its mirrors."
            ),
        ),
    ] = None,
    source: SourceOpt = None,
    limit_marker_ttl: MarkerTtlOpt = None,
    url: KvUrlOpt = "memory://",
    nats_creds: NatsCredsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a bucket with these settings and show its status.

    Exit 2 when it exists already (`flowtide kv edit BUCKET` changes it).
    Settings not given get the defaults: history 1, no TTL, no size limits,
    file storage, 1 replica.
    """
    _require_shared_kv(url)

    async def main() -> None:
        from flowtide.kv import BucketNotFoundError

        settings = _settings(
            history=history,
            ttl=ttl,
            max_bytes=max_bytes,
            max_value_size=max_value_size,
            storage=storage,
            replicas=replicas,
            compression=compression,
            placement_cluster=placement_cluster,
            placement_tags=placement_tag,
            republish=republish,
            headers_only=republish_headers_only,
            mirror=mirror,
            sources=source,
            limit_marker_ttl=limit_marker_ttl,
        )
        try:
            existing = await open_kv(url, bucket, create=False, nats_creds=nats_creds)
        except BucketNotFoundError:
            pass
        else:
            await close_kv(existing)
            err(
                f"error: bucket {bucket!r} exists already; `flowtide kv edit {bucket} ...` "
                "changes its settings"
            )
            raise typer.Exit(EXIT_INVALID)
        kv = await open_kv(url, bucket, settings=settings, nats_creds=nats_creds)
        try:
            print_status(await kv.status(), url, as_json=as_json)
        finally:
            await close_kv(kv)

    _run_kv(url, main)


@kv_app.command("edit")
def kv_edit(
    bucket: BucketArg,
    history: HistoryOpt = None,
    ttl: TtlOpt = None,
    max_bytes: MaxBytesOpt = None,
    max_value_size: MaxValueSizeOpt = None,
    storage: StorageOpt = None,
    replicas: ReplicasOpt = None,
    compression: CompressionOpt = None,
    placement_cluster: PlacementClusterOpt = None,
    placement_tag: PlacementTagOpt = None,
    no_placement: Annotated[
        bool, typer.Option("--no-placement", help="Drop the placement.")
    ] = False,
    republish: RepublishOpt = None,
    republish_headers_only: HeadersOnlyOpt = False,
    no_republish: Annotated[
        bool, typer.Option("--no-republish", help="Stop republishing.")
    ] = False,
    source: SourceOpt = None,
    limit_marker_ttl: MarkerTtlOpt = None,
    url: KvUrlOpt = "memory://",
    nats_creds: NatsCredsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change the given settings of an existing bucket, in place, and show its status.

    Settings not given stay as they are. JetStream cannot change storage or
    turn a bucket into a mirror in place, nor turn per-value TTL off: those
    are refused (exit 2) with what to do instead (a new bucket, keys copied).
    """
    _require_shared_kv(url)

    async def main() -> None:
        settings = _settings(
            history=history,
            ttl=ttl,
            max_bytes=max_bytes,
            max_value_size=max_value_size,
            storage=storage,
            replicas=replicas,
            compression=compression,
            placement_cluster=placement_cluster,
            placement_tags=placement_tag,
            no_placement=no_placement,
            republish=republish,
            headers_only=republish_headers_only,
            no_republish=no_republish,
            sources=source,
            limit_marker_ttl=limit_marker_ttl,
        )
        if not settings:
            err("error: nothing to change: give the settings to change (see --help)")
            raise typer.Exit(EXIT_INVALID)
        from flowtide.kv import BucketNotFoundError

        try:
            kv = await open_kv(
                url, bucket, create=False, settings=settings, apply=True, nats_creds=nats_creds
            )
        except BucketNotFoundError:
            err(
                f"error: bucket {bucket!r} not found at {url}; `flowtide kv add {bucket} ...`"
                " creates it"
            )
            raise typer.Exit(EXIT_INVALID) from None
        try:
            print_status(await kv.status(), url, as_json=as_json)
        finally:
            await close_kv(kv)

    _run_kv(url, main)


__all__ = ["kv_add", "kv_edit"]
