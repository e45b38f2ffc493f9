"""The `artifact` tool: read back a result stored by reference, or store a value.

NoETL's artifact executor (noetl/noetl, noetl/tools/artifact/executor.py): `action: get`
(the default) loads `result_ref` (a `{{ step._ref }}` or a ref string) or `uri`; `action:
put` stores `data` at `uri` (gzipped unless `compress: false`). Its fields may also sit
under `input:`, as the fixtures write them. The locations are those of `flowtide.artifacts`
(a folder of the data directory by default; file://, paths, and fsspec URLs).

`get` returns what was stored. NoETL returns `{status, data: <stored>, uri, ...}`; a
stored object without a `data` field of its own comes back as it is, whose `.data` is
then itself (flowtide's result alias), so both `{{ load.data.items }}` and `{{ load.count }}`
read it; anything else comes back in NoETL's envelope. `put` returns `{status, uri,
size_bytes, sha256, compressed, result_ref}`; `result_ref` is what `get` takes back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flowtide import artifacts
from flowtide.errors import ToolError
from flowtide.tools import files
from flowtide.tools.base import ToolContext

__all__ = ["ArtifactTool"]


def _fields(config: Mapping[str, Any]) -> dict[str, Any]:
    """The task's fields, with those under `input:` (the tool's own win)."""
    given = config.get("input")
    merged = dict(given) if isinstance(given, Mapping) else {}
    merged.update({k: v for k, v in config.items() if k not in ("input", "kind", "name")})
    return merged


def _check(location: str, what: str) -> None:
    """A location this process may use (`flowtide.tools.files`: on a worker, a file under
    its file roots or a remote store).

    Raises:
        ToolError: kind "permission".
    """
    path = artifacts.local_path(location)
    if path is None:
        files.current().check_url(location, what=what)
    else:
        files.check(path, what=what)


class ArtifactTool:
    """Get or put an artifact (tool kind `artifact`)."""

    kind = "artifact"

    def run(self, config: dict[str, Any], ctx: ToolContext) -> Any:
        """Raises:
        ToolError: kinds "config_error", "not_found", "result_store".
        """
        fields = _fields(config)
        action = str(fields.get("action") or "get").strip().lower()
        if action == "get":
            return self._get(fields, ctx)
        if action == "put":
            return self._put(fields, ctx)
        raise ToolError(f"artifact action {action!r}: expected get or put", kind="config_error")

    @staticmethod
    def _get(fields: Mapping[str, Any], ctx: ToolContext) -> Any:
        ref = fields.get("result_ref") or fields.get("ref") or fields.get("uri")
        ref = ref or fields.get("path")
        location = artifacts.location_of(ref, ctx.data_dir, ctx.base_dir)
        _check(location, "artifact get")
        value, uri, size = artifacts.load(location)
        ctx.call_meta["artifact"] = {"action": "get", "uri": uri, "size_bytes": size}
        if isinstance(value, Mapping) and "data" not in value:
            return dict(value)
        return {"status": "success", "data": value, "uri": uri, "size_bytes": size}

    @staticmethod
    def _put(fields: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
        if "data" not in fields:
            raise ToolError("artifact put needs `data`", kind="config_error")
        target = fields.get("uri") or fields.get("path")
        location = None
        if isinstance(target, str) and target.strip():
            location = artifacts.resolve_location(target.strip(), ctx.base_dir)
            if fields.get("compress", True) is not False and not location.endswith(".gz"):
                location += ".gz"
            _check(location, "artifact put")
        tier = str(fields.get("store") or "disk")
        ref = artifacts.put(
            fields["data"],
            execution_id=ctx.execution_id,
            name=ctx.step,
            tier=artifacts.output_spec({"store": tier}).store,
            data_dir=ctx.data_dir,
            location=location,
            compress=fields.get("compress", True) is not False,
        )
        ctx.call_meta["artifact"] = {"action": "put", "uri": ref["uri"]}
        return {
            "status": "success",
            "uri": ref["uri"],
            "size_bytes": ref["meta"]["stored_bytes"],
            "sha256": ref["meta"]["sha256"],
            "compressed": ref["meta"]["compression"] == "gzip",
            "result_ref": ref,
        }
