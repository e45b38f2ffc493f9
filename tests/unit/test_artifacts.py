"""Results by reference (flowtide.artifacts), the artifact tool, and where the step
runner applies the threshold. Local folders and fsspec's memory:// filesystem."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from flowtide import artifacts, settings
from flowtide.errors import ToolError
from flowtide.playbook import parse_playbook
from flowtide.runtime import pipeline
from flowtide.runtime.pipeline import StepRunner
from flowtide.tools.artifact import ArtifactTool
from flowtide.tools.base import ToolContext

BIG = {"status": "ok", "count": 3, "items": [{"id": i, "data": "x" * 40_000} for i in range(3)]}


@pytest.fixture(autouse=True)
def _no_store_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FLOWTIDE_RESULT_STORE", "FLOWTIDE_RESULT_STORE_KV", "FLOWTIDE_RESULT_STORE_S3"):
        monkeypatch.delenv(name, raising=False)


def ctx(tmp_path: Path, **kw: Any) -> ToolContext:
    return ToolContext(
        execution_id=7, step="load", base_dir=tmp_path, data_dir=tmp_path / "data", **kw
    )


def test_output_spec_forms() -> None:
    assert artifacts.output_spec(None, {}) == artifacts.OutputSpec()
    spec = artifacts.output_spec({"output_select": ["status", "a.b"], "store": {"kind": "auto"}})
    assert spec.select == ("status", "a.b") and spec.store == "auto" and spec.declared
    assert artifacts.output_spec(None, ["x"]).select == ("x",)
    nats = artifacts.output_spec({"store": {"kind": "object"}, "inline_max_bytes": 0})
    assert nats.store == "disk" and nats.inline_max_bytes == 0
    http = artifacts.output_spec(None, None, {"strategy": "size_threshold", "threshold_kb": 100})
    assert http.inline_max_bytes == 102_400
    with pytest.raises(ToolError, match="store kind 'ftp'"):
        artifacts.output_spec({"store": {"kind": "ftp"}})


def test_extracted_fields_follow_noetl() -> None:
    assert artifacts.extract(BIG, ["status", "items[1].id", "missing"]) == {
        "status": "ok",
        "id": 1,
    }
    auto = artifacts.extract(
        {"status": "ok", "n": 2, "tags": [1, 2], "rows": list(range(50)), "meta": {"page": 3}}, ()
    )
    assert auto == {"status": "ok", "n": 2, "tags": [1, 2], "rows_count": 50, "meta_page": 3}


def test_externalize_then_load(tmp_path: Path) -> None:
    text = json.dumps(BIG, separators=(",", ":"))
    spec = artifacts.output_spec({"output_select": ["status", "count"]})
    wrapped = artifacts.externalize(
        BIG, text, spec, execution_id=7, step="make", data_dir=tmp_path / "data"
    )
    assert wrapped["status"] == "ok" and wrapped["count"] == 3
    assert wrapped["_store"] == "kv" and wrapped["_size_bytes"] == len(text)
    ref = wrapped["_ref"]
    assert ref["kind"] == "result_ref" and ref["ref"].startswith(
        "flowtide://execution/7/result/make/"
    )
    assert ref["uri"].startswith((tmp_path / "data" / "results" / "kv" / "7" / "make").as_uri())
    assert ref["meta"]["compression"] == "gzip" and ref["meta"]["bytes"] == len(text)
    assert wrapped["_preview"]["items"] == "[3 items]"
    # by the ref, by the logical ref string, by the result holding it
    for given in (ref, ref["ref"], wrapped):
        value, uri, size = artifacts.load(given, data_dir=tmp_path / "data")
        assert value == BIG and uri == ref["uri"] and size == ref["meta"]["stored_bytes"]
    # 1 MB and more goes to the disk tier
    big = {"blob": "y" * (1024 * 1024)}
    assert (
        artifacts.externalize(
            big, json.dumps(big), spec, execution_id=7, step="m", data_dir=tmp_path
        )["_store"]
        == "disk"
    )


def test_tier_locations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ToolError, match="FLOWTIDE_RESULT_STORE_S3"):
        artifacts.tier_root("s3", tmp_path)
    monkeypatch.setenv("FLOWTIDE_RESULT_STORE", str(tmp_path / "shared"))
    assert artifacts.tier_root("s3", None) == str(tmp_path / "shared" / "s3")
    monkeypatch.setenv("FLOWTIDE_RESULT_STORE_KV", "memory://kv-tier/")
    assert artifacts.tier_root("kv", None) == "memory://kv-tier"


def test_fsspec_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("fsspec")
    monkeypatch.setenv("FLOWTIDE_RESULT_STORE", "memory://flowtide-test")
    spec = artifacts.output_spec({"store": {"kind": "s3"}})
    wrapped = artifacts.externalize(
        BIG, json.dumps(BIG), spec, execution_id=9, step="s", data_dir=None
    )
    assert wrapped["_store"] == "s3"
    assert wrapped["_ref"]["uri"].startswith("memory://flowtide-test/s3/9/s/")
    assert artifacts.load(wrapped["_ref"]["ref"])[0] == BIG


def test_artifact_tool_get_and_put(tmp_path: Path) -> None:
    tool = ArtifactTool()
    c = ctx(tmp_path)
    put = tool.run(
        {"kind": "artifact", "action": "put", "data": [1, 2, 3], "uri": "out/list.json"}, c
    )
    assert put["uri"] == (tmp_path / "out" / "list.json.gz").as_uri() and put["compressed"]
    assert json.loads(gzip.decompress((tmp_path / "out" / "list.json.gz").read_bytes())) == [
        1,
        2,
        3,
    ]
    # NoETL's envelope for what is not an object without `data`
    got = tool.run({"kind": "artifact", "input": {"result_ref": put["result_ref"]}}, c)
    assert got == {
        "status": "success",
        "data": [1, 2, 3],
        "uri": put["uri"],
        "size_bytes": put["size_bytes"],
    }
    assert c.call_meta["artifact"]["action"] == "get"
    plain = tool.run(
        {
            "kind": "artifact",
            "action": "put",
            "data": {"a": 1},
            "path": str(tmp_path / "a.json"),
            "compress": False,
        },
        c,
    )
    assert (tmp_path / "a.json").read_text() == '{"a":1}'
    assert tool.run({"kind": "artifact", "uri": plain["uri"]}, c) == {"a": 1}
    assert tool.run(
        {"kind": "artifact", "uri": "artifact://localfs" + str(tmp_path / "a.json")}, c
    ) == {"a": 1}
    with pytest.raises(ToolError) as info:
        tool.run({"kind": "artifact", "uri": "nothing/here.json"}, c)
    assert info.value.kind == "not_found"
    with pytest.raises(ToolError, match="expected get or put"):
        tool.run({"kind": "artifact", "action": "delete"}, c)


def step_of(text: str) -> Any:
    playbook = parse_playbook(text, "pb.yaml")
    return playbook, playbook.steps["start"]


def run_step(tmp_path: Path, body: str) -> Any:
    playbook, step = step_of(body)
    runner = StepRunner(playbook, data_dir=tmp_path / "data")
    return runner.run(step, {"workload": {}}, {}, execution_id=11)


CODE = "result = {'status': 'ok', 'count': 3, 'items': [{'d': 'x' * 40000} for _ in range(3)]}"


def test_the_runner_stores_large_results_by_reference(tmp_path: Path) -> None:
    declared = run_step(
        tmp_path,
        f"""\
workflow:
  - step: start
    tool: {{kind: python, code: "{CODE}"}}
    output: {{output_select: [status, count]}}
""",
    )
    assert declared.status == "ok"
    assert declared.result["count"] == 3 and declared.result["_store"] == "kv"
    assert "items" not in declared.result
    # Without `output`, a result events can carry stays whole (as before this change).
    silent = run_step(
        tmp_path,
        f"""\
workflow:
  - step: start
    tool: {{kind: python, code: "{CODE}"}}
""",
    )
    assert len(silent.result["items"]) == 3 and "_ref" not in silent.result


def test_over_the_event_limit_goes_by_reference_or_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWTIDE_MAX_RESULT_BYTES", "50000")
    settings.reset()
    body = f"""\
workflow:
  - step: start
    tool: {{kind: python, code: "{CODE}"}}
"""
    out = run_step(tmp_path, body)
    assert out.status == "ok" and out.result["items_count"] == 3 and out.result["_store"] == "kv"
    # A result holding a credential value is never written to the store.
    spec = artifacts.OutputSpec()
    text = json.dumps(BIG)
    with pytest.raises(ToolError) as info:
        pipeline._recorded(BIG, text, spec, {"xxxxxxxx"}, lambda v, t: {})
    assert info.value.kind == "result_too_large"
    # The store has a limit too: past it, nothing is written and the step fails.
    monkeypatch.setenv("FLOWTIDE_MAX_STORED_RESULT_BYTES", "60000")
    settings.reset()
    stored: list[str] = []
    with pytest.raises(ToolError) as info:
        pipeline._recorded(BIG, text, spec, set(), lambda v, t: stored.append(t) or {})
    assert info.value.kind == "result_too_large" and "FLOWTIDE_MAX_STORED" in info.value.message
    assert stored == []


def test_the_loader_checks_output_and_artifact() -> None:
    from flowtide.errors import PlaybookErrors

    with pytest.raises(PlaybookErrors) as info:
        parse_playbook(
            "workflow:\n  - step: start\n    tool: {kind: artifact, action: delete}\n"
            "    output: 12\n",
            "pb.yaml",
        )
    assert [(e.line, e.field) for e in info.value.errors] == [
        (3, "tool.action"),
        (4, "output"),
    ]


@pytest.mark.parametrize("name", ["..", ".", ""])
def test_a_step_named_dots_stores_inside_its_executions_folder(tmp_path: Path, name: str) -> None:
    ref = artifacts.put({"a": 1}, execution_id=7, name=name, tier="disk", data_dir=tmp_path)
    assert ref["ref"].startswith("flowtide://execution/7/result/result/")
    root = Path(artifacts.tier_root("disk", tmp_path))
    [stored] = [p for p in root.rglob("*.json.gz")]
    assert stored.parent == root / "7" / "result"
    assert artifacts.local_path(artifacts.location_of(ref, tmp_path, tmp_path)) == stored


def test_a_reference_with_dot_dot_parts_is_not_a_stored_results_name(tmp_path: Path) -> None:
    for ref in (
        "flowtide://execution/../result/s/k",
        "flowtide://execution/1/result/../k",
        "flowtide://execution/1/result/s/..",
    ):
        location = artifacts.location_of({"ref": ref}, tmp_path, tmp_path)
        assert location == ref  # taken as the URL it is, never a path built from its parts
