"""flowtide's settings: one tree, each setting declared once (pydantic-settings).

- `tree`: the sections (`ServerSection`, `NatsSection`, `ClientSection`, `HomeSection`,
  `LimitsSection`, `PythonSection`, `SparkSection`, `HooksSection`, `SessionSection`),
  each setting with its type, default, bounds, one line of help and its variable (the
  section's prefix and the field's name: FLOWTIDE_MAX_RESULT_BYTES, FLOWTIDE_NATS_USER...).
- `reading`: a section from the environment when a process starts (`read`), once per
  process (`current`, `reset`), a bad value as a `SettingsError` naming the variable.
- `catalog`: what the command line needs of the tree (variable, default, help, bounds),
  generated from it (`python -m flowtide.settings catalog`) so that `flowtide --help`
  imports no pydantic; `tests/unit/test_settings.py` checks that they agree, and that
  the settings table of docs/cli.md (`python -m flowtide.settings table`) does.

Importing this package imports nothing: the names below load their module on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flowtide.settings.reading import current, env_name, env_names, read, reset, to_env
    from flowtide.settings.tree import (
        SECTIONS,
        ClientSection,
        FaultsSection,
        HomeSection,
        HooksSection,
        LimitsSection,
        NatsSection,
        PythonSection,
        ServerSection,
        SessionSection,
        SparkSection,
    )

__all__ = [
    "SECTIONS",
    "ClientSection",
    "FaultsSection",
    "HomeSection",
    "HooksSection",
    "LimitsSection",
    "NatsSection",
    "PythonSection",
    "ServerSection",
    "SessionSection",
    "SparkSection",
    "current",
    "env_name",
    "env_names",
    "read",
    "reset",
    "to_env",
]

_READ = {"current", "env_name", "env_names", "read", "reset", "to_env"}


def __getattr__(name: str) -> Any:
    if name in _READ:
        from flowtide.settings import reading as module
    elif name in __all__:
        from flowtide.settings import tree as module  # type: ignore[no-redef]
    else:
        raise AttributeError(f"module 'flowtide.settings' has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value
