"""Tool kinds by name, imported on first use (duckdb and psycopg are slow to import)."""

from __future__ import annotations

import importlib
import inspect
import threading
from typing import Any

from flowtide.errors import ToolError

_KINDS = {
    "python": ("flowtide.tools.python", "PythonTool"),
    "http": ("flowtide.tools.http", "HttpTool"),
    "postgres": ("flowtide.tools.postgres", "PostgresTool"),
    "duckdb": ("flowtide.tools.duckdb", "DuckDBTool"),
    "noop": ("flowtide.tools.noop", "NoopTool"),
    "spark": ("flowtide.tools.spark", "SparkTool"),
    "transfer": ("flowtide.tools.transfer", "TransferTool"),
    "artifact": ("flowtide.tools.artifact", "ArtifactTool"),
}

_instances: dict[str, Any] = {}
_lock = threading.Lock()


def warm_tools(kinds: set[str], **hints: Any) -> None:
    """Import (and let prepare) the tools of `kinds` ahead of the first command.

    `hints` (the playbook's `executor`, the runtime's `data_dir`) reach the `warm` methods
    that name them as parameters.
    """
    for kind in kinds:
        if kind not in _KINDS:
            continue
        try:
            tool = get_tool(kind)
        except ToolError:
            continue  # reported when a step actually uses it
        warm = getattr(tool, "warm", None)
        if warm is not None:
            accepted = inspect.signature(warm).parameters
            warm(**{k: v for k, v in hints.items() if k in accepted})


def cancel_running(execution_id: int | None = None) -> None:
    """Ask the tools in use to stop the work they run for `execution_id` (every execution
    when None) now: work that runs outside Python (Spark jobs) does not stop by itself
    when the process stops waiting for it."""
    for tool in list(_instances.values()):
        cancel = getattr(tool, "cancel", None)
        if cancel is None:
            continue
        try:
            cancel(execution_id)
        except Exception:  # noqa: BLE001 - best effort on the way out
            continue


def get_tool(kind: str) -> Any:
    """The shared instance of tool `kind`.

    Raises:
        ToolError: unknown kind, or its module cannot be imported (missing extra).
    """
    tool = _instances.get(kind)
    if tool is not None:
        return tool
    with _lock:
        tool = _instances.get(kind)
        if tool is None:
            if kind not in _KINDS:
                raise ToolError(f"no tool of kind '{kind}'", kind="config_error")
            module_name, class_name = _KINDS[kind]
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:
                raise ToolError(
                    f"tool '{kind}' is not available: {exc}; install flowtide with the matching extra",
                    kind="config_error",
                ) from exc
            tool = getattr(module, class_name)()
            _instances[kind] = tool
    return tool
