"""Cursor loops (`loop.spec.mode: cursor`): the loader, and the pure engine driven by a
test worker that answers claim commands from an in-memory queue."""

from __future__ import annotations

from textwrap import dedent
from typing import Any

import pytest

from flowtide.engine import events as ev
from flowtide.engine.events import Command, Event
from flowtide.engine.state import fold
from flowtide.errors import PlaybookError, PlaybookErrors
from flowtide.playbook.loader import parse_playbook

from .driver import Driver, last_issued, replay, snapshot

FILE = "pb.yaml"


def cursor_playbook(
    *, max_in_flight: Any = 2, max_rows: int | None = 4, process: str = "row", after: str = ""
) -> str:
    frame = ""
    if max_rows is not None:
        frame = f", frame: {{max_rows: {max_rows}, process: {process}}}"
    mif = "" if max_in_flight is None else f"max_in_flight: {max_in_flight!r}, "
    return dedent(
        f"""\
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {{name: cursor_test, path: tests/cursor}}
        workload: {{}}
        workflow:
          - step: start
            tool: {{kind: noop}}
            next: [process]
          - step: process
            loop:
              cursor: {{kind: postgres, auth: pg_local, claim: "UPDATE q SET claimed = true
                RETURNING id LIMIT {{{{ __frame_max_rows | default(1) | int }}}}"}}
              iterator: row
              spec: {{mode: cursor, {mif}{frame.lstrip(", ")}}}
            tool: {{kind: python, code: "result = {{'id': row['id']}}"}}
            next: [end]
          - step: end
            {after or "tool: {kind: noop}"}
        """
    )


class Queue:
    """What the claim query would see: rows handed out at most `max_rows` at a time."""

    def __init__(self, n: int, max_rows: int) -> None:
        self.rows = [{"id": i} for i in range(1, n + 1)]
        self.max_rows = max_rows
        self.claims: list[list[int]] = []

    def claim(self) -> list[dict[str, Any]]:
        batch, self.rows = self.rows[: self.max_rows], self.rows[self.max_rows :]
        self.claims.append([r["id"] for r in batch])
        return batch


def is_claim(command: Command) -> bool:
    return bool(command.extra.get("cursor"))


def worker(queue: Queue, fail_ids: frozenset[int] = frozenset()):
    def respond(driver: Driver, command: Command) -> dict[str, Any]:
        if is_claim(command):
            return {"result": {"rows": queue.claim(), "row_count": 0}}
        if command.loop_index is not None:
            element = driver.element(command)
            ids = [r["id"] for r in element] if isinstance(element, list) else [element["id"]]
            if set(ids) & fail_ids:
                return {"status": "error", "result": None, "error": {"kind": "x"}}
            return {"result": {"ids": ids}}
        return {"result": {"step": command.step}}

    return respond


class Watch(Driver):
    """A driver that checks the cursor invariants after every event batch."""

    max_iterations = 0
    max_claims = 0

    def post(self, event: Event) -> list[Event]:
        recorded = super().post(event)
        mine = [c for c in self.outstanding if c.step == "process"]
        claims = sum(1 for c in mine if is_claim(c))
        self.max_claims = max(self.max_claims, claims)
        self.max_iterations = max(self.max_iterations, len(mine) - claims)
        return recorded


def processed_ids(driver: Driver) -> list[int]:
    out: list[int] = []
    for r in driver.state.steps["process"].result["results"]:
        out.extend(r["ids"])
    return out


# -- the engine --------------------------------------------------------------------------


def test_row_mode_processes_every_claimed_row_in_claim_order() -> None:
    queue = Queue(10, 4)
    driver = Watch(cursor_playbook(max_in_flight=2, max_rows=4), respond=worker(queue)).run()
    assert driver.state.status == "completed"
    result = driver.state.steps["process"].result
    assert processed_ids(driver) == list(range(1, 11))
    assert result["stats"] == {"total": 10, "success": 10, "failed": 0}
    # 4 + 4 + 2 rows, then the empty claim that ends the loop
    assert queue.claims == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10], []]
    assert driver.count(ev.LOOP_CLAIMED, "process") == 4
    assert driver.max_iterations == 2
    assert driver.max_claims == 1
    assert driver.entered() == ["start", "process", "end"]
    claimed = [e for e in driver.log if e.type == ev.LOOP_CLAIMED]
    assert [e.payload["exhausted"] for e in claimed] == [False, False, False, True]
    assert claimed[0].payload["rows"] == [{"id": i} for i in (1, 2, 3, 4)]
    assert snapshot(fold(driver.playbook, driver.state.execution_id, driver.log)) == snapshot(
        driver.state
    )


def test_issue_order_claim_first_then_iterations_then_claim_when_buffer_is_empty() -> None:
    queue = Queue(3, 2)
    driver = Driver(cursor_playbook(max_in_flight=3, max_rows=2), respond=worker(queue)).run()
    issued = [
        ("claim" if is_claim(c) else c.loop_index) for c in driver.issued if c.step == "process"
    ]
    # claim 1-2 -> both issued, room left -> claim 3 -> issued -> claim (empty)
    assert issued == ["claim", 0, 1, "claim", 2, "claim"]
    assert processed_ids(driver) == [1, 2, 3]


def test_no_claim_while_claimed_rows_wait_for_room() -> None:
    queue = Queue(5, 5)
    driver = Driver(cursor_playbook(max_in_flight=1, max_rows=5), respond=worker(queue)).run()
    issued = [
        ("claim" if is_claim(c) else c.loop_index) for c in driver.issued if c.step == "process"
    ]
    assert issued == ["claim", 0, 1, 2, 3, 4, "claim"]
    assert driver.max_outstanding["process"] == 1


def test_results_in_claim_order_when_completions_arrive_out_of_order() -> None:
    queue = Queue(9, 3)
    driver = Watch(
        cursor_playbook(max_in_flight=3, max_rows=3), respond=worker(queue), pick=last_issued
    ).run()
    assert driver.state.status == "completed"
    assert processed_ids(driver) == list(range(1, 10))
    assert driver.max_iterations <= 3 and driver.max_claims == 1
    # the last-issued-first worker really did complete out of order
    done = [e.payload["index"] for e in driver.log if e.type == ev.LOOP_ITEM]
    assert done != sorted(done)


def test_default_max_in_flight_is_one_and_max_rows_one() -> None:
    queue = Queue(3, 1)
    driver = Watch(cursor_playbook(max_in_flight=None, max_rows=None), respond=worker(queue)).run()
    assert processed_ids(driver) == [1, 2, 3]
    assert driver.max_iterations == 1
    loop = driver.state.loop_of("process")
    assert loop is not None and loop.max_in_flight == 1
    assert queue.claims == [[1], [2], [3], []]


def test_templated_max_in_flight() -> None:
    queue = Queue(6, 6)
    driver = Watch(
        cursor_playbook(max_in_flight="{{ 1 + 2 }}", max_rows=6), respond=worker(queue)
    ).run()
    assert driver.max_iterations == 3
    assert processed_ids(driver) == list(range(1, 7))


def test_frame_mode_iterates_over_claimed_batches() -> None:
    queue = Queue(7, 3)
    driver = Driver(
        cursor_playbook(max_in_flight=2, max_rows=3, process="frame"), respond=worker(queue)
    ).run()
    result = driver.state.steps["process"].result
    assert [r["ids"] for r in result["results"]] == [[1, 2, 3], [4, 5, 6], [7]]
    assert result["stats"] == {"total": 3, "success": 3, "failed": 0}
    loop = driver.state.loop_of("process")
    assert loop is not None and loop.collection[2] == [{"id": 7}]


def test_first_claim_empty_finishes_the_loop_at_once() -> None:
    driver = Driver(cursor_playbook(), respond=worker(Queue(0, 4))).run()
    assert driver.state.status == "completed"
    assert driver.state.steps["process"].result == {
        "results": [],
        "stats": {"total": 0, "success": 0, "failed": 0},
    }
    assert driver.entered() == ["start", "process", "end"]


def test_failed_iterations_are_counted() -> None:
    queue = Queue(6, 4)
    after = "tool: {kind: noop}"
    text = cursor_playbook(max_in_flight=2, max_rows=4, after=after).replace(
        "code: \"result = {'id': row['id']}\"}",
        "code: \"result = {'id': row['id']}\", spec: {policy: {rules: ["
        "{when: \"{{ output.status == 'error' }}\", then: {do: continue}}]}}}",
    )
    driver = Driver(text, respond=worker(queue, fail_ids=frozenset({2, 5}))).run()
    assert driver.state.status == "completed"
    result = driver.state.steps["process"].result
    assert result["stats"] == {"total": 6, "success": 4, "failed": 2}
    assert len(result["results"]) == 6


def test_a_failed_claim_fails_the_step() -> None:
    def respond(driver: Driver, command: Command) -> dict[str, Any]:
        if is_claim(command):
            return {
                "type": ev.COMMAND_FAILED,
                "status": "error",
                "action": "fail",
                "error": {"kind": "sql_error", "message": "relation q does not exist"},
            }
        return {"result": None}

    driver = Driver(cursor_playbook(), respond=respond).run()
    assert driver.state.status == "failed"
    assert driver.state.steps["process"].status == "failed"
    assert driver.state.error is not None and driver.state.error["kind"] == "sql_error"
    assert driver.count(ev.LOOP_CLAIMED) == 0


def test_break_stops_claiming_and_waits_for_in_flight() -> None:
    queue = Queue(20, 4)
    inner = worker(queue)

    def respond(driver: Driver, command: Command) -> dict[str, Any]:
        answer = inner(driver, command)
        if not is_claim(command) and command.loop_index == 1:
            answer["action"] = "break"
        return answer

    driver = Driver(cursor_playbook(max_in_flight=2, max_rows=4), respond=respond).run()
    assert driver.state.status == "completed"
    assert len(queue.claims) == 1  # no claim after the break
    stats = driver.state.steps["process"].result["stats"]
    # index 0 done, 1 breaks, 2 (already in flight) still finishes, 3 is never issued
    assert stats == {"total": 4, "success": 3, "failed": 0}
    issued = [c.loop_index for c in driver.issued if c.step == "process" and not is_claim(c)]
    assert issued == [0, 1, 2]


def test_late_claim_report_is_ignored() -> None:
    queue = Queue(2, 2)
    driver = Driver(cursor_playbook(), respond=worker(queue)).start()
    driver.answer(driver.outstanding[0])  # start
    claim = driver.outstanding[0]
    assert is_claim(claim)
    driver.answer(claim)
    before = len(driver.log)
    driver.post(driver.completion(claim, {"result": {"rows": [{"id": 99}]}}))
    assert [e.type for e in driver.log[before:]] == [ev.COMMAND_COMPLETED]
    driver.run()
    assert processed_ids(driver) == [1, 2]


def test_replaying_the_log_takes_the_same_decisions() -> None:
    queue = Queue(11, 3)
    driver = Driver(
        cursor_playbook(max_in_flight=2, max_rows=3), respond=worker(queue), pick=last_issued
    ).run()
    again = replay(driver.playbook, driver.log)
    assert [e.to_dict() for e in again.log] == [e.to_dict() for e in driver.log]


@pytest.mark.parametrize("cut", [6, 11, 17, 25, 33])
def test_resume_from_a_folded_log_never_reclaims_rows(cut: int) -> None:
    """Stop after `cut` events, fold the log, re-issue the open commands (as
    LocalRuntime.resume does) and carry on: every row is processed exactly once."""
    queue = Queue(10, 3)
    text = cursor_playbook(max_in_flight=2, max_rows=3)
    first = Driver(text, respond=worker(queue)).start()
    while len(first.log) < cut and first.outstanding:
        first.answer(first.outstanding[0])
    prefix = list(first.log)
    state = fold(first.playbook, first.state.execution_id, prefix)

    second = Driver(text, respond=worker(queue))
    second.state = state
    second.log = prefix
    second._next_id = max(e.event_id for e in prefix) + 1
    for record in sorted(state.commands.values(), key=lambda r: r.command_id):
        command = Command(
            command_id=record.command_id,
            execution_id=state.execution_id,
            step=record.step,
            attempt=record.attempt + 1,
            loop_instance=record.loop_instance,
            loop_index=record.loop_index,
            issued_event_id=record.issued_event_id,
            extra={"cursor": True} if record.cursor else {},
        )
        second.outstanding.append(command)
    second.run()
    assert second.state.status == "completed"
    assert processed_ids(second) == list(range(1, 11))
    claimed = [i for batch in queue.claims for i in batch]
    assert sorted(claimed) == list(range(1, 11))  # no row claimed twice
    assert snapshot(fold(second.playbook, state.execution_id, second.log)) == snapshot(second.state)


# -- the loader --------------------------------------------------------------------------


def errors_of(text: str) -> list[PlaybookError]:
    with pytest.raises(PlaybookError) as info:
        parse_playbook(dedent(text), FILE)
    err = info.value
    return list(err.errors) if isinstance(err, PlaybookErrors) else [err]


def test_loader_accepts_a_cursor_loop_without_in() -> None:
    playbook = parse_playbook(cursor_playbook(max_in_flight=3, max_rows=5, process="frame"), FILE)
    loop = playbook.steps["process"].loop
    assert loop is not None
    assert loop.mode == "cursor" and loop.collection is None
    assert loop.cursor is not None and loop.cursor.kind == "postgres"
    assert loop.cursor.config["auth"] == "pg_local" and "claim" in loop.cursor.config
    assert (loop.frame_max_rows, loop.frame_process, loop.max_in_flight) == (5, "frame", 3)


def test_loader_frame_defaults() -> None:
    loop = parse_playbook(cursor_playbook(max_rows=None), FILE).steps["process"].loop
    assert loop is not None and (loop.frame_max_rows, loop.frame_process) == (1, "row")


def test_loader_rejects_an_unsupported_cursor_kind() -> None:
    errors = errors_of(
        """\
        workflow:
          - step: process
            loop:
              cursor:
                kind: http
                claim: "SELECT 1"
              iterator: row
              spec: {mode: cursor}
            tool: {kind: noop}
        """
    )
    assert [(e.file, e.line, e.step, e.field) for e in errors] == [
        (FILE, 5, "process", "loop.cursor.kind")
    ]
    assert "http" in errors[0].message and errors[0].expected == "postgres"


def test_loader_requires_claim() -> None:
    errors = errors_of(
        """\
        workflow:
          - step: process
            loop:
              cursor: {kind: postgres, auth: pg}
              iterator: row
              spec: {mode: cursor}
            tool: {kind: noop}
        """
    )
    assert [(e.line, e.field) for e in errors] == [(4, "loop.cursor.claim")]


def test_loader_cursor_mode_and_cursor_go_together() -> None:
    errors = errors_of(
        """\
        workflow:
          - step: a
            loop:
              iterator: row
              spec: {mode: cursor}
            tool: {kind: noop}
            next: [b]
          - step: b
            loop:
              in: [1]
              cursor: {kind: postgres, claim: "SELECT 1"}
              iterator: row
              spec: {mode: parallel}
            tool: {kind: noop}
        """
    )
    assert [(e.step, e.field) for e in errors] == [("a", "loop.cursor"), ("b", "loop.spec.mode")]


def test_loader_checks_the_frame() -> None:
    errors = errors_of(
        """\
        workflow:
          - step: process
            loop:
              cursor: {kind: postgres, claim: "SELECT 1"}
              iterator: row
              spec:
                mode: cursor
                frame: {max_rows: 0, process: page}
            tool: {kind: noop}
        """
    )
    assert [(e.line, e.field) for e in errors] == [
        (8, "loop.spec.frame.max_rows"),
        (8, "loop.spec.frame.process"),
    ]
