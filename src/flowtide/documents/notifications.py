"""An execution's notification deliveries, as its page shows them: one row per target of
each transition it reported (failed, completed, deadline_missed...), folded from the
`notification.sent` / `notification.failed` events of its attempts: the last outcome,
how many attempts, the latest error and when it is tried again.

The events come after the transition (a kept summary of an ended run predates them), so
they are read apart from the summary's kept part, with the run's secret set: nothing shown
holds a secret, a URL's user, password, query string or a token in its path."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from typing_extensions import TypedDict

from flowtide.engine import events as ev
from flowtide.engine.events import Event
from flowtide.engine.state import secret_values
from flowtide.redaction import mask_text, masked_url
from flowtide.store.base import Store

__all__ = [
    "NOTIFICATION_EVENTS",
    "ExecutionNotifications",
    "NotificationDelivery",
    "deliveries_of",
    "notifications_of",
]

#: The events a delivery is folded from.
NOTIFICATION_EVENTS: Final = (ev.NOTIFICATION_SENT, ev.NOTIFICATION_FAILED)
#: The newest attempts read (a run notifies a handful of targets on a few transitions).
ATTEMPTS_READ: Final = 500


class NotificationDelivery(TypedDict):
    """One target of one transition: its attempts folded."""

    #: The transition reported: completed | failed | cancelled | deadline_missed | interrupted.
    on: str
    #: webhook | slack | email | playbook
    target: str
    #: The target masked: a URL's scheme, host, port and path (tokens as `…`); an email's
    #: recipients; a playbook's path.
    to: str
    #: sent | retrying (a failed attempt is tried again at `retry_at`) | failed (given up).
    status: str
    attempts: int
    #: The HTTP status of the latest attempt (webhook, slack).
    status_code: int | None
    #: Why the latest failed attempt failed (masked).
    error: str | None
    retry_at: float | None
    #: The execution a `playbook` target started.
    started_execution_id: str | None
    #: When the first and the latest attempt were made.
    first: float
    time: float


def _shown_to(target: str, to: str, secrets: frozenset[str]) -> str:
    # Events before `masked_url` kept a Slack path (its secret) or a token segment.
    if target in ("webhook", "slack") and "://" in to:
        to = masked_url(to, path=target != "slack")
    return mask_text(to, secrets)


def deliveries_of(events: Iterable[Event]) -> list[NotificationDelivery]:
    """The deliveries of an execution's `notification.*` and `secrets.added` events (in
    log order), oldest first. Attempts of one target of one transition (the transition's
    event, the target and where it goes) are one delivery."""
    events = list(events)
    secrets = frozenset().union(*(secret_values(e) for e in events if e.type == ev.SECRETS_ADDED))
    found: dict[tuple[int | None, str, str], NotificationDelivery] = {}
    for event in events:
        if event.type not in NOTIFICATION_EVENTS:
            continue
        note = ev.payload_of(event, ev.NOTIFICATION_SENT)
        target = str(note.get("target") or "?")
        to = str(note.get("to") or "")
        key = (event.parent_event_id, target, to)
        sent = event.type == ev.NOTIFICATION_SENT
        retry_at = note.get("retry_at")
        started = note.get("started_execution_id")
        error = note.get("error")
        before = found.get(key)
        found[key] = {
            "on": str(note.get("on") or "?"),
            "target": target,
            "to": _shown_to(target, to, secrets),
            "status": "sent" if sent else ("retrying" if retry_at is not None else "failed"),
            "attempts": max(int(note.get("attempt") or 1), before["attempts"] + 1 if before else 1),
            "status_code": note.get("status_code"),
            "error": None if sent or error is None else mask_text(str(error), secrets)[:2000],
            "retry_at": None if sent else retry_at,
            "started_execution_id": None if started is None else str(started),
            "first": before["first"] if before else event.time,
            "time": event.time,
        }
    return sorted(found.values(), key=lambda d: d["first"])


class ExecutionNotifications(TypedDict):
    deliveries: list[NotificationDelivery]
    #: Deliveries not settled yet (never tried, or to be tried again): a page showing
    #: an ended run reads it again while some are owed.
    owed: int


def notifications_of(store: Store, execution_id: int) -> ExecutionNotifications:
    """`deliveries_of` an execution's log (its newest attempts) and how many are owed.
    Blocks on the store: run it in a thread.

    Raises:
        StoreError: the store failed.
    """
    secrets = store.events(execution_id, types=[ev.SECRETS_ADDED])
    attempts = store.events(
        execution_id, types=NOTIFICATION_EVENTS, limit=ATTEMPTS_READ, newest=True
    )
    return {
        "deliveries": deliveries_of([*secrets, *attempts]),
        "owed": store.pending_notifications([execution_id]),
    }
