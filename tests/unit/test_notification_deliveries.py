"""An execution's notification deliveries as its page shows them
(`flowtide.documents.notifications`): attempts of one target of one transition fold into
one delivery; nothing shown holds a secret, a URL's credentials, query or path token."""

from __future__ import annotations

from typing import Any

from flowtide.documents.notifications import deliveries_of
from flowtide.engine import events as ev
from flowtide.engine.events import Event
from flowtide.redaction import masked_url

SECRET = "s3cr3t-value-0f-the-run"
SLACK_TOKEN = "Xy7AbCdEfGhIjKlMnOpQrStU"


def _attempt(
    event_id: int, transition_event: int, at: float, *, sent: bool, **payload: Any
) -> Event:
    return Event(
        event_id=event_id,
        execution_id=1,
        type=ev.NOTIFICATION_SENT if sent else ev.NOTIFICATION_FAILED,
        status="sent" if sent else "failed",
        payload=payload,  # type: ignore[arg-type]
        parent_event_id=transition_event,
        time=at,
    )


def test_attempts_fold_into_deliveries_by_transition_and_target() -> None:
    hook = {"on": "failed", "target": "webhook", "to": "https://ops.example.org/hook"}
    slack = {
        "on": "failed",
        "target": "slack",
        # An event written before `masked_url`: the Slack path (its secret) is in it.
        "to": f"https://hooks.slack.com/services/T0AB/B0CD/{SLACK_TOKEN}",
    }
    late = {"on": "deadline_missed", "target": "email", "to": f"ops@example.org via {SECRET}:587"}
    events = [
        _attempt(20, 9, 100.0, sent=False, attempt=1, **late, error="refused", retry_at=160.0),
        _attempt(21, 10, 200.0, sent=False, attempt=1, status_code=503, retry_at=210.0, **hook),
        _attempt(22, 10, 200.5, sent=False, attempt=1, error=f"HTTP 404 for {SECRET}", **slack),
        _attempt(23, 10, 210.0, sent=False, attempt=2, status_code=503, retry_at=230.0, **hook),
        Event(event_id=5, execution_id=1, type=ev.SECRETS_ADDED, payload={"values": [SECRET]}),
        _attempt(24, 10, 230.0, sent=True, attempt=3, status_code=200, **hook),
    ]
    late_one, hooked, slacked = deliveries_of(events)
    assert late_one["on"] == "deadline_missed" and late_one["status"] == "retrying"
    assert late_one["retry_at"] == 160.0 and late_one["attempts"] == 1
    assert late_one["to"] == "ops@example.org via ***:587"
    assert hooked == {
        "on": "failed",
        "target": "webhook",
        "to": "https://ops.example.org/hook",
        "status": "sent",
        "attempts": 3,
        "status_code": 200,
        "error": None,
        "retry_at": None,
        "started_execution_id": None,
        "first": 200.0,
        "time": 230.0,
    }
    assert slacked["status"] == "failed" and slacked["attempts"] == 1
    assert slacked["to"] == "https://hooks.slack.com/services/…"
    assert slacked["error"] == "HTTP 404 for ***"
    shown = repr(deliveries_of(events))
    assert SECRET not in shown and SLACK_TOKEN not in shown


def test_a_playbook_target_says_what_it_started() -> None:
    (one,) = deliveries_of(
        [
            _attempt(
                3,
                2,
                5.0,
                sent=True,
                on="completed",
                target="playbook",
                to="ops/page v2",
                attempt=1,
                started_execution_id=77,
            )  # fmt: skip
        ]
    )
    assert one["status"] == "sent" and one["started_execution_id"] == "77"
    assert one["to"] == "ops/page v2"
    assert deliveries_of([]) == []


def test_a_url_is_shown_without_credentials_query_or_a_token_in_its_path() -> None:
    assert masked_url("https://u:pw@h.example.org:8443/a/b?token=t#f") == (
        "https://h.example.org:8443/a/b"
    )
    assert masked_url("https://discord.com/api/webhooks/1234/AbCdEf0123456789xyz") == (
        "https://discord.com/api/webhooks/1234/…"
    )
    # Words stay readable; Slack keeps only its first segment.
    assert masked_url("https://x.org/notifications-endpoint-for-ops") == (
        "https://x.org/notifications-endpoint-for-ops"
    )
    assert masked_url("https://hooks.slack.com/services/T0/B0/xyz", path=False) == (
        "https://hooks.slack.com/services/…"
    )
    assert masked_url("https://hooks.example.org/x", path=False) == "https://hooks.example.org/x"
    assert masked_url("http://[::1") == "(an invalid URL)"
