"""Notifications with two servers on one shard: each failed run notifies exactly once
(the delivery is written in the step transaction and leased with SKIP LOCKED), retried
while the target answers 503, recorded as events after the terminal one."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kv"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stubs"))

from natsserver import NatsServer  # noqa: E402
from notify_target import Target, notify_target  # noqa: E402

from .stack import Stack  # noqa: E402

pytestmark = [pytest.mark.postgres, pytest.mark.nats]

FAILING = """\
metadata: {{name: failing, path: tests/distributed/failing}}
notify:
  - on: [failed]
    webhook: {{url: "{url}/hook?key=abc", body: {{id: "{{{{ execution_id }}}}", what: "{{{{ transition }}}}"}}}}
workflow:
  - step: start
    tool: {{kind: python, code: "raise ValueError('boom')"}}
"""


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    with notify_target() as found:
        yield found


@pytest.fixture(scope="module")
def two_servers(
    pg_server: Any, tmp_path_factory: pytest.TempPathFactory, target: Target
) -> Iterator[tuple[Stack, Stack]]:
    root = tmp_path_factory.mktemp("notify")
    db = pg_server.create_database("dist_notify")
    nats = NatsServer.start_secured(root / "nats", pools=("default",))
    settings = {"FLOWTIDE_NOTIFY_ALLOW_HOSTS": "127.0.0.1", "FLOWTIDE_NOTIFY_BACKOFF": "0.3"}
    first = Stack(db=db, nats=nats.url, root=root, nats_users=nats.users, extra_env=settings)
    second: Stack | None = None
    try:
        first.start_server()
        second = Stack(
            db=db,
            nats=nats.url,
            root=root,
            nats_users=nats.users,
            extra_env=settings,
            tokens=dict(first.tokens),
            name="server2",
        )
        second.start_server()
        first.start_worker()
        yield first, second
    finally:
        if second is not None:
            second.stop()
        first.stop()
        nats.stop()
        pg_server.drop_database("dist_notify")


def _events(stack: Stack, eid: str) -> list[dict[str, Any]]:
    return json.loads(stack.run("events", eid, "--json").stdout)  # type: ignore[no-any-return]


def test_each_failed_run_notifies_exactly_once(
    two_servers: tuple[Stack, Stack], target: Target, tmp_path: Path
) -> None:
    first, second = two_servers
    playbook = tmp_path / "failing.yaml"
    playbook.write_text(FAILING.format(url=target.url))
    target.script = [503]
    eids = []
    for stack in (first, second, first, second):
        started = stack.run("execute", playbook)
        assert started.returncode == 0, started.stderr
        eids.append(started.stdout.strip())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        sent = {b["id"] for b in target.bodies() if b.get("what") == "failed"}
        if sent >= set(eids):
            break
        time.sleep(0.2)
    # Longer than a relay pass and a lease hand-over: no second copy turns up.
    time.sleep(3)
    # One delivery per run, plus the attempt the target refused with 503 (retried).
    counts = Counter(b["id"] for b in target.bodies())
    assert set(counts) == set(eids)
    assert sorted(counts.values()) == [1] * (len(eids) - 1) + [2]
    failed = 0
    for eid in eids:
        events = _events(first, eid)
        types = [e["type"] for e in events]
        assert types.index("playbook.failed") < len(types) - 1
        notes = [e for e in events if e["type"].startswith("notification.")]
        assert [e["type"] for e in notes][-1] == "notification.sent"
        assert sum(e["type"] == "notification.sent" for e in notes) == 1
        assert all(e["payload"]["to"] == f"{target.url}/hook" for e in notes)
        failed += sum(e["type"] == "notification.failed" for e in notes)
        status = json.loads(first.run("status", eid, "--json").stdout)
        assert status["status"] == "failed"
        # The execution page's panel: the attempts folded into one delivery, on the
        # server as in `flowtide ui` (tests/cli/test_ui_notifications.py).
        with second.client("reader", timeout=10) as reader:
            summary = reader.get(f"/api/executions/{eid}/summary").json()
        (delivery,) = summary["notifications"]
        assert summary["notifications_owed"] == 0
        assert (delivery["on"], delivery["target"], delivery["status"]) == (
            "failed",
            "webhook",
            "sent",
        )
        assert delivery["to"] == f"{target.url}/hook" and delivery["attempts"] == len(notes)
    assert failed == 1
