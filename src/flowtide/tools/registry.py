"""Tool kinds by name, imported on first use (duckdb and psycopg are slow to import)."""

from __future__ import annotations

import importlib
import threading
from typing import Any

from flowtide.errors import ToolError

_KINDS = {
    "python": ("flowtide.tools.python", "PythonTool"),
    "http": ("flowtide.tools.http", "HttpTool"),
    "postgres": ("flowtide.tools.postgres", "PostgresTool"),
    "duckdb": ("flowtide.tools.duckdb", "DuckDBTool"),
    "noop": ("flowtide.tools.noop", "NoopTool"),
}

_instances: dict[str, Any] = {}
_lock = threading.Lock()


def warm_tools(kinds: set[str]) -> None:
    """Import (and let prepare) the tools of `kinds` ahead of the first command."""
    for kind in kinds:
        if kind not in _KINDS:
            continue
        try:
            tool = get_tool(kind)
        except ToolError:
            continue  # reported when a step actually uses it
        warm = getattr(tool, "warm", None)
        if warm is not None:
            warm()


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
