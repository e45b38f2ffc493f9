"""The playbook DSL: YAML with positions, validation into the typed model, errors with
file:line:column (flowtide.playbook.{source,loader,model})."""

from __future__ import annotations

import json
from pathlib import Path
from textwrap import dedent

import pytest

from flowtide.errors import PlaybookError, PlaybookErrors
from flowtide.playbook import load_playbook, parse_playbook
from flowtide.playbook.model import Arc, Next, Playbook
from flowtide.playbook.source import load_yaml

FILE = "pb.yaml"


def parse(text: str) -> Playbook:
    return parse_playbook(dedent(text), FILE)


def errors_of(text: str) -> list[PlaybookError]:
    with pytest.raises(PlaybookError) as info:
        parse(text)
    err = info.value
    return list(err.errors) if isinstance(err, PlaybookErrors) else [err]


def only_error(text: str) -> PlaybookError:
    errors = errors_of(text)
    assert len(errors) == 1, [e.render() for e in errors]
    return errors[0]


def where(err: PlaybookError) -> tuple[str | None, int | None, int | None, str | None, str | None]:
    return err.file, err.line, err.column, err.step, err.field


# -- source: positions -------------------------------------------------------------------


def test_load_yaml_records_one_based_positions() -> None:
    data, positions = load_yaml("a: 1\nb:\n  - x\n  - {c: 2}\n")
    assert data == {"a": 1, "b": ["x", {"c": 2}]}
    assert positions.get(("a",)) == (1, 1)
    assert positions.get(("b",)) == (2, 1)
    assert positions.get(("b", 0)) == (3, 5)
    assert positions.get(("b", 1, "c")) == (4, 6)
    # Unknown paths fall back to the nearest ancestor.
    assert positions.get(("b", 1, "nope", 3)) == (4, 5)
    assert positions.get(()) == (1, 1)


def test_load_yaml_returns_plain_python_values() -> None:
    data, _ = load_yaml("d: 2024-01-02\nf: 1.5\nb: yes\nt: true\nn: ~\nk: {1: one}\n")
    assert data == {
        "d": "2024-01-02",
        "f": 1.5,
        "b": "yes",
        "t": True,
        "n": None,
        "k": {"1": "one"},
    }
    assert type(data["k"]) is dict


# -- accepted variations -----------------------------------------------------------------


def test_full_playbook_header() -> None:
    pb = parse(
        """\
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: demo, path: examples/demo, version: 2}
        workload: {api: "http://x", n: 3}
        keychain: [{name: token, kind: secret}]
        executor: {spark: {master: "local[2]"}}
        workflow:
          - step: start
            desc: the first step
            tool: {kind: python, code: "result = 1"}
        """
    )
    assert (pb.name, pb.path, pb.version) == ("demo", "examples/demo", "2")
    assert pb.workload == {"api": "http://x", "n": 3}
    assert pb.keychain == [{"name": "token", "kind": "secret"}]
    assert pb.executor == {"spark": {"master": "local[2]"}}
    assert pb.steps["start"].desc == "the first step"
    assert pb.steps["start"].line == 8
    assert pb.file == str(Path(FILE).resolve())


def test_missing_metadata_and_workload() -> None:
    pb = parse_playbook("workflow:\n  - step: start\n", "dir/my_flow.yaml")
    assert pb.name == "my_flow"
    assert (pb.path, pb.version, pb.workload) == (None, None, {})


def test_input_on_step_tool_and_tool_spec() -> None:
    pb = parse(
        """\
        workflow:
          - step: on_step
            input: {a: 1, b: 1}
            tool: {kind: python, code: "result = a"}
          - step: on_tool
            tool: {kind: python, input: {a: 2}, code: "result = a"}
          - step: on_spec
            tool:
              kind: python
              spec:
                input: {a: 3}
                code: "result = a"
          - step: both
            input: {a: 1, b: 1}
            tool: {kind: python, input: {b: 2, c: 2}, code: "result = a"}
          - step: none
            tool: {kind: python, code: "result = 0"}
        """
    )
    inputs = {name: step.tasks[0].input for name, step in pb.steps.items()}
    assert inputs == {
        "on_step": {"a": 1, "b": 1},
        "on_tool": {"a": 2},
        "on_spec": {"a": 3},
        "both": {"a": 1, "b": 2, "c": 2},  # the tool's own input wins
        "none": None,
    }
    assert pb.steps["on_spec"].tasks[0].config == {"kind": "python", "code": "result = a"}


def test_tool_fields_under_spec_with_flat_fields_winning() -> None:
    pb = parse(
        """\
        workflow:
          - step: start
            tool:
              kind: http
              method: POST
              spec:
                method: GET
                url: "{{ api_url }}/get"
                params: {test: hello}
                policy:
                  rules:
                    - when: "{{ output.status == 'error' }}"
                      then: {do: retry, attempts: 2}
        """
    )
    task = pb.steps["start"].tasks[0]
    assert task.config == {
        "kind": "http",
        "method": "POST",
        "url": "{{ api_url }}/get",
        "params": {"test": "hello"},
    }
    assert task.policy is not None and task.policy.rules[0].do == "retry"
    assert task.name == "start"
    assert task.line == 3


def test_tool_as_a_list_of_named_tasks_with_task_level_set() -> None:
    pb = parse(
        """\
        workflow:
          - step: fetch_page
            input: {page: 1}
            tool:
              - name: fetch
                kind: http
                url: "http://x?page={{ page }}"
                set: {fetch_result: "{{ output }}"}
              - name: check
                kind: python
                code: "result = {'has_more': False}"
                spec:
                  policy:
                    rules:
                      - when: "{{ output.data.has_more }}"
                        then: {do: jump, to: fetch}
              - kind: noop
        """
    )
    step = pb.steps["fetch_page"]
    assert step.pipeline
    assert [t.name for t in step.tasks] == ["fetch", "check", "task_2"]
    assert [t.kind for t in step.tasks] == ["http", "python", "noop"]
    assert step.tasks[0].set == {"fetch_result": "{{ output }}"}
    assert step.tasks[0].input == {"page": 1}  # step input reaches every task
    assert step.tasks[1].policy is not None and step.tasks[1].policy.rules[0].to == "fetch"
    assert [t.line for t in step.tasks] == [5, 9, 17]


def test_single_task_list_is_still_a_pipeline() -> None:
    pb = parse(
        """\
        workflow:
          - step: start
            tool: [{name: init, kind: python, code: "result = 1"}]
        """
    )
    assert pb.steps["start"].pipeline
    assert [t.name for t in pb.steps["start"].tasks] == ["init"]


def test_next_with_spec_mode_and_arcs() -> None:
    pb = parse(
        """\
        workflow:
          - step: start
            next:
              spec: {mode: inclusive}
              arcs:
                - step: a
                  when: "{{ x > 1 }}"
                  set: {ctx.n: 1}
                - {step: b}
          - step: a
          - step: b
        """
    )
    assert pb.steps["start"].next == Next(
        mode="inclusive",
        arcs=(Arc(step="a", when="{{ x > 1 }}", set={"ctx.n": 1}, line=6), Arc(step="b", line=9)),
    )


@pytest.mark.parametrize(
    ("next_yaml", "mode", "arcs"),
    [
        (
            "{arcs: [{step: a}, {step: b, when: '{{ go }}'}]}",
            "exclusive",
            [("a", None), ("b", "{{ go }}")],
        ),
        ("{spec: {mode: inclusive}, arcs: [{step: a}]}", "inclusive", [("a", None)]),
        ("{mode: inclusive, arcs: [{step: a}]}", "inclusive", [("a", None)]),
        ("[{step: a, when: '{{ go }}'}, {step: b}]", "exclusive", [("a", "{{ go }}"), ("b", None)]),
        ("[a, b]", "exclusive", [("a", None), ("b", None)]),
        ("a", "exclusive", [("a", None)]),
        ("{step: b, when: '{{ go }}'}", "exclusive", [("b", "{{ go }}")]),
        ("{arcs: []}", "exclusive", []),
        ("[]", "exclusive", []),
        ("null", "exclusive", []),
    ],
)
def test_next_forms(next_yaml: str, mode: str, arcs: list[tuple[str, str | None]]) -> None:
    pb = parse_playbook(
        f"workflow:\n  - step: start\n    next: {next_yaml}\n  - step: a\n  - step: b\n"
    )
    nxt = pb.steps["start"].next
    assert nxt.mode == mode
    assert [(arc.step, arc.when) for arc in nxt.arcs] == arcs


def test_missing_next() -> None:
    pb = parse("workflow:\n  - step: start\n  - step: other\n")
    assert pb.steps["start"].next == Next()
    assert pb.upstreams == {"start": frozenset(), "other": frozenset()}


def test_when_as_yaml_bool() -> None:
    pb = parse(
        """\
        workflow:
          - step: start
            next:
              arcs:
                - {step: a, when: false}
                - {step: b, when: true}
          - step: a
          - step: b
        """
    )
    assert [arc.when for arc in pb.steps["start"].next.arcs] == [False, True]


def test_else_rules_with_and_without_then() -> None:
    pb = parse(
        """\
        workflow:
          - step: canonical
            tool:
              kind: noop
              spec:
                policy:
                  rules:
                    - when: true
                      then: {do: continue}
                    - else:
                        then: {do: break, set: {ctx.a: 1}}
          - step: thenless
            tool:
              kind: noop
              spec:
                policy:
                  rules:
                    - else:
                        do: continue
                        set: {ctx.loop_results: "{{ output.data.loop_results }}"}
          - step: empty_else
            tool:
              kind: noop
              spec: {policy: {rules: [{else: {}}]}}
        """
    )

    def rules(name: str) -> list[tuple[object, bool, str, dict[str, object]]]:
        policy = pb.steps[name].tasks[0].policy
        assert policy is not None
        return [(r.when, r.is_else, r.do, r.set) for r in policy.rules]

    assert rules("canonical") == [
        (True, False, "continue", {}),
        (None, True, "break", {"ctx.a": 1}),
    ]
    assert rules("thenless") == [
        (None, True, "continue", {"ctx.loop_results": "{{ output.data.loop_results }}"})
    ]
    assert rules("empty_else") == [(None, True, "continue", {})]


def test_step_names_with_slashes() -> None:
    pb = parse(
        """\
        workflow:
          - step: start
            next: [fixtures/playbooks/hello_world]
          - step: fixtures/playbooks/hello_world
            tool: {kind: playbook, path: fixtures/playbooks/hello_world}
        """
    )
    assert list(pb.steps) == ["start", "fixtures/playbooks/hello_world"]
    assert pb.upstreams["fixtures/playbooks/hello_world"] == frozenset({"start"})
    assert (
        pb.steps["fixtures/playbooks/hello_world"].tasks[0].name == "fixtures/playbooks/hello_world"
    )


def test_entry_is_start_even_when_not_first() -> None:
    assert parse("workflow:\n  - step: prepare\n  - step: start\n").entry == "start"


def test_entry_falls_back_to_the_first_step() -> None:
    assert (
        parse("workflow:\n  - step: hit_non_routable\n  - step: end\n").entry == "hit_non_routable"
    )


def test_entry_from_executor_spec_entry_step() -> None:
    pb = parse(
        """\
        executor:
          spec: {entry_step: second}
        workflow:
          - step: first
          - step: second
        """
    )
    assert pb.entry == "second"


def test_explicit_entry_step_wins_over_start() -> None:
    pb = parse(
        "executor: {spec: {entry_step: other}}\nworkflow:\n  - step: start\n  - step: other\n"
    )
    assert pb.entry == "other"


def test_workbook_actions() -> None:
    pb = parse(
        """\
        workbook:
          - name: compute_flag
            tool:
              kind: python
              input: {temperature_c: null}
              code: "result = {'is_hot': temperature_c > 25}"
          - name: flat_action
            kind: python
            code: "result = 1"
        workflow:
          - step: start
            tool:
              kind: workbook
              name: compute_flag
              input: {temperature_c: "{{ temperature_c }}"}
            next: [pipe]
          - step: pipe
            tool:
              - {task: first, kind: workbook, name: flat_action}
        """
    )
    assert set(pb.workbook) == {"compute_flag", "flat_action"}
    action = pb.workbook["compute_flag"]
    assert (action.name, action.kind, action.input) == (
        "compute_flag",
        "python",
        {"temperature_c": None},
    )
    assert pb.workbook["flat_action"].config == {"kind": "python", "code": "result = 1"}
    task = pb.steps["start"].tasks[0]
    assert (task.kind, task.config["name"], task.input) == (
        "workbook",
        "compute_flag",
        {"temperature_c": "{{ temperature_c }}"},
    )


def test_loop_forms() -> None:
    pb = parse(
        """\
        workflow:
          - step: seq
            tool: {kind: noop}
            loop:
              in: "{{ items }}"
              iterator: item
          - step: par
            loop:
              in: [1, 2, 3]
              iterator: n
              spec: {mode: parallel, max_in_flight: 4}
            tool: {kind: noop}
          - step: templated
            loop:
              in: "{{ items }}"
              iterator: batch
              spec: {mode: parallel, max_in_flight: "{{ (concurrent_batches | default(1) | int) or 1 }}"}
            tool: {kind: noop}
        """
    )
    loops = {name: step.loop for name, step in pb.steps.items()}
    assert loops["seq"] is not None and (
        loops["seq"].collection,
        loops["seq"].iterator,
        loops["seq"].mode,
    ) == (
        "{{ items }}",
        "item",
        "sequential",
    )
    assert loops["par"] is not None and (
        loops["par"].collection,
        loops["par"].mode,
        loops["par"].max_in_flight,
    ) == (
        [1, 2, 3],
        "parallel",
        4,
    )
    assert loops["templated"] is not None
    assert loops["templated"].max_in_flight == "{{ (concurrent_batches | default(1) | int) or 1 }}"


def test_step_without_tool_and_noop_only_policy() -> None:
    pb = parse(
        """\
        workflow:
          - step: start
            tool:
              kind: noop
              spec: {policy: {rules: [{else: {then: {do: break}}}]}}
            next: end
          - step: end
        """
    )
    assert pb.steps["end"].tasks == ()
    assert pb.steps["start"].tasks[0].config == {"kind": "noop"}


def test_tool_aliases_satisfy_required_fields() -> None:
    pb = parse(
        """\
        workflow:
          - step: pg_query
            tool: {kind: postgres, auth: pg, query: "SELECT 1"}
          - step: http_endpoint
            tool: {kind: http, endpoint: "http://x"}
          - step: duck_commands
            tool: {kind: duckdb, commands: ["SELECT 1"]}
          - step: py_script
            tool: {kind: python, script: {type: file, path: x.py}}
        """
    )
    assert len(pb.steps) == 4


def test_upstreams_and_reachability() -> None:
    pb = parse(
        """\
        workflow:
          - step: start
            next: {spec: {mode: inclusive}, arcs: [{step: a}, {step: b}]}
          - step: a
            next: [join]
          - step: b
            next: [join]
          - step: join
            next:
              arcs:
                - {step: a, when: "{{ again }}"}
                - {step: end}
          - step: end
          - step: unreachable
        """
    )
    assert pb.upstreams["join"] == frozenset({"a", "b"})
    assert pb.upstreams["a"] == frozenset({"start", "join"})
    assert pb.reachable["start"] == frozenset({"a", "b", "join", "end"})
    assert "a" in pb.reachable["a"]  # on a cycle
    assert pb.reachable["end"] == frozenset()
    assert pb.reachable["unreachable"] == frozenset()


def test_load_playbook_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "flow.yaml"
    path.write_text("metadata: {name: flow}\nworkflow:\n  - step: start\n", encoding="utf-8")
    pb = load_playbook(path)
    assert pb.name == "flow"
    assert pb.file == str(path.resolve())
    assert pb.base_dir == tmp_path.resolve()


# -- errors ------------------------------------------------------------------------------


def test_errors_are_playbook_errors_with_data() -> None:
    with pytest.raises(PlaybookErrors) as info:
        parse("workflow:\n  - step: start\n    tool: {kind: ftp}\n")
    err = info.value
    assert isinstance(err, PlaybookError)
    assert err.to_dict() == {
        "file": FILE,
        "line": 3,
        "column": 12,
        "step": "start",
        "field": "tool.kind",
        "message": "unknown tool kind 'ftp'",
        "expected": "python | http | postgres | duckdb | spark | playbook | workbook | noop"
        " | nats | shell | script | transfer | artifact",
    }
    assert str(err).startswith(
        "pb.yaml:3:12: step 'start', field 'tool.kind': unknown tool kind 'ftp'"
    )


def test_yaml_syntax_error_points_at_the_problem() -> None:
    err = only_error(
        """\
        workflow:
          - step: start
            tool: {kind: python, code: "x"
          - step: end
        """
    )
    assert not isinstance(err, PlaybookErrors)
    assert where(err) == (FILE, 4, 3, None, None)
    assert err.message.startswith("YAML syntax error")


def test_yaml_indentation_error_points_at_the_problem() -> None:
    err = only_error(
        """\
        workflow:
          - step: start
            tool:
              kind: python
             code: bad
        """
    )
    assert (err.line, err.column) == (5, 6)


def test_unknown_tool_kind_with_did_you_mean() -> None:
    err = only_error(
        """\
        workflow:
          - step: start
            tool:
              kind: pyhton
              code: x
        """
    )
    assert where(err) == (FILE, 4, 7, "start", "tool.kind")
    assert "unknown tool kind 'pyhton'; did you mean 'python'?" in err.message


def test_unknown_tool_kind_in_a_task_list() -> None:
    err = only_error(
        """\
        workflow:
          - step: start
            tool:
              - name: one
                kind: noop
              - name: two
                kind: postgress
        """
    )
    assert where(err) == (FILE, 7, 9, "start", "tool[1].kind")
    assert "did you mean 'postgres'?" in err.message


def test_arc_to_missing_step_with_did_you_mean() -> None:
    err = only_error(
        """\
        workflow:
          - step: start
            tool: {kind: noop}
            next:
              arcs:
                - step: fetch
                - step: ned
          - step: fetch
          - step: end
        """
    )
    assert where(err) == (FILE, 7, 11, "start", "next.arcs[1].step")
    assert "arc to unknown step 'ned'; did you mean 'end'?" in err.message


@pytest.mark.parametrize(
    ("next_yaml", "line"),
    [
        ("    next: ned\n", 3),
        ("    next: [end, ned]\n", 3),
        ("    next:\n      - end\n      - ned\n", 5),
        ("    next:\n      - step: end\n      - step: ned\n        when: '{{ x }}'\n", 5),
        ("    next: {step: ned}\n", 3),
    ],
)
def test_arc_to_missing_step_in_every_next_form(next_yaml: str, line: int) -> None:
    err = only_error("workflow:\n  - step: start\n" + next_yaml + "  - step: end\n")
    assert (err.line, err.step) == (line, "start")
    assert "'ned'; did you mean 'end'?" in err.message


def test_arc_error_column_in_a_block_list() -> None:
    err = only_error(
        "workflow:\n  - step: start\n    next:\n      - end\n      - ned\n  - step: end\n"
    )
    assert (err.line, err.column) == (5, 9)


def test_arc_to_missing_step_without_a_close_match() -> None:
    err = only_error("workflow:\n  - step: start\n    next: [zzzzzz]\n")
    assert err.message == "arc to unknown step 'zzzzzz'"


def test_postgres_step_without_command() -> None:
    err = only_error(
        """\
        workflow:
          - step: start
            tool:
              kind: postgres
              auth: pg
        """
    )
    assert where(err) == (FILE, 3, 5, "start", "tool.command")
    assert err.message == "postgres tool requires 'command' (SQL to run) or 'script' (a file)"


def test_postgres_command_misplaced_on_the_step() -> None:
    err = only_error(
        """\
        workflow:
          - step: start
            tool: {kind: noop}
            next: [load]
          - step: load
            command: SELECT 1
            tool:
              kind: postgres
              auth: pg
        """
    )
    assert where(err) == (FILE, 7, 5, "load", "tool.command")
    assert "'command' is written on the step (line 6), it belongs under 'tool'" in err.message


def test_sql_on_a_step_without_tool() -> None:
    err = only_error("workflow:\n  - step: start\n    query: SELECT 1\n")
    assert where(err) == (FILE, 3, 5, "start", "query")
    assert "has no 'tool'" in err.message


def test_duplicate_step_names() -> None:
    err = only_error(
        """\
        workflow:
          - step: start
            tool: {kind: noop}
          - step: load
          - step: start
            tool: {kind: noop}
        """
    )
    assert where(err) == (FILE, 5, 5, "start", "step")
    assert err.message == "duplicate step name 'start'"


def test_duplicate_task_names() -> None:
    err = only_error(
        "workflow:\n  - step: s\n    tool:\n      - {name: t, kind: noop}\n      - {name: t, kind: noop}\n"
    )
    assert where(err) == (FILE, 3, 5, "s", "tool")
    assert "duplicate task name 't'" in err.message


def test_loop_without_in_or_iterator() -> None:
    errors = errors_of(
        """\
        workflow:
          - step: start
            loop:
              iterator: x
            tool: {kind: noop}
          - step: second
            tool: {kind: noop}
            loop:
              in: "{{ [1] }}"
        """
    )
    assert [where(e) for e in errors] == [
        (FILE, 3, 5, "start", "loop.in"),
        (FILE, 8, 5, "second", "loop.iterator"),
    ]


def test_loop_with_bad_mode_and_max_in_flight() -> None:
    errors = errors_of(
        """\
        workflow:
          - step: start
            loop:
              in: [1]
              iterator: x
              spec:
                mode: sideways
                max_in_flight: lots
            tool: {kind: noop}
        """
    )
    assert [(e.line, e.field) for e in errors] == [
        (7, "loop.spec.mode"),
        (8, "loop.spec.max_in_flight"),
    ]


def test_bad_policy_action() -> None:
    err = only_error(
        """\
        workflow:
          - step: start
            tool:
              kind: noop
              spec:
                policy:
                  rules:
                    - when: "{{ true }}"
                      then:
                        do: retyr
        """
    )
    assert where(err) == (FILE, 10, 17, "start", "spec.policy.rules[0].then.do")
    assert "unknown policy action 'retyr'; did you mean 'retry'?" in err.message
    assert err.expected == "continue | retry | jump | break | fail"


def test_jump_without_to() -> None:
    errors = errors_of(
        """\
        workflow:
          - step: start
            tool:
              kind: noop
              spec:
                policy:
                  rules:
                    - when: "{{ true }}"
                      then: {do: jump}
                    - else:
                        then:
                          do: jump
        """
    )
    assert [where(e) for e in errors] == [
        (FILE, 9, 15, "start", "spec.policy.rules[0].then.to"),
        (FILE, 10, 15, "start", "spec.policy.rules[1].then.to"),
    ]
    assert all("'do: jump' needs 'to'" in e.message for e in errors)


def test_policy_rule_without_when_or_else() -> None:
    err = only_error(
        "workflow:\n  - step: s\n    tool: {kind: noop, spec: {policy: {rules: [{then: {do: fail}}]}}}\n"
    )
    assert (err.line, err.field) == (3, "spec.policy.rules[0]")


def test_bad_jinja_in_an_arc_when() -> None:
    err = only_error(
        """\
        workflow:
          - step: start
            tool: {kind: noop}
            next:
              arcs:
                - step: end
                  when: "{{ start.x > }}"
          - step: end
        """
    )
    assert where(err) == (FILE, 7, 11, "start", "next.arcs[0].when")
    # What the user wrote, not Jinja's view of an internal wrapper ("unexpected ')'").
    assert err.message == "template syntax error: unexpected '}}' in '{{ start.x > }}'"


def test_template_syntax_error_inside_a_block_points_at_its_line() -> None:
    err = only_error(
        """        workflow:
          - step: start
            tool:
              kind: postgres
              command: |
                SELECT *
                FROM t
                WHERE id = {{ workload.id | }}
        """
    )
    assert where(err) == (FILE, 8, 9, "start", "tool.command")
    assert err.message == (
        "template syntax error: expected token 'name', got '}}' in 'WHERE id = {{ workload.id | }}'"
    )


def test_template_naming_an_unknown_filter_is_a_validation_error() -> None:
    err = only_error(
        """        workflow:
          - step: start
            tool: {kind: http, url: "{{ base | no_such_filter }}/x"}
        """
    )
    assert where(err)[3:] == ("start", "tool.url")
    assert "No filter named 'no_such_filter'" in err.message


def test_bad_jinja_in_a_policy_when_and_in_set() -> None:
    errors = errors_of(
        """\
        workflow:
          - step: start
            set:
              ctx.x: "{{ 1 + }}"
            tool:
              kind: noop
              spec:
                policy:
                  rules:
                    - when: "{% if %}"
                      then: {do: continue}
        """
    )
    assert [(e.line, e.step, e.field) for e in errors] == [
        (4, "start", "set.ctx.x"),
        (10, "start", "spec.policy.rules[0].when"),
    ]


def test_bad_jinja_in_tool_config_and_workload() -> None:
    errors = errors_of(
        """\
        workload:
          api: "{{ base_url "
        workflow:
          - step: start
            tool:
              kind: http
              url: "{{ api }/x"
        """
    )
    assert [(e.line, e.step, e.field) for e in errors] == [
        (2, None, "workload.api"),
        (7, "start", "tool.url"),
    ]


def test_unknown_workbook_action() -> None:
    err = only_error(
        """\
        workbook:
          - name: greet
            tool: {kind: python, code: "result = 1"}
        workflow:
          - step: start
            tool:
              kind: workbook
              name: gret
        """
    )
    assert where(err) == (FILE, 8, 7, "start", "tool.name")
    assert "unknown workbook action 'gret'; did you mean 'greet'?" in err.message
    assert err.expected == "one of: greet"


def test_unknown_workbook_action_inside_a_task_list() -> None:
    err = only_error(
        "workflow:\n  - step: s\n    tool:\n      - {name: a, kind: noop}\n      - {kind: workbook, name: nope}\n"
    )
    assert (err.line, err.step, err.field) == (5, "s", "tool.name")
    assert "(the playbook has no workbook)" in (err.expected or "")


def test_unknown_entry_step() -> None:
    err = only_error("executor:\n  spec: {entry_step: strat}\nworkflow:\n  - step: start\n")
    assert (err.field, err.file) == ("executor.spec.entry_step", FILE)
    assert "entry step 'strat' does not exist; did you mean 'start'?" in err.message


def test_unknown_entry_step_points_at_entry_step() -> None:
    err = only_error("executor:\n  spec: {entry_step: strat}\nworkflow:\n  - step: start\n")
    assert err.line == 2


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("apiVersion: v2\n", "workflow"),
        ("workflow: []\n", "workflow"),
        ("workflow: {step: start}\n", "workflow"),
    ],
)
def test_playbook_without_steps(text: str, field: str) -> None:
    err = only_error(text)
    assert (err.field, err.message) == (field, "playbook has no steps")


def test_not_a_mapping() -> None:
    err = only_error("- just\n- a list\n")
    assert (err.line, err.column) == (1, 1)


@pytest.mark.parametrize(
    ("step_yaml", "field"),
    [
        ("  - step: s\n    tool: {code: x}\n", "tool.kind"),
        ("  - step: s\n    tool: python\n", "tool"),
        ("  - step: s\n    input: [1]\n", "input"),
        ("  - step: s\n    set: [1]\n", "set"),
        ("  - step: s\n    loop: [1]\n", "loop"),
        ("  - step: s\n    next: 3\n", "next"),
        ("  - step: s\n    next: {spec: {mode: sometimes}, arcs: []}\n", "next.spec.mode"),
        ("  - step: s\n    next: {arcs: [{when: x}]}\n", "next.arcs[0]"),
        ("  - tool: {kind: noop}\n", "workflow[0].step"),
        ("  - just a string\n", "workflow[0]"),
    ],
)
def test_structural_errors_name_the_field(step_yaml: str, field: str) -> None:
    err = only_error("workflow:\n" + step_yaml)
    assert err.field == field
    assert err.line is not None and err.line >= 2


def test_every_error_is_collected_in_file_order() -> None:
    with pytest.raises(PlaybookErrors) as info:
        parse(
            """\
            workflow:
              - step: start
                tool: {kind: pyhton}
                next: [ned]
              - step: end
                loop: {iterator: x}
                tool: {kind: noop}
              - step: other
                tool: {kind: postgres}
            """
        )
    err = info.value
    assert [(e.line, e.field) for e in err.errors] == [
        (3, "tool.kind"),
        (4, "next.arcs[0].step"),
        (6, "loop.in"),
        (9, "tool.command"),
    ]
    assert (err.line, err.field) == (3, "tool.kind")
    rendered = str(err).splitlines()
    assert len(rendered) == 4
    assert rendered[0].startswith(
        "pb.yaml:3:12: step 'start', field 'tool.kind': unknown tool kind"
    )
    assert rendered[3].startswith(
        "pb.yaml:9:5: step 'other', field 'tool.command': postgres tool requires"
    )


def test_duplicate_step_name_does_not_repeat_other_errors() -> None:
    errors = errors_of(
        "workflow:\n  - step: start\n    next: [ned]\n  - step: end\n  - step: start\n"
    )
    assert [(e.line, e.field) for e in errors] == [(3, "next.arcs[0].step"), (5, "step")]


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(PlaybookError) as info:
        load_playbook(tmp_path / "missing.yaml")
    assert info.value.file == str(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("workflow:\n  - step: s\n    tool: {kind: nope}\n", encoding="utf-8")
    with pytest.raises(PlaybookError) as info:
        load_playbook(bad)
    assert (info.value.file, info.value.line) == (str(bad), 3)


def test_deep_nesting_is_refused_before_the_parser_recurses() -> None:
    from flowtide.playbook.source import MAX_NESTING

    head = "apiVersion: noetl.io/v2\nkind: Playbook\nworkload:\n  x: "
    tail = "\nworkflow:\n  - step: a\n    tool: {kind: python, code: 'result = 1'}\n"
    ok = head + "[" * MAX_NESTING + "]" * MAX_NESTING + tail
    assert parse_playbook(ok, "ok.yaml").workload["x"] is not None
    deep = head + "[" * 5000 + "]" * 5000 + tail
    with pytest.raises(PlaybookError, match="deeper than 100 levels") as err:
        parse_playbook(deep, "deep.yaml")
    assert "deep.yaml:4" in str(err.value)
    block = head + "\n" + "".join(" " * (i + 1) + f"k{i}:\n" for i in range(300)) + tail
    with pytest.raises(PlaybookError, match="indented deeper"):
        parse_playbook(block, "block.yaml")


# -- python code ---------------------------------------------------------------------------


def test_python_syntax_error_points_at_the_line_inside_the_block() -> None:
    err = only_error(
        """\
        workflow:
          - step: start
            tool:
              kind: python
              code: |   # the step's code
                import json

                rows = [1, 2,
                total = sum(rows)
        """
    )
    # Line 3 of the code is line 8 of the file; the column is the file's column.
    assert where(err) == (FILE, 8, 16, "start", "tool.code")
    assert err.message == "python syntax error: '[' was never closed: 'rows = [1, 2,'"
    assert str(err).startswith("pb.yaml:8:16: step 'start', field 'tool.code': python syntax")

    # The check accepts what the python tool runs.
    for code in (
        "result = {'n': 1}",
        "def main(**input):\n    return input",
        # A top-level return: the python tool runs such code as a function body.
        "if input.get('x'):\n    return 1\nreturn 2",
        "from __future__ import annotations\nreturn 1",
        # Rendered by Jinja before it runs: not checked as written.
        "result = {{ start.rows | tojson }} +",
    ):
        body = "".join(f"        {line}\n" for line in code.splitlines())
        pb = parse_playbook(
            f"workflow:\n  - step: start\n    tool:\n      kind: python\n      code: |\n{body}",
            FILE,
        )
        assert pb.steps["start"].tasks[0].config["code"].strip() == code


@pytest.mark.parametrize(
    ("tool", "line", "field"),
    [
        ('{kind: python, code: "result = (1 +"}', 3, "tool.code"),
        ("{kind: python, spec: {code: 'def main(:'}}", 3, "tool.spec.code"),
        ("[{name: a, kind: noop}, {name: b, kind: python, code: 'x ='}]", 3, "tool[1].code"),
        ("{kind: python, script: {type: inline, code: 'if x'}}", 3, "tool.script.code"),
        ("{kind: python, code: 'break'}", 3, "tool.code"),
    ],
)
def test_python_syntax_errors_in_every_place_code_is_written(
    tool: str, line: int, field: str
) -> None:
    err = only_error(f"workflow:\n  - step: start\n    tool: {tool}\n")
    assert (err.line, err.step, err.field) == (line, "start", field)
    assert err.message.startswith("python syntax error: ")


# -- step-level spec.policy --------------------------------------------------------------


def test_policy_rules_on_the_step_are_refused_with_where_they_belong() -> None:
    err = only_error(
        """\
        workflow:
          - step: start
            tool: {kind: http, url: "http://x"}
            spec:
              policy:
                rules:
                  - when: "{{ output.status == 'error' }}"
                    then: {do: retry, attempts: 3}
        """
    )
    assert where(err) == (FILE, 6, 9, "start", "spec.policy.rules")
    assert "belong under the tool" in err.message
    assert err.expected == "tool: {kind: ..., spec: {policy: {rules: [...]}}}"


def test_unknown_step_policy_keys_are_refused_and_admit_is_kept() -> None:
    errors = errors_of(
        """\
        workflow:
          - step: start
            tool: {kind: noop}
            spec:
              policy:
                admit:
                  rules: [{when: "{{ true }}", then: {allow: true}}]
                lifecycle: {timeout_s: 5}
        """
    )
    assert [(e.line, e.field) for e in errors] == [(8, "spec.policy.lifecycle")]
    assert "not supported" in errors[0].message
    pb = parse(
        """\
        workflow:
          - step: start
            tool: {kind: noop}
            spec:
              policy:
                admit:
                  rules: [{when: "{{ true }}", then: {allow: false}}]
        """
    )
    assert pb.steps["start"].admit == (("{{ true }}", False),)


@pytest.mark.parametrize(
    "name", ["a\r\nFlowtide-Start: 0", "a\x1b]0;title\x07", "tab\there", "c1\x9b"]
)
def test_a_step_name_with_a_control_character_is_refused(name: str) -> None:
    # A step's name goes into a header of each log message a worker publishes (a CR LF
    # there starts a header of its own) and onto terminals.
    quoted = json.dumps(name)  # a JSON string is a YAML double-quoted scalar
    text = (
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: ctl, path: tests/ctl}\n"
        f"workflow:\n  - step: start\n    next: [{quoted}]\n"
        f"  - step: {quoted}\n    tool: {{kind: noop}}\n"
    )
    with pytest.raises(PlaybookError) as caught:
        parse_playbook(text, "ctl.yaml")
    assert "holds a control character" in str(caught.value)


@pytest.mark.parametrize(
    "expr", ["(" * 100 + "1" + ")" * 100, "x" + "|default(x" * 100 + ")" * 100]
)
def test_a_template_nested_too_deeply_is_a_syntax_error(expr: str) -> None:
    # Jinja's parser recurses a dozen frames per bracket: a hundred brackets ended the
    # loader (and a server's POST /api/execute) with a RecursionError.
    from flowtide.errors import TemplateError
    from flowtide.playbook.template import render_string

    text = (
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: deep, path: tests/deep}\n"
        "workflow:\n  - step: start\n"
        f"    tool: {{kind: python, code: 'result = 1', input: {{a: '{{{{ {expr} }}}}'}}}}\n"
    )
    for references in (None, ()):
        with pytest.raises(PlaybookError) as caught:
            parse_playbook(text, "deep.yaml", references=references)
        assert "the expression nests too deeply" in str(caught.value)
    with pytest.raises(TemplateError, match="nests too deeply"):
        render_string("{{ " + expr + " }}", {"x": 1})
