"""Registering a playbook says what `validate` warns of (keys accepted but not acted on,
templates pasted into SQL), on the API and on the command line; it is recorded anyway."""

from __future__ import annotations

import warnings
from pathlib import Path

from typer.testing import CliRunner

from flowtide.cli import app as cli
from flowtide.store.sqlite import SQLiteStore
from flowtide.ui.local import create_local_app

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

HOST = "127.0.0.1:9"
WARNED = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: warned, path: tests/warned}
workload: {id: 1}
workflow:
  - step: start
    next:
      spec: {mode: exclusive, on_no_match: skip}
      arcs: [{step: query}]
  - step: query
    tool: {kind: duckdb, query: "SELECT * FROM range(10) WHERE range = {{ id }}"}
"""


def test_the_api_returns_the_warnings_and_records_the_playbook(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "flowtide.db")
    app = create_local_app(store, secret="tok", hosts=[HOST], home=tmp_path, prewarm=0)
    with TestClient(app, base_url=f"http://{HOST}") as c:
        c.headers["authorization"] = "Bearer tok"
        r = c.post("/api/catalog/register", json={"content": WARNED, "source_file": "w.yaml"})
        assert r.status_code == 201, r.text
        said = r.json()["warnings"]
        assert any("on_no_match" in w for w in said), said
        assert any("{{ id }}" in w and "params" in w for w in said), said
        assert r.json()["catalog_id"] == "tests/warned@1"
    store.close()


def test_catalog_register_prints_them(tmp_path: Path) -> None:
    playbook = tmp_path / "w.yaml"
    playbook.write_text(WARNED)
    done = CliRunner().invoke(
        cli, ["catalog", "register", str(playbook), "--home", str(tmp_path / "home")]
    )
    assert done.exit_code == 0, done.output
    assert "warning" in done.output and "on_no_match" in done.output
    assert "tests/warned v1" in done.output
