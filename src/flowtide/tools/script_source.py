"""Where a task's `script:` field takes its code from (a file or inline code), for every
kind that takes one: python, postgres, and the `script` kind (whose runner is
`flowtide.tools.script`).

Shapes (every template already rendered): `{uri|path, source: {type: file}}`,
`{type: file, path|uri}`, `{source: {type: inline, code}}`, `{type: inline, code}`, or a
bare path string. A relative file path is looked up in the playbook's folder
(`ctx.base_dir`), then in the working directory: the same rule for every tool.

NoETL reads both tools' `script:` through one resolver, `noetl.core.script.resolve_script`
(`noetl/tools/python/executor.py`; `noetl/tools/postgres/command.py`
`decode_base64_commands`: "priority: script > *_b64 > inline"), so a postgres step may
name its SQL in a file instead of `command:`
(`script_execution/postgres_file_example.yaml`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flowtide.errors import ToolError
from flowtide.tools import files

__all__ = ["load_script", "script_path"]


def script_path(raw: str, base_dir: Path, *, tool: str, step: str, kind: str) -> Path:
    """The file `raw` names (`file://` allowed): absolute, or relative to `base_dir`, then
    to the working directory; ToolError `kind` (code ScriptNotFound) naming both tries."""
    text = raw.strip()
    if text.startswith("file://"):
        text = text[len("file://") :]
    path = Path(text).expanduser()
    candidates = [path] if path.is_absolute() else [Path(base_dir) / path, Path.cwd() / path]
    for candidate in candidates:
        if candidate.is_file():
            return files.check(candidate.resolve(), what=f"step '{step}', {tool} script file")
    tried = ", ".join(str(c) for c in candidates)
    raise ToolError(
        f"step '{step}', field 'script.uri': {tool} script file not found: {raw!r} (tried {tried})",
        kind=kind,
        code="ScriptNotFound",
        data={"path": raw, "tried": [str(c) for c in candidates]},
    )


def load_script(
    script: Any, base_dir: Path, *, tool: str, step: str, kind: str
) -> tuple[str, str | None]:
    """The text of `script` and the file it came from (None for inline code).

    Raises:
        ToolError: `kind` with code `InvalidConfig` (a shape it cannot read),
            `ScriptNotFound`, `ScriptNotReadable` or `UnsupportedScriptSource`; the
            message names the step and the field.
    """
    if isinstance(script, str):
        script = {"type": "file", "path": script}
    if not isinstance(script, Mapping):
        raise ToolError(
            f"script: expected a mapping or a path, got {type(script).__name__}",
            kind=kind,
            code="InvalidConfig",
        )
    source = script.get("source")
    source_map: Mapping[str, Any] = source if isinstance(source, Mapping) else {}
    source_kind = (
        script.get("type")
        or source_map.get("type")
        or (source if isinstance(source, str) else None)
    )
    inline = script.get("code", source_map.get("code"))
    location = (
        script.get("path") or script.get("uri") or source_map.get("path") or source_map.get("uri")
    )
    if source_kind is None:
        source_kind = "inline" if inline is not None else "file"
    if source_kind == "inline":
        if not isinstance(inline, str):
            raise ToolError(
                "script: type inline needs a `code` string", kind=kind, code="InvalidConfig"
            )
        return inline, None
    if source_kind == "file":
        if not isinstance(location, str) or not location.strip():
            raise ToolError(
                "script: type file needs a `path` or `uri`", kind=kind, code="InvalidConfig"
            )
        path = script_path(location, base_dir, tool=tool, step=step, kind=kind)
        try:
            return path.read_text(encoding="utf-8"), str(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise ToolError(
                f"step '{step}', field 'script.uri': cannot read {tool} script "
                f"{str(path)!r}: {exc}",
                kind=kind,
                code="ScriptNotReadable",
                data={"path": str(path)},
            ) from None
    raise ToolError(
        f"script source type {source_kind!r} is not supported (supported: file, inline)",
        kind=kind,
        code="UnsupportedScriptSource",
    )
