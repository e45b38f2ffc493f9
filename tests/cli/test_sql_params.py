"""`params` through the real CLI on a real PostgreSQL. Issue 14's SQL injection through
`--set`: pasted into a literal the value deletes rows (and `validate`/`run` warn about
it); bound with `params` it is returned as the literal string and deletes nothing. A
cursor loop's claim and its steps bind their values the same way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .helpers import Flowtide, describe

pytestmark = pytest.mark.postgres

ATTACK = "x'; DELETE FROM victim; SELECT 'y"

PASTED = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: pasted}
workload: {name: world}
workflow:
  - step: greet
    tool:
      kind: postgres
      auth: pg
      command: "SELECT '{{ name }}' AS v"
"""

BOUND = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: bound}
workload: {name: world}
workflow:
  - step: greet
    tool:
      kind: postgres
      auth: pg
      command: "SELECT %(name)s AS v"
      params: {name: "{{ name }}"}
"""


def sql(dsn: str, statement: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        cur = conn.execute(statement.encode())
        return cur.fetchall() if cur.description else []


def fill_victim(dsn: str) -> None:
    sql(dsn, "DROP TABLE IF EXISTS victim")
    sql(dsn, "CREATE TABLE victim (id int)")
    sql(dsn, "INSERT INTO victim VALUES (1), (2)")


@pytest.fixture
def playbooks(ft: Flowtide, pg_database: str) -> tuple[Path, Path, str]:
    ft.ok(
        "credential", "set", "pg", "--kind", "postgres", "--json", json.dumps({"dsn": pg_database})
    )
    pasted, bound = ft.cwd / "pasted.yaml", ft.cwd / "bound.yaml"
    pasted.write_text(PASTED)
    bound.write_text(BOUND)
    return pasted, bound, pg_database


WARNING = (
    "pasted.yaml:10: warning: step 'greet', field 'tool.command': template {{ name }} is "
    "pasted inside a SQL string literal"
)


def test_bound_with_params_the_value_deletes_nothing(
    ft: Flowtide, playbooks: tuple[Path, Path, str]
) -> None:
    pasted, bound, dsn = playbooks

    # The control: pasted into the literal, the value runs three statements.
    fill_victim(dsn)
    proc = ft("run", pasted.name, "--set", f"name={ATTACK}", "--json")
    assert proc.returncode == 0, describe(proc)
    assert sql(dsn, "SELECT count(*) FROM victim") == [(0,)]
    # ...and the run said so on stderr before running, stdout staying one JSON document.
    assert WARNING in proc.stderr
    json.loads(proc.stdout)

    fill_victim(dsn)
    proc = ft("run", bound.name, "--set", f"name={ATTACK}", "--json")
    assert proc.returncode == 0, describe(proc)
    doc = json.loads(proc.stdout)
    assert doc["result"]["rows"] == [{"v": ATTACK}]
    assert sql(dsn, "SELECT count(*) FROM victim") == [(2,)]
    assert "warning" not in proc.stderr


def test_validate_flags_the_pasted_form_and_not_the_bound_one(
    ft: Flowtide, playbooks: tuple[Path, Path, str]
) -> None:
    pasted, bound, _ = playbooks
    proc = ft.ok("validate", pasted.name, bound.name)  # a warning is not an error
    assert "pasted.yaml: ok" in proc.stdout and "bound.yaml: ok" in proc.stdout
    assert WARNING in proc.stderr and "`params`" in proc.stderr
    assert proc.stderr.count("warning:") == 1

    report = ft.json("validate", pasted.name, bound.name)
    assert [entry["valid"] for entry in report] == [True, True]
    [warning] = report[0]["warnings"]
    assert warning["file"] == "pasted.yaml" and warning["line"] == 10
    assert (warning["step"], warning["field"], warning["template"]) == (
        "greet",
        "tool.command",
        "{{ name }}",
    )
    assert report[1]["warnings"] == []


def test_run_on_a_server_warns_before_submitting(
    ft: Flowtide, playbooks: tuple[Path, Path, str]
) -> None:
    # Nothing listens on port 9: the warning comes from the local check, before any request.
    proc = ft("run", playbooks[0].name, "--server", "http://127.0.0.1:9")
    assert proc.returncode != 0
    assert WARNING in proc.stderr


CURSOR = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: cursor_params}
workload: {tag: "it's"}
workflow:
  - step: start
    tool: {kind: noop}
    next: [process]
  - step: process
    loop:
      cursor:
        kind: postgres
        auth: pg
        claim: >-
          UPDATE queue SET claimed = true
          WHERE id IN (SELECT id FROM queue WHERE NOT claimed AND tag = %(tag)s ORDER BY id
                       LIMIT %(n)s FOR UPDATE SKIP LOCKED)
          RETURNING id, payload
        params: {tag: "{{ tag }}", n: "{{ __frame_max_rows }}"}
      iterator: row
      spec: {mode: cursor, max_in_flight: 2, frame: {max_rows: 2, process: row}}
    tool:
      kind: postgres
      auth: pg
      command: INSERT INTO done (id, payload) VALUES ($1, $2)
      params: ["{{ row.id }}", "{{ row.payload }}"]
"""


def test_cursor_claim_and_loop_steps_bind_params(
    ft: Flowtide, playbooks: tuple[Path, Path, str]
) -> None:
    dsn = playbooks[2]
    sql(dsn, "CREATE TABLE queue (id int, tag text, payload text, claimed bool DEFAULT false)")
    sql(dsn, "CREATE TABLE done (id int, payload text)")
    sql(
        dsn,
        "INSERT INTO queue (id, tag, payload) SELECT i, CASE WHEN i % 5 = 0 THEN 'other' "
        "ELSE 'it''s' END, 'p''' || i || '; DROP TABLE queue; --' FROM generate_series(1, 10) i",
    )
    (ft.cwd / "cursor.yaml").write_text(CURSOR)
    proc = ft("run", "cursor.yaml", "--json")
    assert proc.returncode == 0, describe(proc)
    assert "warning" not in proc.stderr
    assert json.loads(proc.stdout)["steps"]["process"]["status"] == "completed"
    expected = [(i, f"p'{i}; DROP TABLE queue; --") for i in range(1, 11) if i % 5]
    assert sql(dsn, "SELECT id, payload FROM done ORDER BY id") == expected
    assert sql(dsn, "SELECT count(*) FROM queue WHERE NOT claimed") == [(2,)]
