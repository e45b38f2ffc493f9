"""FLOWTIDE_SQL_STRICT on the catalog and execute routes (written once in flowtide.web,
so the embedded app `flowtide ui` serves them as the server does): off by default (a
pasted template registers and runs, as NoETL's fixtures need); on, registration and
an inline /api/execute answer 400 with the `validate --strict` messages, while a playbook
already in the catalog still runs by path."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowtide import settings
from flowtide.store.sqlite import SQLiteStore
from flowtide.ui.local import create_local_app

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

HOST = "127.0.0.1:9"
PASTED = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: probe, path: tests/strict/probe}
workload: {id: "0; DROP TABLE t2; SELECT 1"}
workflow:
  - step: find
    tool:
      kind: duckdb
      query: SELECT * FROM range(3) t(v) WHERE v = {{ id }}
"""
BOUND = PASTED.replace("{{ id }}", "$id").replace("probe}", "bound}") + (
    '      params: {id: "{{ id }}"}\n'
)


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.delenv("FLOWTIDE_SQL_STRICT", raising=False)
    settings.reset()
    store = SQLiteStore(tmp_path / "flowtide.db")
    app = create_local_app(store, secret="tok", hosts=[HOST], home=tmp_path, prewarm=0)
    with TestClient(app, base_url=f"http://{HOST}") as c:
        c.headers["authorization"] = "Bearer tok"
        yield c
    store.close()
    settings.reset()


def test_off_by_default_a_pasted_template_registers_and_runs(client: TestClient) -> None:
    r = client.post("/api/catalog/register", json={"content": PASTED})
    assert r.status_code == 201, r.text
    r = client.post("/api/execute", json={"playbook": PASTED})
    assert r.status_code == 201, r.text


def test_on_registration_and_inline_execute_are_refused(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Registered while off: it stays runnable by path once the setting is on.
    assert client.post("/api/catalog/register", json={"content": PASTED}).status_code == 201
    monkeypatch.setenv("FLOWTIDE_SQL_STRICT", "1")
    settings.reset()

    r = client.post("/api/catalog/register", json={"content": PASTED, "source_file": "p.yaml"})
    assert r.status_code == 400, r.text
    doc = r.json()["error"]
    assert doc["message"].startswith("refused: a template pasted into SQL (FLOWTIDE_SQL_STRICT)")
    [field] = doc["fields"]
    assert field["message"].startswith(
        "p.yaml:9: error: step 'find', field 'tool.query': template {{ id }} is pasted bare"
    )
    assert '`$id` with `params: {id: "{{ id }}"}`' in field["message"]
    assert (field["line"], field["step"], field["playbook_field"], field["position"]) == (
        9,
        "find",
        "tool.query",
        "bare",
    )

    r = client.post("/api/execute", json={"playbook": PASTED})
    assert r.status_code == 400, r.text
    assert "template {{ id }} is pasted bare" in r.json()["error"]["message"]

    # The bound form passes both; a catalog playbook runs by path.
    assert client.post("/api/catalog/register", json={"content": BOUND}).status_code == 201
    assert client.post("/api/execute", json={"playbook": BOUND}).status_code == 201
    assert client.post("/api/execute", json={"path": "tests/strict/probe"}).status_code == 201


def test_the_apps_state_wins_over_the_variable(client: TestClient) -> None:
    client.app.state.sql_strict = True  # type: ignore[attr-defined]
    assert client.post("/api/execute", json={"playbook": PASTED}).status_code == 400
