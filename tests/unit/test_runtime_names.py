"""The names NoETL's render contexts offer, offered by flowtide's runtime with the same
meaning: `loop` and `iter._index`/`_first`/`_last` in a loop (and `loop` on a loop step's
arcs), `error` after a failed call, `_task`/`_attempt`/`results` in a pipeline. Each is
rendered in a real embedded run and accepted by validate; a misspelt one is refused with
"did you mean"."""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent
from typing import Any

import pytest

import flowtide
from flowtide.engine.context import iteration_scope
from flowtide.errors import PlaybookError
from flowtide.playbook import parse_playbook
from flowtide.playbook.loader.references import RUNTIME_NAMES
from flowtide.wire import Claimed, Command

HEAD = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: names, path: tests/names}\n"


def _run(tmp_path: Path, body: str) -> dict[str, Any]:
    path = tmp_path / "pb.yaml"
    path.write_text(HEAD + dedent(body))
    doc = flowtide.run(path, home=tmp_path / "home")
    assert doc["status"] == "completed", doc["error"]
    return doc


LOOP = """\
    workload: {items: [a, b, c]}
    workflow:
      - step: start
        loop: {in: "{{ workload.items }}", iterator: it, mode: sequential}
        tool:
          kind: noop
          result:
            it: "{{ it }}"
            index: "{{ loop.index }}"
            first: "{{ loop.first }}"
            length: "{{ loop.length }}"
            done: "{{ loop.done }}"
            _index: "{{ iter._index }}"
            _first: "{{ iter._first }}"
            _last: "{{ iter._last }}"
            jinja: "{% for x in [7, 8] %}{{ loop.index }}{% endfor %}"
        set: {ctx.after: "{{ loop }}"}
        next:
          arcs:
            - {step: end, when: "{{ loop.done and loop.length == 3 }}"}
      - step: end
        tool: {kind: noop, result: {after: "{{ ctx.after }}"}}
    """


def test_a_loop_sees_loop_and_iter_marks(tmp_path: Path) -> None:
    parse_playbook(HEAD + dedent(LOOP), "pb.yaml", references=())  # validate accepts every name
    doc = _run(tmp_path, LOOP)
    results = doc["steps"]["start"]["result"]["results"]
    assert [r["it"] for r in results] == ["a", "b", "c"]
    assert [(r["index"], r["_index"]) for r in results] == [(0, 0), (1, 1), (2, 2)]
    assert [r["first"] for r in results] == [True, False, False]
    assert [r["_first"] for r in results] == [True, False, False]
    assert [r["_last"] for r in results] == [False, False, True]
    assert {r["length"] for r in results} == {3} and {r["done"] for r in results} == {False}
    # Jinja's own `loop` wins inside a for-block (1-based `loop.index`).
    assert {r["jinja"] for r in results} == {"12"}
    # On the loop step's `set` and arcs: the loop as it ended.
    assert doc["result"] == {"after": {"index": 2, "first": False, "length": 3, "done": True}}


def test_an_iterator_named_loop_is_still_the_element() -> None:
    scope = iteration_scope("loop", "elem", 0, size=1)
    assert scope["loop"] == "elem" and scope["iter"]["_last"] is True
    assert "_last" not in iteration_scope("x", 1, 0)["iter"]  # size not known


def test_a_claim_carries_the_collection_size() -> None:
    command = Command(1, 2, "start", 1, 0, 4, 3, {})
    doc = Claimed(command, "it", "e", 30.0, 9).to_dict()
    assert Claimed.from_dict(doc).size == 9
    assert (
        "size" not in Claimed(command).to_dict()
        and Claimed.from_dict(Claimed(command).to_dict()).size is None
    )


ERROR = """\
    workflow:
      - step: start
        tool:
          kind: shell
          cmds: ["exit 3"]
          spec:
            policy:
              rules:
                - when: "{{ output.status == 'error' }}"
                  then: {do: continue, set: {ctx.rule_saw: "{{ error.kind }}"}}
        set: {ctx.set_saw: "{{ error.kind }}"}
        next:
          arcs:
            - {step: end, when: "{{ error is defined and error == output.error }}"}
      - step: end
        tool:
          kind: noop
          result:
            rule: "{{ ctx.rule_saw }}"
            set: "{{ ctx.set_saw }}"
            ok_error: "{{ 'none' if error is not defined else 'some' }}"
    """


def test_a_failed_call_is_seen_as_error(tmp_path: Path) -> None:
    parse_playbook(HEAD + dedent(ERROR), "pb.yaml", references=())
    doc = _run(tmp_path, ERROR)
    kind = doc["result"]["rule"]
    assert kind and kind != "None"
    assert doc["result"] == {"rule": kind, "set": kind, "ok_error": "none"}


PIPELINE = """\
    workflow:
      - step: start
        tool:
          - {name: first, kind: noop, result: {n: 1}}
          - name: flaky
            kind: shell
            cmds: ["exit {{ 0 if _attempt >= 2 else 3 }}"]
            spec:
              policy:
                rules:
                  - when: "{{ output.status == 'error' }}"
                    then: {do: retry, attempts: 3, delay: 0}
            set: {ctx.tries: "{{ _attempt }}"}
          - name: second
            kind: noop
            result:
              task: "{{ _task }}"
              attempt: "{{ _attempt }}"
              before: "{{ results | list }}"
              first_n: "{{ results.first.n }}"
              tries: "{{ ctx.tries }}"
    """


def test_a_pipeline_task_sees_task_attempt_and_results(tmp_path: Path) -> None:
    parse_playbook(HEAD + dedent(PIPELINE), "pb.yaml", references=())
    doc = _run(tmp_path, PIPELINE)
    assert doc["result"] == {
        "task": "second",
        "attempt": 1,
        "before": ["first", "flaky"],
        "first_n": 1,
        "tries": 2,
    }


@pytest.mark.parametrize(
    ("typo", "meant"),
    [("lop.index", "loop"), ("eror.kind", "error"), ("_tsk", "_task"), ("reslts", "results")],
)
def test_a_misspelt_runtime_name_gets_did_you_mean(typo: str, meant: str) -> None:
    text = HEAD + dedent(
        f"""\
        workflow:
          - step: start
            tool: {{kind: noop, result: "{{{{ {typo} }}}}"}}
        """
    )
    with pytest.raises(PlaybookError) as info:
        parse_playbook(text, "pb.yaml", references=())
    assert f"did you mean '{meant}'?" in str(info.value)


def test_every_new_name_is_documented() -> None:
    for name in ("loop", "error", "_task", "_attempt", "results"):
        assert RUNTIME_NAMES[name]
    assert "_first" in RUNTIME_NAMES["iter"] and "_last" in RUNTIME_NAMES["iter"]


def test_a_claim_reply_gives_the_worker_the_loop_size() -> None:
    from flowtide.engine.state import LoopRecord
    from flowtide.server.claims import Taken, _reply_part
    from flowtide.server.statecache import Snapshot
    from flowtide.wire import ClaimItem

    playbook = parse_playbook(HEAD + dedent(LOOP), "pb.yaml")
    loop = LoopRecord("start", 0, "it", ["a", "b", "c"], 1)
    snap = Snapshot(playbook, {}, "running", {}, {("start", 0): loop})
    got = Taken("start", 1, 0, 2, "default", False)
    part = _reply_part(ClaimItem(1, 5, 6), got, snap, 30.0)
    assert (part.iterator, part.element, part.size) == ("it", "c", 3)
