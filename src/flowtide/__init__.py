"""flowtide: an event-sourced engine for NoETL-style YAML playbooks.

The public API is what this module exports (`__all__`); every other module may change.

    import flowtide

    doc = flowtide.run("examples/quickstart.yaml", workload={"orders_per_region": 50})
    doc["status"], doc["result"]

Names are imported on first use, so `import flowtide` stays cheap (the CLI's start-up
depends on it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, tuple[str, str]] = {
    "run": ("flowtide.embedded", "run"),
    "Playbook": ("flowtide.playbook.model", "Playbook"),
    "load_playbook": ("flowtide.playbook.loader", "load_playbook"),
    "parse_playbook": ("flowtide.playbook.loader", "parse_playbook"),
    "LocalRuntime": ("flowtide.runtime.local", "LocalRuntime"),
    "Event": ("flowtide.engine.events", "Event"),
    "Command": ("flowtide.engine.events", "Command"),
    "Store": ("flowtide.store.base", "Store"),
    "KeyValue": ("flowtide.kv.base", "KeyValue"),
    "Tool": ("flowtide.tools.base", "Tool"),
    "ToolContext": ("flowtide.tools.base", "ToolContext"),
    "ToolSpec": ("flowtide.tools.spec", "ToolSpec"),
    "FieldSpec": ("flowtide.tools.spec", "FieldSpec"),
    "TaskCheck": ("flowtide.tools.spec", "TaskCheck"),
    "FlowtideError": ("flowtide.errors", "FlowtideError"),
    "PlaybookError": ("flowtide.errors", "PlaybookError"),
    "TemplateError": ("flowtide.errors", "TemplateError"),
    "ToolError": ("flowtide.errors", "ToolError"),
    "StoreError": ("flowtide.errors", "StoreError"),
    "NotFoundError": ("flowtide.errors", "NotFoundError"),
    "CredentialError": ("flowtide.errors", "CredentialError"),
    "KVError": ("flowtide.kv.base", "KVError"),
}

__all__ = [
    "Command",
    "CredentialError",
    "Event",
    "FieldSpec",
    "FlowtideError",
    "KVError",
    "KeyValue",
    "LocalRuntime",
    "NotFoundError",
    "Playbook",
    "PlaybookError",
    "Store",
    "StoreError",
    "TaskCheck",
    "TemplateError",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolSpec",
    "__version__",
    "load_playbook",
    "parse_playbook",
    "run",
]

if TYPE_CHECKING:
    from flowtide.embedded import run
    from flowtide.engine.events import Command, Event
    from flowtide.errors import (
        CredentialError,
        FlowtideError,
        NotFoundError,
        PlaybookError,
        StoreError,
        TemplateError,
        ToolError,
    )
    from flowtide.kv.base import KeyValue, KVError
    from flowtide.playbook.loader import load_playbook, parse_playbook
    from flowtide.playbook.model import Playbook
    from flowtide.runtime.local import LocalRuntime
    from flowtide.store.base import Store
    from flowtide.tools.base import Tool, ToolContext
    from flowtide.tools.spec import FieldSpec, TaskCheck, ToolSpec


def __getattr__(name: str) -> Any:
    try:
        module_name, attribute = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'flowtide' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module_name), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
