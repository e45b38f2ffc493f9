"""The wire contract: every message survives its JSON round trip, reads what the other
side writes, and the module stands between the server and the worker without importing
either."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from flowtide.engine.events import Command
from flowtide.wire import (
    COMMAND_STREAM,
    Claimed,
    ClaimItem,
    ClaimRefused,
    ClaimReply,
    ClaimRequest,
    ExecutionShare,
    Notification,
    Report,
    ReportResult,
    ReportsReply,
    command_filter,
    command_subject,
    pool_consumer,
    read_reports_body,
    reports_body,
    worker_inbox,
)
from flowtide.worker._shares import ShareCache, known_revisions

BIG = 2**62 + 7  # an id a JSON number in a browser would round


def test_names() -> None:
    assert COMMAND_STREAM == "FLOWTIDE_COMMANDS"
    assert command_subject("gpu", BIG) == f"flowtide.commands.gpu.0.{BIG}"
    assert command_subject("gpu", BIG, 3) == f"flowtide.commands.gpu.3.{BIG}"
    assert command_filter("gpu") == "flowtide.commands.gpu.>"
    assert pool_consumer("gpu") == "flowtide-gpu"
    assert worker_inbox("gpu") == "_WORKER_INBOX.gpu"
    for bad in ("a.b", "*", ">", "", "x" * 65):
        with pytest.raises(ValueError):
            pool_consumer(bad)


def test_notification_round_trip_and_the_server_text() -> None:
    note = Notification(BIG, BIG + 1, BIG + 2, 3, "load")
    text = note.to_json()
    assert json.loads(text) == {
        "event_id": str(BIG),
        "execution_id": str(BIG + 1),
        "command_id": str(BIG + 2),
        "attempt": 3,
        "step": "load",
    }
    assert Notification.from_json(text) == note
    assert Notification.from_json(text.encode()) == note
    assert note.claim_item() == ClaimItem(BIG + 1, BIG + 2, BIG)
    command = Command(BIG + 2, BIG + 1, "load", attempt=3, issued_event_id=BIG)
    assert Notification.of(command) == note
    with pytest.raises(ValueError):
        Notification.of(Command(1, 2, "load"))
    # Only the ids are needed to claim.
    assert Notification.from_json(b'{"event_id": 1, "execution_id": "2", "command_id": 3}') == (
        Notification(1, 2, 3)
    )


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"[]",
        b'{"n": 11}',
        b'{"event_id": "1"}',
        b'{"event_id": "x", "execution_id": 1, "command_id": 1}',
        b'{"event_id": null, "execution_id": 1, "command_id": 1}',
    ],
)
def test_an_unreadable_notification_is_a_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        Notification.from_json(data)


def test_claim_request_round_trip() -> None:
    request = ClaimRequest("w-1", [ClaimItem(BIG, BIG + 1, BIG + 2), ClaimItem(1, 2, 3)])
    data = request.to_json()
    assert json.loads(data) == {
        "worker_id": "w-1",
        "claims": [
            {"event_id": BIG + 2, "execution_id": BIG, "command_id": BIG + 1},
            {"event_id": 3, "execution_id": 1, "command_id": 2},
        ],
    }
    assert ClaimRequest.from_json(data) == request


def _reply() -> ClaimReply:
    won = Claimed(
        Command(
            BIG + 2,
            BIG,
            "load",
            attempt=2,
            loop_instance=0,
            loop_index=4,
            issued_event_id=BIG + 9,
        ),
        iterator="item",
        element={"id": 4},
        lease=12.5,
    )
    cursor = Claimed(Command(5, BIG, "scan", issued_event_id=6, extra={"cursor": True}))
    refused = ClaimRefused(409, {"message": "command 7 is claimed by w-2", "holder": "w-2"})
    share = ExecutionShare(
        "apiVersion: noetl.io/v2\n",
        "flows/a.yaml",
        {"workload": {"n": 1}, "results": {"start": {"result": 1, "tasks": None}}, "ctx": {}},
        cancelled=True,
    )
    return ClaimReply([won, refused, cursor], {BIG: share})


def test_claim_reply_round_trip() -> None:
    reply = _reply()
    doc = reply.to_dict()
    # Ids as strings, as everywhere the server writes them.
    assert doc["results"][0]["code"] == 200
    assert doc["results"][0]["command"]["command_id"] == str(BIG + 2)
    assert doc["results"][0]["command"]["execution_id"] == str(BIG)
    assert doc["results"][0]["command"]["issued_event_id"] == str(BIG + 9)
    assert doc["results"][1] == {
        "code": 409,
        "error": {"message": "command 7 is claimed by w-2", "holder": "w-2"},
    }
    assert list(doc["executions"]) == [str(BIG)]
    assert doc["executions"][str(BIG)]["playbook"] == {
        "text": "apiVersion: noetl.io/v2\n",
        "file": "flows/a.yaml",
    }
    back = ClaimReply.from_json(json.dumps(doc).encode())
    assert back == reply


def test_claim_reply_reads_a_refusal_without_details() -> None:
    back = ClaimReply.from_json(b'{"results": [{"code": 503}], "executions": {}}')
    assert back.results == [ClaimRefused(503, {})]
    with pytest.raises(ValueError):
        ClaimReply.from_json(b'{"results": [{"code": 200}], "executions": {}}')


def test_reports_round_trip() -> None:
    events = [{"event_id": BIG, "execution_id": BIG + 1, "type": "command.started"}]
    one = Report(BIG + 1, events)
    two = Report(3, [])
    data = reports_body('w-"1"', [one.to_json(), two.to_json()])
    doc = json.loads(data)
    assert doc["worker_id"] == 'w-"1"'
    assert doc["reports"][0]["execution_id"] == str(BIG + 1)
    assert read_reports_body(data) == ('w-"1"', [one, two])


def test_reports_reply_round_trip() -> None:
    reply = ReportsReply(
        [
            ReportResult(200, accepted=3, duplicates=1, stale=0, status="running"),
            ReportResult(409, stale=1, status="running"),
            ReportResult(503, error={"message": "store unavailable: down"}),
        ]
    )
    back = ReportsReply.from_json(json.dumps(reply.to_dict()))
    assert back == reply
    assert back.results[2].message == "store unavailable: down"
    assert back.results[0].message == ""
    # A reply that says only the code still reads.
    assert ReportsReply.from_json(b'{"results": [{"code": 200}]}').results == [ReportResult(200)]


def test_the_server_takes_what_the_worker_writes() -> None:
    """The server's request models (what its OpenAPI document describes) accept the
    worker's bodies, ids intact."""
    from flowtide.server.schemas import ClaimMany, WorkerReports

    claims = ClaimMany.model_validate_json(ClaimRequest("w", [ClaimItem(BIG, 2, 3)]).to_json())
    assert (claims.claims[0].execution_id, claims.claims[0].event_id) == (BIG, 3)
    event = {
        "event_id": BIG,
        "execution_id": 9,
        "type": "command.completed",
        "command_id": 4,
        "payload": {"attempt": 1},
    }
    body = reports_body("w", [Report(9, [event]).to_json()])
    reports = WorkerReports.model_validate_json(body)
    assert reports.reports[0].execution_id == 9
    assert reports.reports[0].events[0].event_id == BIG


def test_wire_imports_neither_side() -> None:
    code = (
        "import sys, flowtide.wire; "
        "print(sorted(m for m in sys.modules if m.startswith(('flowtide.server', "
        "'flowtide.worker', 'flowtide.runtime'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_the_worker_imports_no_server() -> None:
    """Neither in its source (lazy imports included) nor once loaded."""
    import ast
    from pathlib import Path

    import flowtide.worker

    root = Path(flowtide.worker.__file__).parent
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not name.startswith("flowtide.server"), f"{path.name} imports {name}"
    code = (
        "import sys, flowtide.worker; "
        "print(sorted(m for m in sys.modules if m.startswith('flowtide.server')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def _share(revision: int, cancelled: bool = False) -> ExecutionShare:
    return ExecutionShare(
        "apiVersion: noetl.io/v2\n",
        "flows/a.yaml",
        {"workload": {}, "results": {"start": {"result": list(range(50)), "tasks": None}}},
        cancelled,
        revision,
    )


def test_a_held_share_is_sent_without_playbook_or_context() -> None:
    whole = _share(BIG + 5)
    reply = ClaimReply([], {BIG: whole.as_held()})
    doc = json.loads(json.dumps(reply.to_dict()))
    assert doc["executions"][str(BIG)] == {
        "revision": str(BIG + 5),
        "held": True,
        "cancelled": False,
    }
    back = ClaimReply.from_json(json.dumps(doc))
    assert back.executions[BIG].held and back.executions[BIG].revision == BIG + 5
    # A whole share says its revision too.
    assert ExecutionShare.from_dict(json.loads(json.dumps(whole.to_dict()))) == whole


def test_the_worker_fills_a_held_share_from_the_one_it_named() -> None:
    cache = ShareCache()
    assert cache.known([BIG]) == {}
    first = cache.resolve({BIG: _share(10)}, {})
    assert first[BIG].context["results"]["start"]["result"] == list(range(50))
    kept = cache.known([BIG, 3])
    assert known_revisions(kept) == {str(BIG): "10"}
    # The server has the same revision: only the flag comes, the rest is the worker's.
    again = cache.resolve({BIG: _share(10, cancelled=True).as_held()}, kept)
    assert again[BIG].cancelled and again[BIG].context == first[BIG].context
    assert again[BIG].playbook_file == "flows/a.yaml" and not again[BIG].held
    # A newer revision replaces it.
    cache.resolve({BIG: _share(11)}, kept)
    assert cache.known([BIG])[BIG].revision == 11
    # A held share of a revision the request did not name cannot be filled.
    with pytest.raises(ValueError, match="revision 12"):
        cache.resolve({BIG: _share(12).as_held()}, cache.known([BIG]))


def test_the_share_cache_keeps_the_most_recently_used() -> None:
    cache = ShareCache(size=2)
    for eid in (1, 2, 3):
        cache.resolve({eid: _share(eid)}, {})
    assert set(cache.known([1, 2, 3])) == {2, 3}
    # Revision 0 (a server that does not number them) is never named.
    cache.resolve({4: _share(0)}, {})
    assert set(cache.known([4])) == set()


def test_requests_name_the_revisions_the_worker_holds() -> None:
    request = ClaimRequest("w-1", [ClaimItem(BIG, 2, 3)], {str(BIG): "10"})
    assert ClaimRequest.from_json(request.to_json()) == request
    assert "known" not in json.loads(ClaimRequest("w-1", []).to_json())
    body = json.loads(reports_body("w-1", [Report(BIG, []).to_json()], {str(BIG): "10"}))
    assert body["known"] == {str(BIG): "10"}
    assert "known" not in json.loads(reports_body("w-1", [Report(BIG, []).to_json()]))


@pytest.mark.parametrize("pool", ["gpu\n", "gpu\r\nPUB x 1", "gpu.x", "gpu*", ">", "", "é"])
def test_a_pool_name_that_would_change_a_subject_is_refused(pool: str) -> None:
    # `$` in a pattern also matches before a final newline: "gpu\n" once passed, and a
    # newline in a subject is a new line of the NATS protocol.
    from flowtide.wire import command_filter, log_subject, worker_inbox

    for subject in (lambda: log_subject(pool, 1, 2), lambda: command_filter(pool)):
        with pytest.raises(ValueError, match="invalid pool name"):
            subject()
    with pytest.raises(ValueError, match="invalid pool name"):
        worker_inbox(pool)
