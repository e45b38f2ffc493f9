"""Subscriptions as stored resources: one defined from fields (the CLI's flags, an API
body) or from a `kind: Subscription` document, its playbook and source checked against
where it will run, and stored (`Store.put_trigger`). Blocking (store calls): run it in a
thread from async code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowtide.errors import NotFoundError, TriggerError
from flowtide.triggers.sources import known_sources
from flowtide.triggers.subscription import (
    SubscriptionSpec,
    subscription_from_document,
    subscription_to_json,
)
from flowtide.triggers.targets import playbook_ref

if TYPE_CHECKING:
    from flowtide.store.base import Store
    from flowtide.store.triggers import TriggerRow

__all__ = ["define_subscription", "subscription_from_fields"]

KIND = "subscription"


def subscription_from_fields(name: str, fields: Mapping[str, Any]) -> SubscriptionSpec:
    """A subscription named `name` from its fields (None values left out), read exactly
    as a `kind: Subscription` document's `spec:` is. Raises TriggerError."""
    spec = {k: v for k, v in fields.items() if v is not None and k != "description"}
    metadata: dict[str, Any] = {"name": name}
    if fields.get("description"):
        metadata["description"] = fields["description"]
    return subscription_from_document({"kind": "Subscription", "metadata": metadata, "spec": spec})


def define_subscription(
    store: Store,
    spec: SubscriptionSpec,
    *,
    new_id: Callable[[], int],
    now: float,
    local: bool,
    replace_existing: bool = True,
    base: Path | None = None,
) -> TriggerRow:
    """Check and store a subscription; one of that name is replaced when
    `replace_existing` (keeping its firings: a message that started a run does not start
    another), else refused.

    Raises:
        TriggerError: an unknown source, a playbook that cannot be found, or the name is
            taken.
    """
    if spec.source not in known_sources():
        raise TriggerError(
            f"no source {spec.source!r} here (known: {', '.join(known_sources())})",
            name=spec.name,
            field="source",
            kind=KIND,
        )
    try:
        ref = playbook_ref(spec.playbook, version=spec.version, local=local, base=base)
    except TriggerError as exc:
        raise TriggerError(exc.message, name=spec.name, field=exc.field, kind=KIND) from None
    if "file" in ref:
        spec = replace(spec, playbook=str(ref["file"]))
    else:
        try:
            store.get_playbook(spec.playbook, spec.version)
        except NotFoundError:
            what = (
                f"{spec.playbook!r} version {spec.version}" if spec.version else repr(spec.playbook)
            )
            hint = "" if local else " (register it with `flowtide catalog register`)"
            raise TriggerError(
                f"no playbook {what} in the catalog{hint}",
                name=spec.name,
                field="playbook",
                kind=KIND,
            ) from None
    if not replace_existing:
        try:
            store.get_trigger(KIND, spec.name)
        except NotFoundError:
            pass
        else:
            raise TriggerError(
                "a subscription of this name exists (delete it first, or replace it)",
                name=spec.name,
                field="name",
                kind=KIND,
            )
    return store.put_trigger(
        KIND,
        spec.name,
        subscription_to_json(spec),
        trigger_id=new_id(),
        now=now,
        paused=spec.paused,
    )
