"""Every tool kind this process knows, by name: the built-in ones (`flowtide.tools.builtin`)
and those of the installed plugins (entry point group `flowtide.tools`). The loader asks
it which kinds exist and what their fields are, the runtime (`flowtide.tools.registry`)
how to make a kind's runner.

Built-ins come from the code, not from installed metadata, so a source tree run with
PYTHONPATH knows them all. Plugins are listed once per process (names only: a plugin's
module is imported when a playbook first uses its kind). A plugin cannot replace a
built-in kind (its entry point is ignored, with a warning), and two plugins cannot
provide the same kind (neither is used until one is uninstalled).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from flowtide.tools.builtin import SPECS
from flowtide.tools.spec import ENTRY_POINT_GROUP, ToolSpec, did_you_mean

log = logging.getLogger(__name__)

BUILTIN: dict[str, ToolSpec] = {spec.kind: spec for spec in SPECS}

#: NoETL kinds that talk to outside services: flowtide has no runner for them, a plugin
#: may provide one.
NEEDS_PLUGIN = ("snowflake", "container", "agent", "ducklake", "subscription")


@dataclass(frozen=True)
class Plugin:
    """An installed entry point of the `flowtide.tools` group."""

    kind: str
    #: "module:attribute" of its ToolSpec.
    value: str
    #: The distribution that installed it ("name version"), when known.
    package: str
    entry_point: Any


_lock = threading.Lock()
_plugins: dict[str, Plugin] | None = None
_problems: dict[str, str] = {}
_loaded: dict[str, ToolSpec] = {}


def _package(entry_point: Any) -> str:
    dist = getattr(entry_point, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else "an unknown package"


def _discover() -> dict[str, Plugin]:
    from importlib.metadata import entry_points

    by_kind: dict[str, dict[str, Plugin]] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        # The same distribution may be seen twice on sys.path: one value, one plugin.
        by_kind.setdefault(ep.name, {}).setdefault(
            ep.value, Plugin(ep.name, ep.value, _package(ep), ep)
        )
    found: dict[str, Plugin] = {}
    for kind, offers in by_kind.items():
        if kind in BUILTIN:
            for plugin in offers.values():
                log.warning(
                    "ignored: %s declares tool kind '%s' (%s), which is built in",
                    plugin.package,
                    kind,
                    plugin.value,
                )
        elif len(offers) > 1:
            names = ", ".join(sorted(p.package for p in offers.values()))
            _problems[kind] = (
                f"kind '{kind}' is provided by more than one plugin ({names}): "
                "uninstall all but one"
            )
        else:
            found[kind] = next(iter(offers.values()))
    return found


def plugins() -> dict[str, Plugin]:
    """The installed plugins' kinds (discovered once per process; see `refresh`)."""
    global _plugins
    with _lock:
        if _plugins is None:
            _plugins = _discover()
        return _plugins


def refresh() -> None:
    """Forget what was discovered: the next question lists the entry points again (after
    a plugin was installed in a running process; tests)."""
    global _plugins
    with _lock:
        _plugins = None
        _problems.clear()
        _loaded.clear()


def known_kinds() -> tuple[str, ...]:
    """Every kind a task can use here: the built-in ones, then the plugins' (sorted)."""
    return (*BUILTIN, *sorted(plugins()))


def find(kind: str) -> ToolSpec | None:
    """The spec of `kind`, or None (`why_unknown` says why). A plugin's module is
    imported on its kind's first use."""
    spec = BUILTIN.get(kind) or _loaded.get(kind)
    if spec is not None:
        return spec
    plugin = plugins().get(kind)
    if plugin is None:
        return None
    try:
        loaded = plugin.entry_point.load()
    except Exception as exc:  # noqa: BLE001 - a broken plugin is reported, not raised
        _problems[kind] = (
            f"kind '{kind}' is provided by {plugin.package} ({plugin.value}), which cannot "
            f"be loaded: {type(exc).__name__}: {exc}"
        )
        return None
    if not isinstance(loaded, ToolSpec):
        _problems[kind] = (
            f"kind '{kind}' is provided by {plugin.package}, whose entry point "
            f"{plugin.value} is a {type(loaded).__name__}, not a flowtide.tools.spec.ToolSpec"
        )
        return None
    if loaded.kind != kind:
        _problems[kind] = (
            f"kind '{kind}' is provided by {plugin.package}, whose ToolSpec "
            f"({plugin.value}) declares kind '{loaded.kind}'"
        )
        return None
    with _lock:
        _loaded[kind] = loaded
    return loaded


def why_unknown(kind: str) -> str:
    """Why `find(kind)` gave None, in one line: a plugin is needed, the plugin that
    provides it is broken, or no such kind (with the closest known name)."""
    known = known_kinds()  # discovers the plugins, and their clashes
    if kind in _problems:
        return _problems[kind]
    if kind in NEEDS_PLUGIN:
        return (
            f"kind '{kind}' needs a plugin (pip install a package that provides the "
            f"{ENTRY_POINT_GROUP} entry point '{kind}')"
        )
    return f"unknown tool kind '{kind}'{did_you_mean(kind, (*known, *NEEDS_PLUGIN))}"
