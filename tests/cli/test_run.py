"""`flowtide run`: the JSON document, exit codes, workload overrides, catalog targets."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .helpers import PLAYBOOKS, Flowtide, describe, error_line

BASIC = PLAYBOOKS / "basic.yaml"
FAILING = PLAYBOOKS / "failing.yaml"


def test_run_json_completed_document(ft: Flowtide) -> None:
    proc = ft.ok("run", BASIC, "--json")
    # Exactly one JSON document: json.loads rejects anything before or after it, and the
    # python steps' print / sys.stdout.write output is captured, not leaked to stdout.
    doc = json.loads(proc.stdout)
    assert set(doc) == {"execution_id", "status", "result", "steps", "error"}
    assert doc["status"] == "completed"
    assert doc["error"] is None
    assert isinstance(doc["execution_id"], str) and doc["execution_id"].isdigit()
    assert list(doc["steps"]) == ["start", "finish"]
    for step in doc["steps"].values():
        assert set(step) == {"status", "runs", "attempts", "retries", "result", "error"}
        assert (
            step["status"] == "completed"
            and step["runs"] == 1
            and step["attempts"] == 1
            and step["retries"] == 0
            and step["error"] is None
        )
    assert doc["steps"]["start"]["result"] == {
        "greeting": "hello",
        "scaled": [2, 4, 6],
        "nested": {"x": 1, "y": 2},
    }
    # the result is the result of the last step that finished
    assert doc["result"] == doc["steps"]["finish"]["result"] == {"message": "hello: 12"}
    assert "noise" not in proc.stdout and "noise" not in proc.stderr


def test_run_json_failed_document(ft: Flowtide) -> None:
    doc = ft.run(FAILING, expect=1)
    assert doc["status"] == "failed"
    assert set(doc["error"]) == {"step", "kind", "message", "traceback"}
    assert doc["error"]["step"] == "explode"
    # The user's frame, at its line in the playbook.
    assert doc["error"]["traceback"].splitlines()[1:3] == [
        '  File "failing.yaml", line 18, in <module>',
        '    raise ValueError("the answer was 42, expected 41")',
    ]
    assert doc["error"]["kind"] == "python_error"
    assert "the answer was 42, expected 41" in doc["error"]["message"]
    steps = doc["steps"]
    assert steps["start"]["status"] == "completed"
    assert steps["explode"]["status"] == "failed" and steps["explode"]["runs"] == 1
    assert "the answer was 42" in steps["explode"]["error"]["message"]
    assert steps["never"] == {
        "status": "skipped",
        "runs": 0,
        "attempts": 0,
        "retries": 0,
        "result": None,
        "error": None,
    }
    # last step that finished (successfully) is `start`
    assert doc["result"] == {"ok": True}


def test_run_without_json_prints_a_summary(ft: Flowtide) -> None:
    # Off a terminal the status line and the error go to stderr, stdout holds the result
    # alone as JSON.
    ok = ft.ok("run", BASIC)
    assert "completed" in ok.stderr and "hello: 12" in json.dumps(json.loads(ok.stdout))
    bad = ft.ok("run", FAILING, expect=1)
    assert "failed" in bad.stderr and "explode" in bad.stderr
    assert json.loads(bad.stdout) is None or isinstance(json.loads(bad.stdout), dict)


def test_an_error_is_printed_as_written(ft: Flowtide, tmp_path: Path) -> None:
    # An error's message is the user's text: rich markup in it (`[/x]`) is neither read
    # nor a crash, and a long message stays on one line off a terminal (no 80 columns).
    message = "bad [/x] value [bold]" + "y" * 120
    book = tmp_path / "markup.yaml"
    book.write_text(
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: markup}\nworkflow:\n"
        f"  - step: start\n    tool: {{kind: python, code: \"raise ValueError('{message}')\"}}\n"
    )
    bad = ft.ok("run", book, expect=1)
    assert "Traceback" not in bad.stderr.split("ValueError")[0], bad.stderr
    line = next(s for s in bad.stderr.splitlines() if s.startswith("error in step start"))
    assert f"(python_error): ValueError: {message}" in line, bad.stderr
    eid = ft.executions()[0]["execution_id"]
    status = ft.ok("status", eid).stdout
    assert f"error in step start (python_error): ValueError: {message}" in status, status
    assert "result:" not in status


@pytest.mark.parametrize(
    ("name", "needles"),
    [
        ("yaml_syntax.yaml", ["YAML syntax error"]),
        ("unknown_kind.yaml", ["tool.kind", "pyhton"]),
        ("missing_arc.yaml", ["next.arcs[0].step", "finsh"]),
    ],
)
def test_invalid_playbook_exit_2_and_nothing_recorded(
    ft: Flowtide, name: str, needles: list[str]
) -> None:
    path = PLAYBOOKS / "invalid" / name
    proc = ft("run", path, "--json")
    assert proc.returncode == 2, describe(proc)
    assert proc.stdout == ""
    assert f"{path}:{error_line(path)}:" in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr
    assert ft.executions() == []


def test_run_missing_file_or_catalog_path_is_invalid(ft: Flowtide) -> None:
    proc = ft("run", "no/such/playbook", "--json")
    assert proc.returncode == 2, describe(proc)
    assert proc.stdout == ""
    assert "no/such/playbook" in proc.stderr and "catalog register" in proc.stderr
    assert ft.executions() == []


def test_set_overrides_parse_json_values_and_dotted_keys(ft: Flowtide) -> None:
    doc = ft.run(
        BASIC,
        "--set", "factor=10",
        "--set", "numbers=[1, 2]",
        "--set", "greeting=good morning",  # not JSON: kept as a string
        "--set", "extra.deep.key=true",
        "--allow-extra",  # 'extra' is not in the workload
    )  # fmt: skip
    assert doc["result"] == {"message": "good morning: 30"}
    assert doc["steps"]["start"]["result"]["scaled"] == [10, 20]
    events = ft.events(doc["execution_id"])
    workload = events[0]["payload"]["workload"]
    assert workload["factor"] == 10 and workload["numbers"] == [1, 2]
    assert workload["extra"] == {"deep": {"key": True}}


def test_set_dotted_key_overrides_one_leaf_of_a_workload_mapping(ft: Flowtide) -> None:
    doc = ft.run(BASIC, "--set", "nested.x=7")
    assert doc["steps"]["start"]["result"]["nested"] == {"x": 7, "y": 2}


def test_payload_inline_and_from_file(ft: Flowtide, tmp_path: Path) -> None:
    doc = ft.run(BASIC, "--payload", '{"greeting": "hey", "numbers": [5, 6]}')
    assert doc["result"] == {"message": "hey: 22"}
    payload_file = tmp_path / "payload.json"
    payload_file.write_text(json.dumps({"factor": 3, "greeting": "from file"}), encoding="utf-8")
    doc = ft.run(BASIC, "--payload", f"@{payload_file}")
    assert doc["result"] == {"message": "from file: 18"}


@pytest.mark.parametrize(
    "args",
    [["--payload", "{not json"], ["--payload", "[1, 2]"], ["--set", "no_equals_sign"]],
)
def test_bad_overrides_are_invalid(ft: Flowtide, args: list[str]) -> None:
    proc = ft("run", BASIC, "--json", *args)
    assert proc.returncode == 2, describe(proc)
    assert proc.stdout == ""
    assert args[0] in proc.stderr
    assert ft.executions() == []


def test_payload_from_a_missing_file_is_invalid(ft: Flowtide, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-payload.json"
    proc = ft("run", BASIC, "--json", "--payload", f"@{missing}")
    assert proc.stdout == ""
    assert ft.executions() == []
    assert "Traceback" not in proc.stderr and str(missing) in proc.stderr
    assert proc.returncode == 2, describe(proc)


def test_run_by_catalog_path_and_version(ft: Flowtide, tmp_path: Path) -> None:
    folder = tmp_path / "catalog"
    folder.mkdir()
    copy = folder / "basic.yaml"
    shutil.copy(BASIC, copy)
    shutil.copy(PLAYBOOKS / "fan_in.yaml", folder / "fan_in.yaml")

    reg = ft.ok("catalog", "register", folder)
    assert "tests/cli/basic v1" in reg.stdout and "tests/cli/fan_in v1" in reg.stdout
    doc = ft.run("tests/cli/basic")
    assert doc["status"] == "completed" and doc["result"] == {"message": "hello: 12"}

    # re-registering unchanged text keeps the version; changed text bumps it
    assert "tests/cli/basic v1" in ft.ok("catalog", "register", folder).stdout
    copy.write_text(copy.read_text(encoding="utf-8").replace("factor: 2", "factor: 3"))
    reg = ft.ok("catalog", "register", folder)
    assert "tests/cli/basic v2" in reg.stdout and "tests/cli/fan_in v1" in reg.stdout
    listing = {row["path"]: row for row in ft.json("catalog", "list")}
    assert listing["tests/cli/basic"]["version"] == 2
    assert listing["tests/cli/basic"]["versions"] == 2
    assert listing["tests/cli/fan_in"]["version"] == 1
    text = ft.ok("catalog", "list").stdout
    assert "tests/cli/basic  v2  (2 versions)" in text, text
    assert "tests/cli/fan_in  v1  (1 version)" in text, text

    assert ft.run("tests/cli/basic")["result"] == {"message": "hello: 18"}
    assert ft.run("tests/cli/basic@2")["result"] == {"message": "hello: 18"}
    assert ft.run("tests/cli/basic@1")["result"] == {"message": "hello: 12"}
    # overrides apply to catalog targets too
    assert ft.run("tests/cli/basic@1", "--set", "factor=1")["result"] == {"message": "hello: 6"}

    missing = ft("run", "tests/cli/basic@9", "--json")
    assert missing.returncode == 2 and missing.stdout == "", describe(missing)
    runs = ft.executions()
    assert len(runs) == 5
    assert {row["playbook"] for row in runs} == {"tests/cli/basic"}
    assert {row["status"] for row in runs} == {"completed"}
