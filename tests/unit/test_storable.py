"""Text that cannot be stored (NUL, lone surrogates) is refused where it enters and never
breaks a read (issue 31: a python result holding '\\ud800' made GET /api/executions/{id}
answer 500 forever; the same in an /api/execute payload left the run stuck; a NUL in a
step name passed validate)."""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowtide.errors import PlaybookErrors
from flowtide.playbook.loader import parse_playbook
from flowtide.storable import bad_text, clean_text, clean_value
from flowtide.store.sqlite import SQLiteStore
from flowtide.ui.local import create_local_app

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

HOST = "127.0.0.1:9"

# Every code point, surrogates and NUL included.
ANY_TEXT = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF))


def _storable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


@given(ANY_TEXT)
def test_bad_text_is_found_exactly_and_cleaning_makes_it_storable(text: str) -> None:
    found = bad_text({"k": [text]}, "result")
    assert (found is None) == _storable(text)
    if found is not None:
        assert found[0] == "result['k'][0]"
    cleaned = clean_text(text)
    assert _storable(cleaned) and len(cleaned) == len(text)
    if _storable(text):
        assert cleaned == text


def test_keys_and_paths_are_named() -> None:
    assert bad_text({"ok": "😀 é", "rows": [{"a\x00b": 1}]}, "result") == (
        "result['rows'][0]['a\\x00b'] (its key)",
        "a NUL character",
    )
    assert bad_text(["fine", {"x": "\udc80"}]) == ("value[1]['x']", "a lone surrogate (U+DC80)")
    value = {"a": ["\ud800", "b"]}
    assert clean_value(value) == {"a": ["\ufffd", "b"]}
    fine = {"a": ["😀"]}
    assert clean_value(fine) is fine


def test_a_nul_in_a_step_name_is_refused_with_its_line() -> None:
    text = 'metadata: {name: nul}\nworkflow:\n  - step: "st\\0art"\n    tool: {kind: noop}\n'
    with pytest.raises(PlaybookErrors) as caught:
        parse_playbook(text, "nul.yaml")
    (error,) = caught.value.errors
    assert (error.file, error.line, error.field) == ("nul.yaml", 3, "workflow[0].step")
    assert "NUL" in error.message


PRINTS_AND_RETURNS = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: badtext, path: tests/badtext}
workload: {a: ok}
workflow:
  - step: start
    tool:
      kind: python
      code: |
        print("nul\\x00 and lone\\ud800 printed")
        result = {"fine": True}
    next: [broken]
  - step: broken
    tool:
      kind: python
      code: |
        result = {"x": "\\ud800", "y": "nul\\x00"}
"""


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    store = SQLiteStore(tmp_path / "flowtide.db")
    app = create_local_app(store, secret="tok", hosts=[HOST], home=tmp_path, prewarm=0)
    with TestClient(app, base_url=f"http://{HOST}") as c:
        c.headers["authorization"] = "Bearer tok"
        r = c.post("/api/catalog/register", json={"content": PRINTS_AND_RETURNS})
        assert r.status_code in (200, 201), r.text
        yield c
    store.close()


def _ended(client: TestClient, execution_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        r = client.get(f"/api/executions/{execution_id}")
        assert r.status_code == 200, r.text
        doc: dict[str, Any] = r.json()
        if doc["status"] not in ("running", "pending"):
            return doc
        time.sleep(0.1)
    raise AssertionError(f"execution {execution_id} did not end")


def test_a_result_that_cannot_be_stored_fails_its_step_and_every_read_answers(
    client: TestClient,
) -> None:
    r = client.post("/api/execute", json={"path": "tests/badtext"})
    assert r.status_code == 201, r.text
    execution_id = r.json()["execution_id"]
    doc = _ended(client, execution_id)
    assert doc["status"] == "failed"
    step = client.get(f"/api/executions/{execution_id}/steps/broken")
    assert step.status_code == 200, step.text
    text = json.dumps(step.json())
    assert "invalid_result" in text and "result['x']" in text
    events = client.get(f"/api/executions/{execution_id}/events")
    assert events.status_code == 200
    # What the first step printed is kept, its bad characters replaced.
    assert "nul\ufffd and lone\ufffd printed" in events.content.decode("utf-8")
    for path in ("", "/summary", "/steps/start"):
        assert client.get(f"/api/executions/{execution_id}{path}").status_code == 200


def test_text_stored_before_the_checks_is_answered_escaped_not_500(
    client: TestClient, tmp_path: Path
) -> None:
    r = client.post("/api/execute", json={"path": "tests/badtext"})
    execution_id = r.json()["execution_id"]
    _ended(client, execution_id)
    # An event written by an older flowtide, holding a lone surrogate.
    with SQLiteStore(tmp_path / "flowtide.db") as store:
        last = store.events(int(execution_id))[-1]
        store.append([replace(last, event_id=last.event_id + 1, payload={"old": "x\ud800"})])
    events = client.get(f"/api/executions/{execution_id}/events")
    assert events.status_code == 200
    assert "x\\ud800" in events.text  # JSON's escape: valid everywhere


def test_a_payload_that_cannot_be_stored_is_refused_naming_the_field(
    client: TestClient,
) -> None:
    body = b'{"path": "tests/badtext", "payload": {"a": "x\\ud800"}}'
    r = client.post("/api/execute", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert "workload['a']" in r.text and "surrogate" in r.text
    nul = b'{"path": "tests/badtext", "payload": {"a": {"b\\u0000": 1}}}'
    r = client.post("/api/execute", content=nul, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    listed = client.get("/api/executions").json()
    assert listed["items"] == []  # nothing started, nothing stuck
