"""Schedules as stored resources: one defined from fields (the CLI's flags, an API body)
or from a `kind: Schedule` document, its playbook checked against where it will run, and
stored (`Store.put_trigger`). Blocking (store calls): run it in a thread from async code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowtide.errors import NotFoundError, TriggerError
from flowtide.triggers.spec import ScheduleSpec, schedule_from_document, spec_to_json
from flowtide.triggers.targets import playbook_ref

if TYPE_CHECKING:
    from flowtide.store.base import Store
    from flowtide.store.triggers import TriggerRow

__all__ = ["define_schedule", "notify_targets", "schedule_from_fields"]


def schedule_from_fields(name: str, fields: Mapping[str, Any]) -> ScheduleSpec:
    """A schedule named `name` from its fields (None values left out), read exactly as a
    `kind: Schedule` document's `spec:` is. Raises TriggerError naming the field."""
    spec = {k: v for k, v in fields.items() if v is not None and k != "description"}
    if "version" in spec:
        # A document names a version inside `playbook:`; the flags and the API beside it.
        spec["playbook"] = {"path": spec.get("playbook"), "version": spec.pop("version")}
    metadata: dict[str, Any] = {"name": name}
    if fields.get("description"):
        metadata["description"] = fields["description"]
    return schedule_from_document({"kind": "Schedule", "metadata": metadata, "spec": spec})


def resolve_playbook(
    store: Store, spec: ScheduleSpec, *, local: bool, base: Path | None = None
) -> ScheduleSpec:
    """The schedule with its playbook as it will be found when it fires: a local file by
    its absolute path, a catalog path that the catalog has (in the version named).

    Raises:
        TriggerError: a file named for a server, a missing file, a catalog path or
            version the catalog does not have.
    """
    ref = playbook_ref(spec.playbook, version=spec.version, local=local, base=base)
    if "file" in ref:
        return replace(spec, playbook=str(ref["file"]))
    try:
        store.get_playbook(spec.playbook, spec.version)
    except NotFoundError:
        what = f"{spec.playbook!r} version {spec.version}" if spec.version else repr(spec.playbook)
        hint = "" if local else " (register it with `flowtide catalog register`)"
        raise TriggerError(
            f"no playbook {what} in the catalog{hint}", name=spec.name, field="playbook"
        ) from None
    return spec


def notify_targets(spec: ScheduleSpec) -> list[dict[str, Any]]:
    """The schedule's `notify:` entries as the targets its runs add to their playbook's
    (`NotifyTarget.to_json`). Raises TriggerError naming the entry at fault."""
    from flowtide.playbook.notify import parse_notify

    problems: list[str] = []

    def report(at: tuple[str | int, ...], message: str, field: str, expected: str | None) -> None:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in at)
        problems.append(
            f"notify{where}: {message}" + (f" (expected {expected})" if expected else "")
        )

    targets = parse_notify(list(spec.notify), report) if spec.notify else ()
    if problems:
        raise TriggerError("; ".join(problems), name=spec.name, field="notify")
    return [t.to_json() for t in targets]


def define_schedule(
    store: Store,
    spec: ScheduleSpec,
    *,
    new_id: Callable[[], int],
    now: float,
    local: bool,
    replace_existing: bool = True,
    base: Path | None = None,
) -> TriggerRow:
    """Check and store a schedule; one of that name is replaced when `replace_existing`
    (keeping its firings), else refused.

    Raises:
        TriggerError: the playbook cannot be found, or the name is taken.
    """
    spec = resolve_playbook(store, spec, local=local, base=base)
    notify_targets(spec)
    if not replace_existing:
        try:
            store.get_trigger("schedule", spec.name)
        except NotFoundError:
            pass
        else:
            raise TriggerError(
                "a schedule of this name exists: replace it (--replace, or `replace` in"
                " the API) or delete it first",
                name=spec.name,
                field="name",
            )
    return store.put_trigger(
        "schedule",
        spec.name,
        spec_to_json(spec),
        trigger_id=new_id(),
        now=now,
        paused=spec.paused,
    )
