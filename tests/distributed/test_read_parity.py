"""The server and `flowtide ui` answer the executions API from the same code: the same
playbook, started through `POST /api/execute` of each (run distributed by the server's
workers; embedded, in the `flowtide ui` process), read through the same routes (the
server over PostgreSQL, `flowtide ui` over its SQLite file), gives the same documents:
the same shape everywhere, and the same values where they do not depend on where the run
ran (ids, times and workers do)."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.helpers import Flowtide, local_ui

from .stack import Stack
from .test_faults import _wait

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: parity, path: tests/parity}
workload: {count: 4}
workflow:
  - step: start
    tool:
      kind: python
      input: {count: "{{ count }}"}
      code: |
        result = {"items": list(range(count)), "total": count}
    next:
      - {step: each}
  - step: each
    loop: {in: "{{ start.items }}", iterator: n, spec: {mode: parallel, max_in_flight: 2}}
    tool:
      kind: python
      input: {n: "{{ n }}"}
      code: |
        result = {"square": n * n}
    next:
      spec: {mode: exclusive}
      arcs:
        - {step: big, when: "{{ start.total > 100 }}"}
        - {step: end}
  - step: big
    tool: {kind: python, code: "result = 'never'"}
    next: [{step: end}]
  - step: end
    tool:
      kind: python
      input: {squares: "{{ each.results }}"}
      code: |
        result = {"sum": sum(s["square"] for s in squares)}
"""

#: Events only a distributed run has: a worker claims its commands from the server.
DISTRIBUTED_ONLY = {"command.claimed", "command.heartbeat"}
#: Values that depend on where and when a run ran, not on what it did.
VARYING = {
    "execution_id",
    "event_id",
    "parent_event_id",
    "command_id",
    "worker_id",
    "created",
    "updated",
    "ended",
    "started",
    "duration",
    "duration_ms",
    "issued",
    "time",
    "start",
    "end",
    "width",
    "completed",
    "failed",
    "meta",
}


@pytest.fixture(scope="module")
def server_run(stack: Stack) -> Iterator[tuple[httpx.Client, str]]:
    with stack.client() as client:
        r = client.post("/api/execute", json={"playbook": PLAYBOOK})
        assert r.status_code == 201, r.text
        eid = r.json()["execution_id"]
        assert _wait(client, eid)["status"] == "completed"
        yield client, eid


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, str]]:
    root = Path(tmp_path_factory.mktemp("parity"))
    ft = Flowtide(root / "home", root)
    with local_ui(ft, root / "ui.log") as ui:
        eid = ui.start(PLAYBOOK)
        assert _wait(ui.api, eid)["status"] == "completed"
        yield ui.api, eid


def _shape(value: Any) -> Any:
    """The keys of every mapping in `value`, nested (list items: the union of theirs)."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        shapes = [_shape(v) for v in value if isinstance(v, dict | list)]
        return shapes[:1]
    return type(value).__name__ if value is not None else None


def _same_shape(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        assert set(a) == set(b), f"{where}: {sorted(set(a) ^ set(b))}"
        for k in a:
            _same_shape(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        for x, y in zip(a, b, strict=False):
            _same_shape(x, y, f"{where}[]")


def _stable(value: Any) -> Any:
    """`value` without what depends on where and when the run ran."""
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in VARYING}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def _get(run: tuple[httpx.Client, str], path: str, **params: Any) -> Any:
    client, eid = run
    r = client.get(path.format(eid=eid), params=params)
    assert r.status_code == 200, (path, r.text)
    return r.json()


ROUTES = [
    "/api/executions/{eid}",
    "/api/executions/{eid}/summary",
    "/api/executions/{eid}/steps/start",
    "/api/executions/{eid}/steps/each",
    "/api/executions/{eid}/steps/big",
    "/api/executions/{eid}/steps/end",
]


@pytest.mark.parametrize("path", ROUTES)
def test_a_document_is_the_same_from_either_app(
    server_run: tuple[httpx.Client, str], local_run: tuple[httpx.Client, str], path: str
) -> None:
    there, here = _get(server_run, path), _get(local_run, path)
    if path.endswith("/summary"):
        # `flowtide ui` says whether it runs the execution itself (a server runs none).
        assert here.pop("run_here") is False and "run_here" not in there
    _same_shape(there, here, path)
    assert _stable(there) == _stable(here)


def test_the_summary_says_what_ran(server_run: tuple[httpx.Client, str]) -> None:
    # (What the other tests compare is worth comparing.)
    doc = _get(server_run, "/api/executions/{eid}/summary")
    assert doc["steps"]["each"]["loop"]["done"] == 4
    assert doc["steps"]["big"]["status"] == "pending"
    assert {"from": "each", "to": "end", "count": 1} in doc["taken"]
    assert _get(server_run, "/api/executions/{eid}")["result"] == {"sum": 14}


def test_the_timeline_is_the_same_from_either_app(
    server_run: tuple[httpx.Client, str], local_run: tuple[httpx.Client, str]
) -> None:
    path = "/api/executions/{eid}/timeline"
    there, here = _get(server_run, path, buckets=10), _get(local_run, path, buckets=10)
    _same_shape(there, here, path)

    def lanes(doc: dict[str, Any]) -> list[Any]:
        return [
            (
                s["step"],
                s["total_commands"],
                [r["status"] for r in s["runs"]],
                sorted((c["loop_index"] or 0, c["attempt"], c["status"]) for c in s["commands"]),
            )
            for s in doc["steps"]
        ]

    assert lanes(there) == lanes(here)
    assert there["status"] == here["status"] == "completed"


def test_the_event_log_is_the_same_from_either_app(
    server_run: tuple[httpx.Client, str], local_run: tuple[httpx.Client, str]
) -> None:
    path = "/api/executions/{eid}/events"
    there, here = _get(server_run, path, limit=1000), _get(local_run, path, limit=1000)
    # A payload is the event type's own (a distributed `playbook.initialized` names
    # its worker pool): the documents around them are the same.
    assert set(there[0]) == set(here[0])

    def kinds(events: list[dict[str, Any]]) -> collections.Counter[tuple[str, str | None]]:
        return collections.Counter(
            (e["type"], e["step"]) for e in events if e["type"] not in DISTRIBUTED_ONLY
        )

    assert kinds(there) == kinds(here)
    newest = _get(server_run, path, limit=3, newest="true")
    assert [e["event_id"] for e in newest] == [e["event_id"] for e in there[-3:]]
    assert len(_get(local_run, path, limit=5, step="each", newest="true")) == 5


def test_the_list_item_is_the_same_from_either_app(
    server_run: tuple[httpx.Client, str], local_run: tuple[httpx.Client, str]
) -> None:
    def item(run: tuple[httpx.Client, str]) -> dict[str, Any]:
        page = _get(run, "/api/executions", playbook="tests/parity", limit=1000)
        assert page["unavailable_shards"] == []
        return next(i for i in page["items"] if i["execution_id"] == run[1])

    there, here = item(server_run), item(local_run)
    _same_shape(there, here, "item")
    assert _stable(there) == _stable(here)
    assert there["status"] == "completed" and there["playbook"] == "tests/parity"


def test_a_missing_execution_or_step_is_404_in_either_app(
    server_run: tuple[httpx.Client, str], local_run: tuple[httpx.Client, str]
) -> None:
    for client, eid in (server_run, local_run):
        for path in (
            "/api/executions/1",
            "/api/executions/1/summary",
            "/api/executions/1/events",
            f"/api/executions/{eid}/steps/nowhere",
        ):
            r = client.get(path)
            assert r.status_code == 404, (path, r.text)
            assert set(r.json()["error"]) >= {"status", "message"}
