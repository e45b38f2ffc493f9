"""A strict DSL on the command line: `validate` refuses unknown keys and template names
with "did you mean" and prints the keys it does not act on as warnings; `run` refuses
`--set`/`--payload` keys the workload does not declare unless `--allow-extra`."""

from __future__ import annotations

from pathlib import Path

from .helpers import Flowtide

FLOW = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: strict_cli}
workload: {count: 2}
workflow:
  - step: start
    tool: {kind: python, input: {n: "{{ workload.count }}"}, code: "result = {'n': n}"}
    next: {spec: {mode: exclusive, on_no_match: quiet}, arcs: [{step: end}]}
  - step: end
    tool: {kind: python, input: {n: "{{ start.n }}"}, code: "result = {'twice': n * 2}"}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "flow.yaml"
    path.write_text(text)
    return path


def test_validate_warns_of_keys_it_does_not_act_on(ft: Flowtide, tmp_path: Path) -> None:
    path = _write(tmp_path, FLOW)
    proc = ft.ok("validate", path)
    assert f"{path}:8:36: warning: step 'start', field 'next.spec.on_no_match'" in proc.stderr
    [report] = ft.json("validate", path)
    assert report["valid"] is True
    assert [w["field"] for w in report["warnings"]] == ["next.spec.on_no_match"]


def test_typos_are_refused_before_anything_runs(ft: Flowtide, tmp_path: Path) -> None:
    text = FLOW.replace("    next: {spec", "    nxt: [end]\n    next: {spec").replace(
        "{{ start.n }}", "{{ strat.n }}"
    )
    path = _write(tmp_path, text)
    proc = ft("validate", path)
    assert proc.returncode == 2
    assert f"{path}:8:5: step 'start', field 'nxt': unknown step key 'nxt'" in proc.stderr
    assert "did you mean 'next'?" in proc.stderr
    run = ft("run", path, "--json")
    assert run.returncode == 2 and run.stdout == ""
    assert "nxt" in run.stderr
    # The misspelt step alone: the run refuses it too, naming the step it meant.
    path.write_text(FLOW.replace("{{ start.n }}", "{{ strat.n }}"))
    run = ft("run", path, "--json")
    assert run.returncode == 2, run.stderr
    assert "unknown name 'strat'; did you mean 'start'?" in run.stderr


def test_set_keys_must_be_declared_unless_allow_extra(ft: Flowtide, tmp_path: Path) -> None:
    path = _write(tmp_path, FLOW)
    refused = ft("run", path, "--set", "coutn=5", "--json")
    assert refused.returncode == 2 and refused.stdout == ""
    assert "'coutn' (did you mean 'count'?)" in refused.stderr
    assert "--allow-extra" in refused.stderr
    assert ft.run(path, "--set", "count=5")["steps"]["end"]["result"] == {"twice": 10}
    doc = ft.run(path, "--set", "coutn=5", "--allow-extra")
    assert doc["steps"]["end"]["result"] == {"twice": 4}
