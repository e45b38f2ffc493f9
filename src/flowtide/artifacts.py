"""Results by reference, and the artifact store they live in.

A step's result over a size threshold is not recorded in the event log: it is written to
the artifact store and the step records a small stand-in (NoETL's `result_ref`)::

    {"_ref": {"kind": "result_ref", "ref": "flowtide://execution/<id>/result/<step>/<key>",
              "store": "kv" | "disk" | "s3" | "gcs", "scope": "execution",
              "uri": "file:///.../<key>.json.gz", "meta": {"bytes", "sha256", ...},
              "preview": {...}, "extracted": {...}},
     "_store": "kv", "_size_bytes": 123456, "_preview": {...},
     "status": "ok", "count": 500, ...}        # the extracted fields, at the top

What NoETL does, read in its source (noetl/noetl): the worker's result handler
(noetl/worker/result_handler.py) externalizes a result over `inline_max_bytes` (64 KB,
NOETL_INLINE_MAX_BYTES), picks the tier from the step's `output.store.kind` (`auto`:
by size), and puts the fields named by `output_select` (else small fields picked
automatically, noetl/core/storage/extractor.py) beside `_ref`, `_store`, `_size_bytes`
and `_preview`; the tiers are `kv` under 1 MB and `disk` from 1 MB
(noetl/core/storage/models.py, test_storage_tiers.yaml), `s3`/`gcs` when asked for. A
later step reads the whole with `kind: artifact, action: get, result_ref: {{ step._ref }}`
(noetl/tools/artifact/executor.py).

Where the data goes: every tier is a location, by default a folder of the runtime's data
directory (`<data_dir>/results/<tier>/<execution>/<step>/<key>.json.gz`), the same for
the embedded runtime and for workers sharing a home; `FLOWTIDE_RESULT_STORE` (a folder or
an fsspec URL such as s3://bucket/prefix, gs://..., memory://) moves them all, and
`FLOWTIDE_RESULT_STORE_<TIER>` one tier. Workers on several machines need a location they
all reach. URLs other than file:// need fsspec (`pip install 'flowtide[artifacts]'`, plus
s3fs or gcsfs for those protocols).
"""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import os
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowtide.errors import ToolError
from flowtide.home import find_home
from flowtide.jsonvalues import dumps, loads

__all__ = [
    "OutputSpec",
    "externalize",
    "is_reference",
    "load",
    "output_spec",
    "put",
    "resolve_location",
]

# NoETL's inline limit (NOETL_INLINE_MAX_BYTES), above which results of steps that
# declare `output` are stored by reference, is FLOWTIDE_INLINE_MAX_BYTES
# (flowtide.settings.LimitsSection.inline_max_bytes).
KV_MAX_BYTES = 1024 * 1024
TIERS = ("kv", "disk", "s3", "gcs")
_TIER_ALIASES = {"object": "disk", "memory": "kv", "nats_kv": "kv", "file": "disk"}
ENV_STORE = "FLOWTIDE_RESULT_STORE"
PREVIEW_BYTES = 1024
_SAFE = re.compile(r"[^A-Za-z0-9_.=-]")
_REF = re.compile(
    r"^(?:flowtide|noetl)://execution/(?!\.\.?/)([^/]+)/result/(?!\.\.?/)([^/]+)/(?!\.\.?$)([^/]+)$"
)

# NoETL's automatic extraction (extractor.py): these fields always, other scalars and
# small lists of scalars, `<key>_count` for longer lists, nested objects flattened.
_ALWAYS = frozenset(
    {"status", "id", "error", "message", "code", "count", "total", "success", "failed"}
    | {"name", "type", "kind", "state"}
)
_SMALL_LIST = 10
_MAX_TEXT = 500


@dataclass(frozen=True)
class OutputSpec:
    """A step's `output:` (or a task's): which fields to keep beside the reference, the
    tier, and the inline limit. `declared`: the playbook wrote one."""

    select: tuple[str, ...] = ()
    store: str = "auto"
    inline_max_bytes: int | None = None
    declared: bool = False


def output_spec(*blocks: Any) -> OutputSpec:
    """The output settings of a step: the first of `blocks` (the step's `output`, then
    its last task's `output` or `output_select`) that says anything.

    Accepted forms: `{output_select: [paths], store: {kind}, inline_max_bytes}`, a bare
    list of paths, and `{strategy: size_threshold, threshold_kb}` (NoETL's http tasks).

    Raises:
        ToolError: kind "config_error" for a shape none of these is.
    """
    for block in blocks:
        if block in (None, {}, []):
            continue
        if isinstance(block, list | tuple):
            return OutputSpec(select=tuple(str(p) for p in block), declared=True)
        if not isinstance(block, Mapping):
            raise ToolError(
                f"`output` must be a mapping or a list of fields, not {type(block).__name__}",
                kind="config_error",
            )
        select = block.get("output_select", block.get("select"))
        limit = block.get("inline_max_bytes")
        if isinstance(select, Mapping):  # {strategy: size_threshold, threshold_kb}
            if select.get("threshold_kb") is not None:
                limit = int(float(select["threshold_kb"]) * 1024)
            select = select.get("fields")
        if block.get("threshold_kb") is not None:
            limit = int(float(block["threshold_kb"]) * 1024)
        store = block.get("store") or "auto"
        kind = store.get("kind", "auto") if isinstance(store, Mapping) else store
        paths = [select] if isinstance(select, str) else list(select or [])
        return OutputSpec(
            select=tuple(str(p) for p in paths),
            store=_tier(str(kind or "auto")),
            inline_max_bytes=int(limit) if limit is not None else None,
            declared=True,
        )
    return OutputSpec()


def _tier(kind: str) -> str:
    kind = kind.strip().lower()
    kind = _TIER_ALIASES.get(kind, kind)
    if kind != "auto" and kind not in TIERS:
        raise ToolError(
            f"output store kind {kind!r}: expected auto, {', '.join(TIERS)}", kind="config_error"
        )
    return kind


def choose_tier(size: int, spec: OutputSpec) -> str:
    if spec.store != "auto":
        return spec.store
    return "kv" if size < KV_MAX_BYTES else "disk"


# ---------------------------------------------------------------------------------------
# Locations: a folder on this machine, or an fsspec URL
# ---------------------------------------------------------------------------------------


def _is_url(location: str) -> bool:
    return "://" in location and not location.startswith("file://")


def local_path(location: str) -> Path | None:
    """The file a location names on this machine; None for an fsspec URL."""
    return None if _is_url(location) else _local(location)


def tier_root(tier: str, data_dir: Path | None) -> str:
    """Where tier `tier` keeps its objects (a folder path or a URL)."""
    from flowtide.settings import HomeSection, read

    home = read(HomeSection)
    specific: str | None = getattr(home, f"result_store_{tier}", None)
    if specific:
        return specific.rstrip("/")
    shared = home.result_store
    if shared:
        return f"{shared.rstrip('/')}/{tier}"
    if tier in ("s3", "gcs"):
        raise ToolError(
            f"results go to the {tier} tier, which has no location: set "
            f"{ENV_STORE}_{tier.upper()} (e.g. {'s3' if tier == 's3' else 'gs'}://bucket/prefix)",
            kind="config_error",
        )
    base = (data_dir or find_home() / "data").absolute()
    return str(base / "results" / tier)


def _fsspec() -> Any:
    try:
        import fsspec
    except ImportError:
        raise ToolError(
            "artifact locations other than local files need fsspec: "
            "pip install 'flowtide[artifacts]' (and s3fs or gcsfs for those protocols)",
            kind="config_error",
        ) from None
    return fsspec


def _local(location: str) -> Path:
    return Path(location.removeprefix("file://"))


def write_bytes(location: str, data: bytes) -> None:
    """Write `data` at `location` (folders created), through a temporary name."""
    if _is_url(location):
        with _fsspec().open(location, "wb") as out:
            out.write(data)
        return
    path = _local(location)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    staging.write_bytes(data)
    os.replace(staging, path)


def _exists(location: str) -> bool:
    if _is_url(location):
        fs, path = _fsspec().core.url_to_fs(location)
        return bool(fs.exists(path))
    return _local(location).exists()


def read_bytes(location: str) -> bytes:
    """The bytes at `location`.

    Raises:
        ToolError: kind "not_found" when nothing is there.
    """
    try:
        if _is_url(location):
            with _fsspec().open(location, "rb") as stream:
                data: bytes = stream.read()
            return data
        return _local(location).read_bytes()
    except FileNotFoundError:
        raise ToolError(f"no artifact at {location}", kind="not_found") from None


def _uri(location: str) -> str:
    return (
        location if _is_url(location) or location.startswith("file://") else Path(location).as_uri()
    )


# ---------------------------------------------------------------------------------------
# Extraction and preview (NoETL's extractor)
# ---------------------------------------------------------------------------------------


def _path_value(data: Any, path: str) -> Any:
    current = data
    for part in path.replace("]", "").split("."):
        if current is None:
            return None
        key, _, index = part.partition("[")
        if key:
            current = current.get(key) if isinstance(current, Mapping) else None
        if index:
            if isinstance(current, list) and index.isdigit() and int(index) < len(current):
                current = current[int(index)]
            else:
                return None
    return current


def _small(value: Any) -> bool:
    return (
        value is None
        or isinstance(value, bool | int | float)
        or (isinstance(value, str) and len(value) <= 1000)
    )


def _trim(value: Any) -> Any:
    if isinstance(value, str) and len(value) > _MAX_TEXT:
        return value[:_MAX_TEXT] + "..."
    return value


def extract(data: Any, paths: Sequence[str]) -> dict[str, Any]:
    """The fields kept beside a reference: `paths` (each under its last name), or the
    small fields of `data` when none are named."""
    if paths:
        out = {}
        for path in paths:
            value = _path_value(data, path)
            if value is not None:
                out[path.split(".")[-1].split("[")[0]] = _trim(value)
        return out
    return _auto(data, 0)


def _auto(data: Any, depth: int) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        if _small(data):
            return {"_value": _trim(data)}
        if isinstance(data, list):
            return {"_count": len(data)}
        return {}
    out: dict[str, Any] = {}
    for key, value in data.items():
        if _small(value) or (key in _ALWAYS and isinstance(value, str)):
            out[key] = _trim(value)
        elif isinstance(value, list):
            if len(value) <= _SMALL_LIST and all(_small(v) for v in value):
                out[key] = value
            else:
                out[f"{key}_count"] = len(value)
        elif isinstance(value, Mapping) and depth < 2:
            for inner, item in _auto(value, depth + 1).items():
                if not inner.startswith("_"):
                    out[f"{key}_{inner}"] = item
    return out


def preview(data: Any, limit: int = PREVIEW_BYTES) -> dict[str, Any]:
    def short(value: Any) -> Any:
        if isinstance(value, str):
            return value[:100] + "..." if len(value) > 100 else value
        if isinstance(value, list):
            return f"[{len(value)} items]"
        if isinstance(value, Mapping):
            return f"{{{len(value)} keys}}"
        return value

    if isinstance(data, Mapping):
        out: dict[str, Any] = {}
        used = 2
        for key, value in data.items():
            item = short(value)
            used += len(dumps({str(key): item}))
            if used > limit:
                out["_truncated"] = True
                break
            out[str(key)] = item
        return out
    if isinstance(data, list):
        return {"_type": "array", "_count": len(data), "_sample": [short(v) for v in data[:3]]}
    return {"_value": str(data)[:200]}


# ---------------------------------------------------------------------------------------
# Storing and loading
# ---------------------------------------------------------------------------------------


def _encode(text: str, compress: bool) -> tuple[bytes, str]:
    raw = text.encode("utf-8")
    data = gzip.compress(raw, compresslevel=5, mtime=0) if compress else raw
    return data, hashlib.sha256(raw).hexdigest()


def put(
    value: Any,
    *,
    execution_id: int | str,
    name: str,
    tier: str,
    data_dir: Path | None,
    text: str | None = None,
    location: str | None = None,
    compress: bool = True,
) -> dict[str, Any]:
    """Store `value` as JSON (gzipped unless `compress` is false); returns its
    `result_ref`.

    `location`: where exactly (a path or URL); default, a new key in tier `tier`.

    Raises:
        ToolError: kind "config_error" (tier without a location, fsspec missing),
            "result_store" (the write failed).
    """
    text = dumps(value) if text is None else text
    data, digest = _encode(text, compress)
    key = uuid.uuid4().hex[:16]
    safe = _SAFE.sub("_", name)
    if not safe.strip("."):
        safe = "result"  # a folder of the execution's own, never "." or ".." (a step's name)
    tier = "disk" if tier == "auto" else tier
    if location is None:
        location = f"{tier_root(tier, data_dir)}/{execution_id}/{safe}/{key}.json.gz"
    try:
        write_bytes(location, data)
    except ToolError:
        raise
    except Exception as exc:  # OSError, fsspec's backends' own errors
        raise ToolError(
            f"cannot store the result at {location}: {type(exc).__name__}: {exc}",
            kind="result_store",
            retryable=True,
        ) from None
    return {
        "kind": "result_ref",
        "ref": f"flowtide://execution/{execution_id}/result/{safe}/{key}",
        "store": tier,
        "scope": "execution",
        "expires_at": None,
        "uri": _uri(location),
        "meta": {
            "content_type": "application/json",
            "bytes": len(text.encode("utf-8")),
            "stored_bytes": len(data),
            "sha256": digest,
            "compression": "gzip" if compress else "none",
            "encoding": "utf-8",
            "created_at": dt.datetime.now(dt.UTC).isoformat(),
        },
    }


def externalize(
    value: Any,
    text: str,
    spec: OutputSpec,
    *,
    execution_id: int,
    step: str,
    data_dir: Path | None,
) -> dict[str, Any]:
    """Store a step's result (`text`: its JSON) and return what the step records in its
    place: `_ref`, `_store`, `_size_bytes`, `_preview` and the extracted fields."""
    size = len(text.encode("utf-8"))
    tier = choose_tier(size, spec)
    ref = put(value, execution_id=execution_id, name=step, tier=tier, data_dir=data_dir, text=text)
    extracted = extract(value, spec.select)
    shown = preview(value)
    ref["preview"] = shown
    ref["extracted"] = extracted
    reserved = {"_ref", "_store", "_size_bytes", "_preview"}
    out: dict[str, Any] = {k: v for k, v in extracted.items() if k not in reserved}
    out.update({"_ref": ref, "_store": tier, "_size_bytes": size, "_preview": shown})
    return out


def is_reference(value: Any) -> bool:
    """A result stored by reference (what `externalize` returned)."""
    return isinstance(value, Mapping) and isinstance(value.get("_ref"), Mapping)


def location_of(ref: Any, data_dir: Path | None, base_dir: Path | None) -> str:
    """Where `ref` (a `_ref`, a result holding one, a logical ref, a path or a URL) is
    stored.

    Raises:
        ToolError: kinds "config_error", "not_found" (a logical ref stored nowhere).
    """
    if isinstance(ref, Mapping):
        if isinstance(ref.get("_ref"), Mapping):
            ref = ref["_ref"]
        uri = ref.get("uri")
        if isinstance(uri, str) and uri:
            return uri
        ref = ref.get("ref")
    if not isinstance(ref, str) or not ref.strip():
        raise ToolError(
            "artifact get needs `result_ref` ({{ step._ref }}) or `uri`", kind="config_error"
        )
    ref = ref.strip()
    logical = _REF.match(ref)
    if logical:
        execution, step, key = logical.groups()
        for tier in TIERS:
            try:
                root = tier_root(tier, data_dir)
            except ToolError:
                continue
            location = f"{root}/{execution}/{step}/{key}.json.gz"
            if _exists(location):
                return location
        raise ToolError(f"no stored result {ref}", kind="not_found")
    return resolve_location(ref, base_dir)


def resolve_location(target: str, base_dir: Path | None) -> str:
    """A path or URL as a location: NoETL's artifact://localfs/<path>, file:// and fsspec
    URLs as they are, relative paths against the playbook's folder."""
    if target.startswith("artifact://"):
        rest = target.removeprefix("artifact://")
        return "/" + rest.removeprefix("localfs/") if rest.startswith("localfs/") else rest
    if _is_url(target) or target.startswith("file://"):
        return target
    path = Path(target).expanduser()
    return str(path if path.is_absolute() else (base_dir or Path.cwd()) / path)


def load(
    ref: Any, *, data_dir: Path | None = None, base_dir: Path | None = None
) -> tuple[Any, str, int]:
    """(value, uri, stored bytes) of a reference: a `_ref` (or the result holding one), a
    logical `flowtide://` / `noetl://` ref, a path, a file:// or an fsspec URL. Gzip is
    recognised by its magic bytes; text that is not JSON comes back as text.

    Raises:
        ToolError: kinds "config_error", "not_found".
    """
    location = location_of(ref, data_dir, base_dir)
    data = read_bytes(location)
    size = len(data)
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    text = data.decode("utf-8")
    try:
        return loads(text), _uri(location), size
    except ValueError:
        return text, _uri(location), size
