"""Where a subscription's messages come from: the `Source` port, what it hands the
listener (`Delivery`), and the sources this process knows by name: `nats` built in
(`flowtide.triggers.natssource`), others from installed plugins (entry point group
`flowtide.sources`, like tool kinds; `examples/plugin/` has one).

A plugin's entry point names a factory `(spec, credentials) -> Source`: `spec` is the
`SubscriptionSpec` (its `config` holds the source's own fields), `credentials(alias)`
the body of a credential of the process that listens (raises CredentialError).

The port a source implements (`Source`, `Delivery`) is `flowtide.triggers.source`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from flowtide.errors import TriggerError

if TYPE_CHECKING:
    from flowtide.triggers.source import Source
    from flowtide.triggers.subscription import SubscriptionSpec

__all__ = [
    "ENTRY_POINT_GROUP",
    "SourceFactory",
    "factory",
    "known_sources",
    "open_source",
    "refresh",
]

log = logging.getLogger("flowtide.subscriptions")

ENTRY_POINT_GROUP: Final = "flowtide.sources"
BUILTIN: Final = ("nats",)


SourceFactory = Callable[["SubscriptionSpec", Callable[[str], dict[str, Any]]], "Source"]

_lock = threading.Lock()
_plugins: dict[str, Any] | None = None


def _discover() -> dict[str, Any]:
    from importlib.metadata import entry_points

    found: dict[str, Any] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in BUILTIN:
            log.warning("ignored: source %r (%s) is built in", ep.name, ep.value)
            continue
        found.setdefault(ep.name, ep)
    return found


def _entry_points() -> dict[str, Any]:
    global _plugins
    with _lock:
        if _plugins is None:
            _plugins = _discover()
        return _plugins


def refresh() -> None:
    """Forget the discovered plugins (tests; a plugin installed in a running process)."""
    global _plugins
    with _lock:
        _plugins = None


def known_sources() -> tuple[str, ...]:
    """Every source name a subscription may use here: built in, then plugins'."""
    return (*BUILTIN, *sorted(_entry_points()))


def factory(name: str) -> SourceFactory:
    """The factory of source `name`. Raises TriggerError (unknown, or a plugin that does
    not load)."""
    if name == "nats":
        from flowtide.triggers.natssource import NatsSource

        return NatsSource
    ep = _entry_points().get(name)
    if ep is None:
        raise TriggerError(
            f"no source {name!r} here (known: {', '.join(known_sources())}); a plugin"
            f" provides one through the entry point group {ENTRY_POINT_GROUP!r}",
            field="source",
            kind="subscription",
        )
    try:
        loaded = ep.load()
    except Exception as exc:  # noqa: BLE001 - a broken plugin is the plugin's error
        raise TriggerError(
            f"source {name!r} ({ep.value}) does not load: {exc}",
            field="source",
            kind="subscription",
        ) from None
    if not callable(loaded):
        raise TriggerError(
            f"source {name!r} ({ep.value}) is not a factory", field="source", kind="subscription"
        )
    result: SourceFactory = loaded
    return result


def open_source(spec: SubscriptionSpec, credentials: Callable[[str], dict[str, Any]]) -> Source:
    """A source for `spec` (not opened yet). Raises TriggerError."""
    return factory(spec.source)(spec, credentials)
