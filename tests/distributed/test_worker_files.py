"""A worker's in-process tools stay inside its file roots (`flowtide.tools.files`).

The attack: an operator's playbook asks a worker to read what the worker process holds —
its token in /proc/self/environ, the flowtide home's files — through a tool that runs in
the worker itself (duckdb, transfer, artifact, script files) rather than a python step
(which runs as another user in a child process). Each attempt fails with a permission
error naming the step; the same tools still work on files of the working directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .stack import Stack

_counter = iter(range(1_000_000))


def _run(stack: Stack, body: str) -> dict[str, Any]:
    path = stack.root / f"files_{next(_counter)}.yaml"
    path.write_text(body)
    proc = stack.run("run", path, "--json")
    assert proc.stdout, proc.stderr + stack.log("worker0")
    return dict(json.loads(proc.stdout))


def _playbook(name: str, tool: str) -> str:
    return (
        "apiVersion: noetl.io/v2\nkind: Playbook\n"
        f"metadata: {{name: {name}, path: tests/files/{name}}}\n"
        "workflow:\n  - step: only\n    tool:\n"
        + "".join(f"      {line}\n" for line in tool.strip().splitlines())
    )


def _refused(doc: dict[str, Any], stack: Stack) -> str:
    assert doc["status"] == "failed", doc
    message = str(doc["error"]["message"])
    # Whatever the message quotes, it holds no credential of the worker.
    assert stack.tokens["worker"] not in json.dumps(doc)
    return message


def test_duckdb_cannot_read_the_workers_environment(stack: Stack) -> None:
    doc = _run(
        stack,
        _playbook(
            "duck_environ",
            "kind: duckdb\nquery: \"SELECT content FROM read_text('/proc/self/environ')\"",
        ),
    )
    assert "Permission Error" in _refused(doc, stack)


def test_duckdb_cannot_read_the_home_nor_undo_its_confinement(stack: Stack) -> None:
    secret = stack.root / "home" / "planted.csv"
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_text("v\nsecret-in-home\n")
    for query in (
        f"SELECT * FROM read_csv('{secret}')",
        "SET enable_external_access = true",
        f"ATTACH '{stack.root}/home/x.duckdb' AS x",
    ):
        doc = _run(stack, _playbook("duck_home", f"kind: duckdb\nquery: {json.dumps(query)}"))
        message = _refused(doc, stack)
        assert "secret-in-home" not in message
        assert "Permission Error" in message or "locked" in message, message


def test_a_transfer_duckdb_query_is_confined_too(stack: Stack) -> None:
    tool = (
        "kind: transfer\n"
        "source: {type: duckdb, query: \"SELECT content FROM read_text('/proc/self/environ')\"}\n"
        f"target: {{type: json, path: {stack.root}/environ.json}}"
    )
    doc = _run(stack, _playbook("transfer_duck", tool))
    assert "Permission Error" in _refused(doc, stack)
    assert not (stack.root / "environ.json").exists()


def test_duckdb_still_reads_and_writes_the_working_directory(stack: Stack) -> None:
    (stack.root / "data").mkdir(exist_ok=True)
    (stack.root / "data" / "in.csv").write_text("n\n1\n2\n3\n")
    query = (
        f"COPY (SELECT sum(n) AS total FROM read_csv('{stack.root}/data/in.csv'))"
        f" TO '{stack.root}/data/out.csv'; SELECT * FROM read_csv('{stack.root}/data/out.csv')"
    )
    doc = _run(stack, _playbook("duck_ok", f"kind: duckdb\nquery: {json.dumps(query)}"))
    assert doc["status"] == "completed", doc["error"]
    assert doc["steps"]["only"]["result"] == [{"total": 6}]


def test_transfer_artifact_and_script_files_stay_inside(stack: Stack) -> None:
    link = stack.root / "innocent.csv"
    link.unlink(missing_ok=True)
    link.symlink_to("/proc/self/environ")
    attempts = {
        "transfer_environ": (
            "kind: transfer\n"
            "source: {type: csv, path: /proc/self/environ}\n"
            f"target: {{type: json, path: {stack.root}/out.json}}"
        ),
        # A link inside the working directory leads nowhere outside it.
        "transfer_link": (
            "kind: transfer\n"
            f"source: {{type: csv, path: {link}}}\n"
            f"target: {{type: json, path: {stack.root}/out.json}}"
        ),
        "artifact_get": "kind: artifact\naction: get\nuri: file:///proc/self/environ",
        "artifact_put": (
            f"kind: artifact\naction: put\ndata: {{a: 1}}\nuri: {stack.root}/home/x.json"
        ),
        "artifact_chained": (
            "kind: artifact\naction: get\nuri: 'simplecache::file:///proc/self/environ'"
        ),
        "python_script": "kind: python\nscript: {uri: /proc/self/environ, source: {type: file}}",
    }
    for name, tool in attempts.items():
        doc = _run(stack, _playbook(name, tool))
        message = _refused(doc, stack)
        assert "outside the folders this worker's steps may use" in message or (
            "on this worker a location is" in message
        ), (name, message)
        assert doc["error"]["step"] == "only"
    assert not (stack.root / "home" / "x.json.gz").exists()


def test_artifact_round_trip_inside_the_working_directory(stack: Stack) -> None:
    target = stack.root / "artifacts" / "kept.json"
    doc = _run(
        stack,
        "apiVersion: noetl.io/v2\nkind: Playbook\n"
        "metadata: {name: art_ok, path: tests/files/art_ok}\n"
        "workflow:\n"
        "  - step: put\n"
        f"    tool: {{kind: artifact, action: put, data: {{n: 7}}, uri: '{target}'}}\n"
        "    next: [get]\n"
        "  - step: get\n"
        "    tool: {kind: artifact, action: get, result_ref: '{{ put.result_ref }}'}\n",
    )
    assert doc["status"] == "completed", doc["error"]
    assert doc["steps"]["get"]["result"] == {"n": 7}
    assert Path(f"{target}.gz").exists()
