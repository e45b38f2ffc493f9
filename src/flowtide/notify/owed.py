"""Which deliveries the events of one step owe (pure: the runtime writes them in the
step's transaction)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from flowtide.engine import events as ev
from flowtide.engine.events import Event
from flowtide.engine.state import ExecutionState
from flowtide.playbook.notify import NotifyTarget
from flowtide.redaction import mask_value
from flowtide.store.notifications import PendingNotification

__all__ = ["DOC_KIND", "owed", "transition_of"]

#: The `kind` of a notification document: a playbook started with one as its workload
#: gets the playbook's own `notify:` only, never the server's default again (no loop).
DOC_KIND: Final = "flowtide.notification"

#: A workload larger than this (JSON) is left out of the document (`workload: null`).
MAX_WORKLOAD_BYTES: Final = 16 * 1024

_TERMINAL: Final = {
    ev.PLAYBOOK_COMPLETED: "completed",
    ev.PLAYBOOK_FAILED: "failed",
    ev.PLAYBOOK_CANCELLED: "cancelled",
    ev.EXECUTION_DEADLINE_MISSED: "deadline_missed",
}


def transition_of(event: Event) -> str | None:
    """The transition `event` records (one of `NOTIFY_ON`), or None."""
    name = _TERMINAL.get(event.type)
    if name in ("failed", "cancelled") and (event.error or {}).get("kind") == "interrupted":
        return "interrupted"
    return name


def _workload(workload: dict[str, Any]) -> dict[str, Any] | None:
    """The run's workload for the templates (`{{ workload.day }}`), or None past
    `MAX_WORKLOAD_BYTES` of JSON: a notification is a message, not a copy of the input."""
    try:
        size = len(json.dumps(workload, default=str))
    except (TypeError, ValueError):
        return None
    return workload if size <= MAX_WORKLOAD_BYTES else None


def _document(state: ExecutionState, event: Event, transition: str) -> dict[str, Any]:
    playbook = state.playbook
    doc: dict[str, Any] = {
        "kind": DOC_KIND,
        "execution_id": str(state.execution_id),
        "playbook": {
            "name": playbook.name,
            "path": playbook.path,
            "version": playbook.version,
            "file": playbook.file,
        },
        "transition": transition,
        "status": state.status,
        "error": event.error if event.error is not None else state.error,
        "time": event.time,
        "workload": _workload(state.workload),
    }
    if transition == "deadline_missed":
        doc["deadline"] = dict(ev.payload_of(event, ev.EXECUTION_DEADLINE_MISSED))
    if state.parent_execution_id is not None:
        doc["parent_execution_id"] = str(state.parent_execution_id)
    return doc


def owed(
    states: Mapping[int, ExecutionState],
    events: Sequence[Event],
    defaults: Sequence[NotifyTarget] = (),
) -> list[PendingNotification]:
    """The deliveries `events` (what one step recorded, in order) owe: one per target of
    the playbook's `notify:` and of `defaults` whose `on` names the transition. The
    defaults apply to top-level runs that a notification did not start. Each document is
    masked with its execution's secret set as the step left it."""
    out: list[PendingNotification] = []
    for event in events:
        transition = _TERMINAL.get(event.type) and transition_of(event)
        if transition is None:
            continue
        state = states.get(event.execution_id)
        if state is None:
            continue
        targets = list(state.playbook.notify)
        targets += [NotifyTarget.from_json(t) for t in state.trigger_notify]
        if state.parent_execution_id is None and state.workload.get("kind") != DOC_KIND:
            targets.extend(defaults)
        chosen = [t for t in targets if transition in t.on]
        if not chosen:
            continue
        doc = mask_value(_document(state, event, transition), state.secrets)
        out.extend(
            PendingNotification(
                execution_id=state.execution_id,
                event_id=event.event_id,
                on=transition,
                target=t.to_json(),
                doc=doc,
                created=event.time,
            )
            for t in chosen
        )
    return out
