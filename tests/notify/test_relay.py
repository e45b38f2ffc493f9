"""The relay and what a step owes, with an injected clock and a sender that answers as
told: bounded attempts with exponential backoff, one row per target and transition, the
`deadline_missed` event, defaults only for top-level runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowtide.engine import events as ev
from flowtide.engine.events import Event
from flowtide.engine.state import fold
from flowtide.notify.owed import owed, transition_of
from flowtide.notify.relay import NotificationRelay, backoff_delay
from flowtide.notify.ssrf import TargetPolicy
from flowtide.notify.targets import Attempt, Sender
from flowtide.playbook.loader import parse_playbook
from flowtide.playbook.notify import NotifyTarget
from flowtide.store.sqlite import SQLiteStore

PLAYBOOK = """\
metadata: {name: p, path: tests/p}
notify:
  - on: [failed, deadline_missed]
    webhook: {url: "https://hooks.example.org/x?token=t"}
workflow:
  - step: start
    tool: {kind: noop}
"""


def _events(eid: int, *extra: Event) -> list[Event]:
    init: ev.InitializedPayload = {
        "workload": {},
        "playbook": {"name": "p", "path": "tests/p", "version": None, "file": None},
        "parent_execution_id": None,
        "parent_command_id": None,
    }
    secret: ev.SecretsAddedPayload = {"values": ["s3cr3t-value-long-enough"]}
    return [
        Event(1, eid, ev.PLAYBOOK_INITIALIZED, payload=init, time=100.0),
        Event(2, eid, ev.SECRETS_ADDED, payload=secret, time=100.5),
        *extra,
    ]


def test_what_a_step_owes() -> None:
    playbook = parse_playbook(PLAYBOOK)
    missed: ev.DeadlineMissedPayload = {
        "kind": "sla",
        "deadline": 160.0,
        "limit": 60,
        "elapsed": 61,
    }
    deadline = Event(3, 7, ev.EXECUTION_DEADLINE_MISSED, payload=missed, time=161.0)
    failed = Event(
        4,
        7,
        ev.PLAYBOOK_FAILED,
        status="failed",
        error={"kind": "python_error", "message": "token s3cr3t-value-long-enough"},
        time=170.0,
    )
    state = fold(playbook, 7, _events(7, deadline, failed))
    default = NotifyTarget(("failed", "completed"), "slack", {"url": "https://s.example.org/"})
    rows = owed({7: state}, [deadline, failed], [default])
    assert [(r.on, r.target["kind"]) for r in rows] == [
        ("deadline_missed", "webhook"),
        ("failed", "webhook"),
        ("failed", "slack"),
    ]
    assert rows[0].doc["deadline"]["kind"] == "sla"
    assert rows[1].doc["error"]["message"] == "token ***"
    assert transition_of(Event(5, 7, ev.PLAYBOOK_CANCELLED, error={"kind": "interrupted"})) == (
        "interrupted"
    )
    # A sub-playbook's run gets its own notify only, never the server's default.
    state.parent_execution_id = 1
    assert [r.target["kind"] for r in owed({7: state}, [failed], [default])] == ["webhook"]


class Scripted(Sender):
    def __init__(self, answers: list[Attempt]) -> None:
        super().__init__(TargetPolicy())
        self.answers = answers
        self.docs: list[Any] = []

    def send(self, kind: str, config: Any, doc: Any) -> Attempt:
        self.docs.append(doc)
        return self.answers.pop(0) if self.answers else Attempt(False, 503, "HTTP 503")


def _store_with_owed(tmp_path: Path) -> tuple[SQLiteStore, int]:
    store = SQLiteStore(tmp_path / "f.db")
    store.create_execution(
        7,
        playbook_path="tests/p",
        playbook_version=None,
        playbook_file=None,
        playbook_text=PLAYBOOK,
        workload={},
        created=100.0,
    )
    failed = Event(3, 7, ev.PLAYBOOK_FAILED, status="failed", error={"kind": "x"}, time=130.0)
    events = _events(7, failed)
    state = fold(parse_playbook(PLAYBOOK), 7, events)
    rows = owed({7: state}, events)
    store.append(events, secrets={7: state.secrets}, notifications=rows)
    return store, len(rows)


def test_bounded_attempts_with_exponential_backoff(tmp_path: Path) -> None:
    store, count = _store_with_owed(tmp_path)
    assert count == 1
    now = [200.0]
    ids = iter(range(1000, 2000))
    relay = NotificationRelay(
        store,
        Scripted([]),
        lambda: next(ids),
        attempts=4,
        backoff=10,
        max_backoff=25,
        clock=lambda: now[0],
    )
    times = []
    for _ in range(20):
        if relay.run_once():
            times.append(now[0])
        now[0] += 5
    # Attempts at 200, then 10, 20 and 25 (capped) seconds after each failure.
    assert times == [200.0, 210.0, 230.0, 255.0]
    notes = store.events(7, types=[ev.NOTIFICATION_FAILED])
    assert [e.payload["attempt"] for e in notes] == [1, 2, 3, 4]
    assert "retry_at" not in notes[-1].payload and notes[0].payload["retry_at"] == 210.0
    assert notes[0].payload["to"] == "https://hooks.example.org/x"
    assert store.pending_notifications() == 0
    assert store.get_execution(7).status != "completed"
    assert backoff_delay(1, 10, 300) == 10 and backoff_delay(6, 10, 300) == 300


def test_a_sent_delivery_is_settled_once_and_documented(tmp_path: Path) -> None:
    store, _ = _store_with_owed(tmp_path)
    sender = Scripted([Attempt(True, 200)])
    relay = NotificationRelay(store, sender, lambda: 999, public_url="https://ui.example.org/")
    assert relay.run_once() == 1 and relay.run_once() == 0
    (doc,) = sender.docs
    assert doc["link"] == "https://ui.example.org/ui/executions/7"
    assert doc["started"] == 100.0 and doc["duration"] == 30.0 and doc["ended"] == 130.0
    (sent,) = store.events(7, types=[ev.NOTIFICATION_SENT])
    assert sent.payload["status_code"] == 200 and sent.parent_event_id == 3
