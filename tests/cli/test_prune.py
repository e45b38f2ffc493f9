"""`flowtide prune`: the files of executions that ended long ago go; everything else
stays."""

from __future__ import annotations

from pathlib import Path

from .helpers import Flowtide, describe

STORES = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: stores, path: tests/prune/stores}
workflow:
  - step: keep
    tool: {kind: artifact, action: put, data: {rows: [1, 2, 3], note: "kept by reference"}}
"""


def test_prune_removes_only_what_ended_before_the_cutoff(ft: Flowtide, tmp_path: Path) -> None:
    playbook = tmp_path / "stores.yaml"
    playbook.write_text(STORES)
    doc = ft.json("run", playbook)
    assert doc["status"] == "completed", doc
    execution = doc["execution_id"]
    stored = ft.home / "data" / "results" / "disk" / execution
    assert any(p.is_file() for p in stored.rglob("*")), "the artifact was stored on disk"
    stranger = ft.home / "data" / "999"  # a folder this store knows nothing of
    stranger.mkdir(parents=True)
    (stranger / "x").write_text("x")

    recent = ft.json("prune", "--older-than", "1d")
    assert recent["executions"] == [] and recent["kept"] == {
        "running": 0,
        "recent": 1,
        "unknown": 1,
    }
    dry = ft.json("prune", "--older-than", "0s", "--dry-run")
    assert dry["executions"] == [execution] and dry["folders"] == 1 and dry["bytes"] > 0
    assert stored.exists()  # a dry run removes nothing

    done = ft.json("prune", "--older-than", "0s")
    assert done["executions"] == [execution] and not done["dry_run"]
    assert not stored.exists()
    assert (stranger / "x").exists()
    # The execution's record and events stay.
    assert ft.json("status", execution)["status"] == "completed"
    text = ft.ok("prune", "--older-than", "0s").stdout
    assert "removed 0 folders of 0 executions" in text


def test_prune_says_what_an_age_looks_like(ft: Flowtide) -> None:
    proc = ft("prune", "--older-than", "soon")
    assert proc.returncode == 2, describe(proc)
    assert "30d, 12h, 90m" in proc.stderr
