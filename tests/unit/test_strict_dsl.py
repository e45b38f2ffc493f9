"""A strict DSL: every key of a playbook is known (flowtide.playbook.loader.schema), an
unknown one is an error with file:line:column and "did you mean", a known key flowtide
does not act on is a warning; template references are resolved by `validate`; `--set`
keys the workload does not declare are refused (flowtide.cli.overrides)."""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import pytest

from conftest import NOETL_E2E, REPO
from flowtide.cli.overrides import refuse_undeclared, undeclared
from flowtide.errors import PlaybookError, PlaybookErrors
from flowtide.playbook import load_playbook, parse_playbook
from flowtide.playbook.loader import schema
from flowtide.playbook.loader.references import RUNTIME_NAMES
from flowtide.playbook.model import Playbook

FILE = "pb.yaml"

# A valid playbook; each case below replaces one line of it.
BASE = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: strict}
workload: {count: 3, items: [1, 2]}
workflow:
  - step: start
    tool: {kind: python, code: "def main(): return {'n': 1}"}
    next: {spec: {mode: exclusive}, arcs: [{step: work, when: "{{ start.n > 0 }}"}]}
  - step: work
    loop: {in: "{{ items }}", iterator: item, spec: {mode: sequential}}
    tool:
      kind: python
      input: {x: "{{ item }}", n: "{{ workload.count }}"}
      code: "def main(x, n): return x"
      spec:
        policy:
          rules:
            - when: "{{ output.status == 'error' }}"
              then: {do: retry, attempts: 2}
            - else: {then: {do: continue}}
    next: {arcs: [{step: end}]}
  - step: end
    tool: {kind: noop}
"""


def variant(old: str, new: str) -> str:
    assert BASE.count(old) == 1, old
    return BASE.replace(old, new)


def errors_of(text: str, references: tuple[str, ...] | None = ()) -> list[PlaybookError]:
    with pytest.raises(PlaybookError) as info:
        parse_playbook(text, FILE, references=references)
    err = info.value
    return list(err.errors) if isinstance(err, PlaybookErrors) else [err]


def test_the_base_playbook_is_valid_and_warns_of_nothing() -> None:
    pb = parse_playbook(BASE, FILE)
    assert pb.warnings == ()


# (what is replaced, by what, the field named, the line, what the message says)
KEY_TYPOS = [
    ("    next: {arcs: [{step: end}]}", "    nxt: [end]", "nxt", 21, "did you mean 'next'?"),
    (
        "    next: {arcs: [{step: end}]}",
        "    retries: 3\n    next: {arcs: [{step: end}]}",
        "retries",
        21,
        "belong under 'tool': `retry: N`",
    ),
    (
        "    next: {arcs: [{step: end}]}",
        "    timeout: 30\n    next: {arcs: [{step: end}]}",
        "timeout",
        21,
        "belongs under 'tool'",
    ),
    (
        '      code: "def main(x, n): return x"',
        '      code: "def main(x, n): return x"\n      timout: 5',
        "tool.timout",
        15,
        "did you mean 'timeout'?",
    ),
    (
        "    tool: {kind: noop}",
        "    tool: {kind: noop, reslt: 1}",
        "tool.reslt",
        23,
        "did you mean 'result'?",
    ),
    (
        "[{step: work, when:",
        "[{step: work, wen:",
        "next.arcs[0].wen",
        8,
        "did you mean 'when'?",
    ),
    ("spec: {mode: exclusive}", "spec: {mdoe: exclusive}", "next.spec.mdoe", 8, "'mode'"),
    ("iterator: item,", "iterator: item, colection: [1],", "loop.colection", 10, "'collection'"),
    (
        "spec: {mode: sequential}",
        "spec: {mode: sequential, max_inflight: 2}",
        "loop.spec.max_inflight",
        10,
        "'max_in_flight'",
    ),
    (
        "then: {do: retry, attempts: 2}",
        "then: {do: retry, atempts: 2}",
        "spec.policy.rules[0].then.atempts",
        19,
        "'attempts'",
    ),
    (
        '            - when: "{{ output',
        '            - wen: true\n              when: "{{ output',
        "spec.policy.rules[0].wen",
        18,
        "'when'",
    ),
    (
        "        policy:\n",
        "        policy:\n          rule: []\n",
        "spec.policy.rule",
        17,
        "'rules'",
    ),
    (
        "metadata: {name: strict}",
        "metadata: {name: strict}\nworkflw: []",
        "workflw",
        4,
        "'workflow'",
    ),
    (
        "    next: {arcs: [{step: end}]}",
        "    next: {arcs: [{step: end, args: {a: 1}}]}",
        "next.arcs[0].args",
        21,
        "write 'set'",
    ),
]


@pytest.mark.parametrize(("old", "new", "field", "line", "says"), KEY_TYPOS)
def test_an_unknown_key_is_an_error_with_its_place_and_a_suggestion(
    old: str, new: str, field: str, line: int, says: str
) -> None:
    errors = errors_of(variant(old, new))
    assert len(errors) == 1, [e.render() for e in errors]
    err = errors[0]
    assert err.file == FILE and err.column is not None
    assert err.field == field and err.line == line, err.render()
    assert says in err.message


def test_nxt_on_a_step_no_longer_validates_and_skips_end() -> None:
    # The symptom: `nxt: [end]` validated and the run "completed" with `end` skipped.
    text = "workflow:\n  - step: start\n    tool: {kind: noop}\n    nxt: [end]\n  - step: end\n"
    errors = errors_of(text)
    assert [(e.step, e.field, e.line, e.column) for e in errors] == [("start", "nxt", 4, 5)]
    assert "did you mean 'next'?" in errors[0].message


# (replaced, by, field, message part)
REFERENCE_TYPOS = [
    (
        "{{ start.n > 0 }}",
        "{{ strat.n > 0 }}",
        "next.arcs[0].when",
        "unknown name 'strat'; did you mean 'start'?",
    ),
    (
        "{{ workload.count }}",
        "{{ workload.coutn }}",
        "tool.input.n",
        "workload key 'coutn'; did you mean 'count'?",
    ),
    ("{{ items }}", "{{ itmes }}", "loop.in", "unknown name 'itmes'; did you mean 'items'?"),
    (
        'x: "{{ item }}"',
        'x: "{{ itme }}"',
        "tool.input.x",
        "unknown name 'itme'; did you mean 'item'?",
    ),
    (
        "{{ output.status == 'error' }}",
        "{{ ouput.status == 'error' }}",
        "spec.policy.rules[0].when",
        "did you mean 'output'?",
    ),
    (
        'x: "{{ item }}"',
        'x: "{{ iter.itme }}"',
        "tool.input.x",
        "unknown iter key 'itme'; did you mean 'item'?",
    ),
]


@pytest.mark.parametrize(("old", "new", "field", "says"), REFERENCE_TYPOS)
def test_validate_resolves_template_references(old: str, new: str, field: str, says: str) -> None:
    errors = errors_of(variant(old, new))
    assert len(errors) == 1, [e.render() for e in errors]
    assert errors[0].field == field and says in errors[0].message
    assert errors[0].line is not None and errors[0].column is not None


@pytest.mark.parametrize(
    "template",
    [
        "{{ maybe | default(1) }}",
        "{{ maybe.x if maybe is defined else 0 }}",
        "{% for k in items %}{{ k }}{% endfor %}",
        "{% set y = 2 %}{{ y }}",
        "{{ ctx.anything }} {{ vars.x }} {{ execution_id }} {{ job.uuid }} {{ now() }}",
        "{{ env.HOME }} {{ range(3) | list }} {{ workload.get('x') }}",
        "{{ iter.item }} {{ iter._index }} {{ iter['_first'] }} {{ iter.index }}",
        "{{ iter.maybe | default(0) }} {{ iter.get('other') }}",
    ],
)
def test_what_cannot_be_known_statically_is_not_refused(template: str) -> None:
    parse_playbook(variant('"{{ item }}"', repr(template)), FILE, references=())


def test_iter_keys_a_set_writes_resolve() -> None:
    text = dedent(
        """\
        workflow:
          - step: start
            loop: {in: [1, 2], iterator: n, spec: {mode: sequential}}
            tool:
              - {name: first, kind: noop, set: {iter.page: 1}}
              - {name: second, kind: python, input: {p: "{{ iter.page }}"}, code: "result = p"}
        """
    )
    parse_playbook(text, FILE, references=())


def test_names_a_playbook_writes_resolve() -> None:
    text = dedent(
        """\
        workflow:
          - step: start
            tool:
              - {name: first, kind: noop, set: {page: 1, ctx.total: 0}}
              - name: second
                kind: python
                input: {a: "{{ first }}", b: "{{ page }}", c: "{{ ctx.total }}"}
                code: "def main(a, b, c): return a"
            set: {ctx.seen: "{{ result }}"}
        """
    )
    parse_playbook(text, FILE, references=())


def test_references_are_resolved_when_asked_with_the_names_a_run_is_given() -> None:
    text = variant("{{ workload.count }}", "{{ user_id }}")
    # A server's payload may bring names the workload does not declare: not checked.
    parse_playbook(text, FILE)
    errors = errors_of(text)
    assert "unknown name 'user_id'" in errors[0].message
    # `run --allow-extra --set user_id=7`: the names given count as known.
    parse_playbook(text, FILE, references=("user_id",))


KEY_WARNINGS = [
    (
        "spec: {mode: exclusive}",
        "spec: {mode: exclusive, on_no_match: quiet}",
        "next.spec.on_no_match",
    ),
    ("    tool: {kind: noop}", "    tool: {kind: noop, assert: {expects: [x]}}", "tool.assert"),
    (
        "spec: {mode: sequential}",
        "spec: {mode: sequential, policy: {exec: local}}",
        "loop.spec.policy",
    ),
    ("metadata: {name: strict}", "metadata: {name: strict}\ntracing: {enabled: true}", "tracing"),
    ("    tool: {kind: noop}", "    tool: {kind: noop, colour: red}", "tool.colour"),
]


@pytest.mark.parametrize(("old", "new", "field"), KEY_WARNINGS)
def test_a_key_accepted_but_not_acted_on_is_a_warning(old: str, new: str, field: str) -> None:
    pb = parse_playbook(variant(old, new), FILE)
    assert [w.field for w in pb.warnings] == [field]
    warning = pb.warnings[0]
    assert warning.line is not None and warning.column is not None
    assert "not act" in warning.message or "ignored" in warning.message


def test_the_known_keys_are_data_one_table_per_level() -> None:
    for name, table in schema.LEVELS.items():
        assert table, name
        for key, spec in table.items():
            assert isinstance(spec, schema.Key) and spec.name == key
            assert spec.type, (name, key)
            assert spec.doc or spec.refused, (name, key)
            assert isinstance(spec.acted, bool) and isinstance(spec.default, str)
    step = schema.level("step")
    assert {"step", "desc", "tool", "input", "loop", "set", "next", "output", "spec"} <= set(step)
    assert schema.level("next spec")["on_no_match"].acted is False
    assert "schedule" not in schema.known("step")


def test_the_strictness_checks_read_the_same_table(monkeypatch: pytest.MonkeyPatch) -> None:
    text = variant("    tool: {kind: noop}", "    tool: {kind: noop}\n    owner: ops")
    assert errors_of(text)[0].field == "owner"
    extended = {**schema.STEP, "owner": schema.Key("owner", "string", "who runs it")}
    monkeypatch.setitem(schema.LEVELS, "step", extended)  # type: ignore[index]
    assert parse_playbook(text, FILE).warnings == ()
    quiet = {**extended, "owner": schema.Key("owner", "string", "who", acted=False)}
    monkeypatch.setitem(schema.LEVELS, "step", quiet)  # type: ignore[index]
    assert [w.field for w in parse_playbook(text, FILE).warnings] == ["owner"]


def test_set_keys_the_workload_does_not_declare_are_refused() -> None:
    workload = {"count": 3, "items": []}
    assert undeclared(workload, {"count": 5}) == []
    assert undeclared(workload, {"coutn": 5}) == ["'coutn' (did you mean 'count'?)"]
    with pytest.raises(PlaybookError) as info:
        refuse_undeclared(workload, {"coutn": 5, "zzz": 1}, "pb.yaml")
    message = info.value.message
    assert "'coutn' (did you mean 'count'?)" in message and "'zzz'" in message
    assert "--allow-extra" in message
    refuse_undeclared(workload, {"count": 1, "items": [1]}, "pb.yaml")


def test_runtime_names_are_offered_by_the_runtime() -> None:
    from flowtide.engine.context import base_context, iteration_scope

    offered = set(base_context(1, {}, [], {}, {})) | set(iteration_scope("x", 1, 0))
    for name in ("execution_id", "job", "env", "workload", "ctx", "vars", "iter"):
        assert name in offered and name in RUNTIME_NAMES


def _corpus() -> list[Path]:
    root = NOETL_E2E / "playbooks"
    return sorted(p for p in root.rglob("*.yaml") if "broken_playbooks" not in p.parts)


@pytest.mark.skipif(not (NOETL_E2E / "playbooks").is_dir(), reason="noetl-e2e not found")
def test_every_noetl_fixture_still_validates() -> None:
    files = _corpus()
    assert len(files) >= 29
    for path in files:
        pb: Playbook = load_playbook(path)
        # Every key the corpus writes is known: at most warned about, never refused.
        assert all("unknown" not in w.message for w in pb.warnings), path


def test_every_example_still_validates() -> None:
    examples = sorted((REPO / "examples").glob("*.yaml"))
    assert examples
    for path in examples:
        load_playbook(path)


def test_suggestions_for_unknown_names_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each unknown name was compared with every known one by a pure-Python edit
    # distance: 400 steps each reading an unknown 40-character name took 97 s to check,
    # 10,000 hours. Now a name is compared with the MAX_CANDIDATES closest in length, and
    # only the first MAX_SUGGESTED unknown names of a playbook get a suggestion.
    from flowtide.playbook.loader import references

    compared = 0
    edits = references._edits

    def counted(a: str, b: str, limit: int) -> int:
        nonlocal compared
        compared += 1
        return edits(a, b, limit)

    monkeypatch.setattr(references, "_edits", counted)
    others = [f"name_{i:04d}_{'x' * (i % 30)}" for i in range(5000)]
    assert references.suggest("strat", [*others, "start"]) == "; did you mean 'start'?"
    assert compared <= references.MAX_CANDIDATES
    compared = 0
    steps = 60
    text = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: many}\nworkflow:\n" + "".join(
        f"  - step: s{i}\n    tool: {{kind: python, code: 'result = 1', input: {{a: '{{{{ u{i} }}}}'}}}}\n"
        + (f"    next: [s{i + 1}]\n" if i + 1 < steps else "")
        for i in range(steps)
    )
    with pytest.raises(PlaybookErrors) as caught:
        parse_playbook(text, FILE, references=())
    found = [e for e in caught.value.errors if "unknown name" in e.message]
    assert len(found) == steps
    assert sum("did you mean" in e.message for e in found) <= references.MAX_SUGGESTED
    assert compared <= references.MAX_SUGGESTED * references.MAX_CANDIDATES
