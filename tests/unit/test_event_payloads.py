"""Every payload written is what its event type's TypedDict (`engine.events.PAYLOADS`)
says: no undeclared key, no required key missing, no value of another type.

The logs checked: the golden logs, whole embedded runs (`flowtide.run`: the worker's
events of `runtime.command`, with tool calls, retries, loops, an artifact, a skipped
step, a failure), the server's re-issue and the start of a sub-playbook with its pool
and inherited secrets. `tests/unit/driver.py` checks what the engine decides in every
test that drives it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args, get_overloads, get_type_hints

import pytest

import flowtide
from flowtide.engine import events as ev
from flowtide.engine.events import PAYLOADS, Event, NoPayload, payload_of
from flowtide.engine.start import start_execution
from flowtide.playbook.loader import parse_playbook
from flowtide.server.leases import reissue_events
from flowtide.store.pg.commands import ExpiredLease
from flowtide.store.sqlite import SQLiteStore
from payloads import check_payloads, event_problems, payload_problems

from .driver import Driver

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


# -- the check itself -------------------------------------------------------------------


def test_every_event_type_has_a_payload_type() -> None:
    names = {
        value
        for name, value in vars(ev).items()
        if name.isupper() and isinstance(value, str) and "." in value
    }
    assert names == set(PAYLOADS)


def test_payload_of_reads_each_type_as_payloads_says() -> None:
    typed: dict[str, Any] = {}
    for overload in get_overloads(payload_of):
        hints = get_type_hints(overload)
        for name in get_args(hints["kind"]):
            typed[name] = hints["return"]
    assert typed == {name: kind for name, kind in PAYLOADS.items() if kind is not NoPayload}


@pytest.mark.parametrize(
    ("type_", "payload", "problem"),
    [
        (ev.STEP_EXIT, {"next": [], "nxt": []}, "key 'nxt' is not declared by StepExitPayload"),
        (ev.STEP_EXIT, {"set": {}}, "StepExitPayload's required key 'next' is missing"),
        (ev.STEP_EXIT, {"next": "b"}, "step.exit.next: str is not a list"),
        (ev.LOOP_ITEM, {"instance": 1, "index": True}, "step"),
        (
            ev.LOOP_DONE,
            {"instance": 1, "stats": {"total": 1, "success": 1, "failed": 0, "x": 1}},
            "loop.done.stats: key 'x' is not declared by LoopStats",
        ),
        (ev.STEP_ENTER, {"anything": 1}, "key 'anything' is not declared by NoPayload"),
        (ev.COMMAND_ISSUED, None, "CommandIssuedPayload's required key 'command_id' is missing"),
        ("step.renamed", None, "step.renamed: no payload type"),
    ],
)
def test_a_payload_its_type_does_not_describe_is_reported(
    type_: str, payload: Any, problem: str
) -> None:
    problems = payload_problems(type_, payload)
    if problem == "step":  # a bool is not an int (JSON true is not 1)
        assert problems == ["loop.item.index: True is not int"]
    else:
        assert problem in "\n".join(problems), problems
    with pytest.raises(AssertionError):
        check_payloads([Event(1, 2, type_, payload=payload)])


def test_what_the_types_describe_passes() -> None:
    assert payload_problems(ev.STEP_ENTER, None) == []
    assert payload_problems(ev.STEP_EXIT, {"next": ["b"], "set": {"n": 1}}) == []
    assert payload_problems(ev.CALL_DONE, {"task": "t", "attempt": 1, "duration_ms": 3}) == []
    assert (
        payload_problems(ev.PLAYBOOK_COMPLETED, {"last_step": None, "result": {"any": [1]}}) == []
    )
    docs = [{"event_id": "5", "type": ev.LOOP_ITEM, "payload": {"instance": None, "index": 0}}]
    assert event_problems(docs) == []


# -- logs -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["failure", "parallel_loop", "routing_fan_in"])
def test_golden_logs(name: str) -> None:
    log = json.loads((GOLDEN / f"{name}.json").read_text(encoding="utf-8"))
    check_payloads(log["events"])


RUN = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: payloads, path: tests/payloads}
workload: {items: [1, 2, 3]}
workflow:
  - step: start
    tool:
      kind: python
      code: |
        print("hello")
        result = {"n": 2}
    set: {ctx.n: "{{ start.n }}"}
    next:
      spec: {mode: exclusive}
      arcs:
        - {step: each, when: "{{ ctx.n > 1 }}", set: {ctx.route: each}}
        - {step: other}
  - step: each
    loop: {in: "{{ items }}", iterator: item, spec: {mode: parallel, max_in_flight: 2}}
    tool: {kind: python, input: {item: "{{ item }}"}, code: "result = item * 2"}
    next: [tasks]
  - step: tasks
    tool:
      - name: flaky
        kind: python
        input: {before: "{{ output.status if output is defined else 'none' }}"}
        code: |
          if before == 'none':
              raise RuntimeError('first attempt fails')
          result = {'before': before}
        spec:
          policy:
            rules:
              - when: "{{ output.status == 'error' }}"
                then: {do: retry, attempts: 2}
      - {name: keep, kind: artifact, action: put, data: {rows: [1, 2]}}
      - name: broken
        kind: python
        input: {x: 1}
        code: "raise ValueError('no')"
        spec:
          policy:
            rules:
              - else: {then: {do: continue, set: {ctx.ran: "yes"}}}
    next: [gated]
  - step: gated
    spec:
      policy:
        admit:
          rules:
            - else: {then: {allow: false}}
    tool: {kind: noop}
  - step: other
    tool: {kind: noop}
"""

FAILS = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: payloads_failure, path: tests/payloads_failure}
workflow:
  - step: start
    tool:
      kind: python
      code: "result = 1 / 0"
      spec:
        policy:
          rules:
            - when: "{{ output.status == 'error' }}"
              then: {do: fail}
"""


def _run(text: str, home: Path) -> tuple[dict[str, Any], list[Event]]:
    book = home.parent / "book.yaml"
    book.write_text(text, encoding="utf-8")
    doc = flowtide.run(book, home=home)
    store = SQLiteStore(home / "flowtide.db")
    try:
        return doc, store.events(int(doc["execution_id"]))
    finally:
        store.close()


def test_an_embedded_run(tmp_path: Path) -> None:
    doc, events = _run(RUN, tmp_path / "home")
    assert doc["status"] == "completed", doc
    check_payloads(events)
    # the run wrote what the check is meant to see
    types = {e.type for e in events}
    assert {ev.LOOP_STARTED, ev.LOOP_ITEM, ev.LOOP_DONE, ev.CALL_ERROR, ev.STEP_EXIT} <= types
    calls = [e.payload for e in events if e.type in (ev.CALL_DONE, ev.CALL_ERROR)]
    assert {"stdout", "input", "artifact"} <= {key for call in calls for key in call or {}}
    assert any(e.status == "skipped" for e in events if e.type == ev.STEP_EXIT)


def test_a_failed_run(tmp_path: Path) -> None:
    doc, events = _run(FAILS, tmp_path / "home")
    assert doc["status"] == "failed", doc
    check_payloads(events)
    assert ev.COMMAND_FAILED in {e.type for e in events}


def test_a_sub_playbook_start_with_pool_and_secrets() -> None:
    playbook = parse_playbook(FAILS)
    ids = iter(range(100, 200))
    start = start_execution(
        playbook,
        {},
        next_id=lambda: next(ids),
        now=1.0,
        parent_execution_id=5,
        parent_command_id=6,
        inherited=frozenset({"s3cret"}),
        pool="gpu",
    )
    assert [e.type for e in start.events] == [ev.SECRETS_ADDED, ev.PLAYBOOK_INITIALIZED]
    check_payloads(start.events)


def test_the_servers_reissue() -> None:
    loop = """\
workload: {items: [1, 2]}
workflow:
  - step: each
    loop: {in: "{{ items }}", iterator: item, spec: {mode: parallel}}
    tool: {kind: noop}
  - step: plain
    tool: {kind: noop}
"""
    driver = Driver(loop).start()
    expired = [ExpiredLease(c.command_id, 0.0) for c in driver.outstanding]
    events = reissue_events(expired, driver.state, driver.new_id, 2.0)
    assert len(events) == 2 and all(e.type == ev.COMMAND_ISSUED for e in events)
    check_payloads(events)
