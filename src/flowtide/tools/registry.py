"""The runners of the tool kinds (`flowtide.tools.kinds`), one shared instance per kind
per process, made on first use (duckdb and psycopg are slow to import)."""

from __future__ import annotations

import inspect
import threading
from typing import Any

from flowtide.errors import ToolError
from flowtide.tools import kinds

_instances: dict[str, Any] = {}
_lock = threading.Lock()


def warm_tools(wanted: set[str], **hints: Any) -> None:
    """Import (and let prepare) the tools of the kinds `wanted` ahead of the first command.

    `hints` (the playbook's `executor`, the runtime's `data_dir`) reach the `warm` methods
    that name them as parameters.
    """
    for kind in wanted:
        spec = kinds.find(kind)
        if spec is None or spec.runner is None:
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
            spec = kinds.find(kind)
            if spec is None:
                raise ToolError(kinds.why_unknown(kind), kind="config_error")
            try:
                tool = spec.make_runner()
            except ImportError as exc:
                remedy = (
                    "install flowtide with the matching extra"
                    if kind in kinds.BUILTIN
                    else "install what its plugin needs"
                )
                raise ToolError(
                    f"tool '{kind}' is not available: {exc}; {remedy}", kind="config_error"
                ) from exc
            except LookupError as exc:
                raise ToolError(str(exc), kind="config_error") from exc
            _instances[kind] = tool
    return tool
