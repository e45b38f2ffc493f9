"""`flowtide validate --strict`: a template pasted into SQL text (the probe's bare `= {{ id
}}` included) is an error with the warning's message and exit code 2; without --strict it
stays a warning (NoETL's fixtures paste templates widely)."""

from __future__ import annotations

from .helpers import Flowtide, describe

PROBE = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: probe}
workload: {id: "0; DROP TABLE t2; SELECT 1"}
workflow:
  - step: find
    tool:
      kind: postgres
      auth: pg
      command: SELECT v FROM t2 WHERE length(v) = {{ id }}
"""

BOUND = PROBE.replace("{{ id }}", "%(id)s") + '      params: {id: "{{ id }}"}\n'

MESSAGE = (
    "step 'find', field 'tool.command': template {{ id }} is pasted bare into the SQL as a "
    "value, where its value is SQL text"
)


def test_strict_makes_pasted_sql_an_error_with_the_same_message(ft: Flowtide) -> None:
    (ft.cwd / "probe.yaml").write_text(PROBE)
    (ft.cwd / "bound.yaml").write_text(BOUND)

    # Default: a warning, exit 0.
    proc = ft.ok("validate", "probe.yaml")
    assert f"probe.yaml:10: warning: {MESSAGE}" in proc.stderr
    assert "probe.yaml: ok" in proc.stdout

    proc = ft("validate", "--strict", "probe.yaml", "bound.yaml")
    assert proc.returncode == 2, describe(proc)
    assert f"probe.yaml:10: error: {MESSAGE}" in proc.stderr
    assert '`%(id)s` with `params: {id: "{{ id }}"}`' in proc.stderr
    assert "probe.yaml: invalid with --strict (1 SQL template(s) pasted)" in proc.stderr
    assert "probe.yaml: ok" not in proc.stdout and "bound.yaml: ok" in proc.stdout

    report = ft.json("validate", "--strict", "probe.yaml", "bound.yaml", expect=2)
    assert [entry["valid"] for entry in report] == [False, True]
    [error] = report[0]["errors"]
    assert (error["line"], error["step"], error["field"]) == (10, "find", "tool.command")
    assert (error["position"], error["role"], error["template"]) == ("bare", "value", "{{ id }}")
    assert MESSAGE.split(": ", 1)[1] in error["message"]
    assert report[1]["warnings"] == []

    ft.ok("validate", "--strict", "bound.yaml")
