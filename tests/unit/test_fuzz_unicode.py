"""Arbitrary Unicode everywhere JSON enters: every JSON body the in-process API accepts
gets generated JSON whose text holds any code point (lone surrogates, NUL,
non-characters, long strings), both free-form and shaped like the operation's own
fields; python steps return and print such text. Never a 5xx; a 4xx names what was
wrong; a run ends, and every read of it answers 200 with valid JSON."""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from flowtide.errors import ToolError
from flowtide.runtime.pipeline import _json_result
from flowtide.storable import bad_text
from flowtide.store.sqlite import SQLiteStore
from flowtide.ui.local import create_local_app

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

HOST = "127.0.0.1:9"
FUZZ = settings(
    max_examples=20,
    deadline=timedelta(seconds=5),
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
pytestmark = pytest.mark.timeout(180)

# Every code point; some chosen often: NUL, lone surrogates, non-characters, the BOM.
ODD = ["\x00", "\ud800", "\udfff", "\udc80", "\ufffe", "\uffff", "\U0010ffff", "\ufeff"]
CHAR = st.one_of(st.characters(min_codepoint=0, max_codepoint=0x10FFFF), st.sampled_from(ODD))
TEXT = st.one_of(
    st.text(CHAR, max_size=24),
    st.builds(
        lambda c, n: c * n, st.sampled_from(["x", "\ud800", "é", "\x00"]), st.integers(1, 5000)
    ),
)
SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    TEXT,
)
JSON = st.recursive(
    SCALAR,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=12,
)


def _app(tmp: Path) -> tuple[FastAPI, SQLiteStore]:
    store = SQLiteStore(tmp / "flowtide.db")
    app = create_local_app(store, secret="tok", hosts=[HOST], home=tmp, prewarm=0)
    return app, store


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    tmp = tmp_path_factory.mktemp("fuzz-unicode")
    app, store = _app(tmp)
    with TestClient(app, base_url=f"http://{HOST}") as c:
        c.headers["authorization"] = "Bearer tok"
        r = c.post("/api/catalog/register", json={"content": PLAYBOOK})
        assert r.status_code in (200, 201), r.text
        yield c
    store.close()


def _operations() -> list[tuple[str, str, list[str]]]:
    """(method, path, the body's top-level field names) of every operation with a JSON
    body, from the app's own OpenAPI document."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        app, store = _app(Path(tmp))
        spec = app.openapi()
        store.close()
    found = []
    for path, operations in spec["paths"].items():
        for method, op in operations.items():
            content = op.get("requestBody", {}).get("content", {})
            if "application/json" not in content:
                continue
            schema = content["application/json"].get("schema", {})
            if "$ref" in schema:
                name = schema["$ref"].rsplit("/", 1)[1]
                schema = spec["components"]["schemas"][name]
            found.append((method.upper(), path, sorted(schema.get("properties", {}))))
    return found


OPERATIONS = _operations()


def _url(path: str) -> str:
    return path.replace("{execution_id}", "1").replace("{name}", "fuzz")


def test_the_operations_are_found() -> None:
    paths = {path for _, path, _ in OPERATIONS}
    assert {"/api/execute", "/api/catalog/register", "/api/schedules"} <= paths


#: Bodies that are accepted as they are; one field at a time gets arbitrary text or JSON.
VALID: dict[str, dict[str, Any]] = {
    "/api/execute": {"path": "tests/anytext", "payload": {"value": "{}"}},
    "/api/catalog/validate": {"content": "PLAYBOOK"},
    "/api/catalog/register": {"content": "PLAYBOOK"},
    "/api/schedules": {"name": "s", "playbook": "tests/anytext", "every": "1h", "paused": True},
    "/api/schedules/{name}/backfill": {"start": "2024-01-01T00:00:00Z", "end": "2024-01-02"},
    "/api/hooks": {
        "name": "h",
        "playbook": "tests/anytext",
        "secret": "s3cret-s3cret-s3cret",
        "workload": {"a": 1},
    },
    "/api/subscriptions": {
        "name": "n",
        "playbook": "tests/anytext",
        "subject": "a.b",
        "url": "nats://127.0.0.1:9",
        "paused": True,
    },
    "/api/session": {"token": "tok"},
}


def _near_valid(path: str) -> st.SearchStrategy[Any]:
    base = VALID.get(path)
    if base is None:
        return JSON
    base = {k: PLAYBOOK if v == "PLAYBOOK" else v for k, v in base.items()}

    def value_for(key: str) -> st.SearchStrategy[Any]:
        if key == "content":  # a playbook holding the text in its name
            return TEXT.map(
                lambda t: PLAYBOOK.replace("{name: anytext,", f"{{name: {json.dumps(t)},")
            )
        if isinstance(base[key], dict):  # keys and values
            return st.dictionaries(TEXT, JSON, min_size=1, max_size=3)
        if isinstance(base[key], str):
            return TEXT
        return JSON

    return st.sampled_from(sorted(base)).flatmap(
        lambda key: value_for(key).map(lambda value: {**base, key: value})
    )


def _shaped(fields: list[str]) -> st.SearchStrategy[Any]:
    """A body holding the operation's own field names, with arbitrary values."""
    if not fields:
        return JSON
    return st.dictionaries(st.sampled_from(fields), JSON, min_size=1, max_size=len(fields))


def _names_the_field(status: int, doc: Any) -> bool:
    """A 4xx answer says what was wrong; a refused body (400, 422) also says where: the
    field, or each field."""
    error = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(error, dict) or not error.get("message"):
        return False
    if status not in (400, 422):
        return True
    fields = error.get("fields") or []
    return bool(error.get("field")) or (
        bool(fields) and all(isinstance(f, dict) and f.get("field") for f in fields)
    )


@pytest.mark.parametrize(("method", "path", "fields"), OPERATIONS, ids=lambda v: str(v))
@FUZZ
@given(data=st.data())
def test_every_json_body_takes_any_unicode(
    client: TestClient, method: str, path: str, fields: list[str], data: st.DataObject
) -> None:
    body = data.draw(st.one_of(JSON, _shaped(fields), _near_valid(path)), label="body")
    # JSON's escapes carry what UTF-8 cannot (a lone surrogate): the client's own choice.
    raw = json.dumps(body).encode()
    r = client.request(
        method, _url(path), content=raw, headers={"content-type": "application/json"}
    )
    assert r.status_code < 500, (r.status_code, r.text)
    if r.status_code >= 400:
        doc = r.json()  # valid JSON
        assert _names_the_field(r.status_code, doc), (r.status_code, r.text)


# -- python steps returning and printing any text ------------------------------------------

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: anytext, path: tests/anytext}
workload: {value: null}
workflow:
  - step: start
    tool:
      kind: python
      input: {value: "{{ workload.value }}"}
      code: |
        import json
        value = json.loads(value)
        print(value["printed"])
        result = value["result"]
"""


def _ended(client: TestClient, execution_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        r = client.get(f"/api/executions/{execution_id}")
        assert r.status_code == 200, r.text
        doc: dict[str, Any] = r.json()
        if doc["status"] not in ("running", "pending"):
            return doc
        time.sleep(0.05)
    raise AssertionError(f"execution {execution_id} did not end")


@settings(FUZZ, max_examples=6)
@given(result=JSON, printed=TEXT)
@example(result={"k\ud800": "v"}, printed="lone \udc80 and nul \x00")
@example(result={"k": ["nul\x00"]}, printed="\ufffe\uffff")
@example(result="\U0010ffff\ufeff", printed="\x00" * 3000)
def test_a_python_step_returning_any_text_ends_and_reads_answer(
    client: TestClient, result: Any, printed: str
) -> None:
    """Real runs: the text reaches the step through the workload as JSON's escapes (which
    a workload may hold), so the code builds it with every code point."""
    value = json.dumps({"result": result, "printed": printed})
    r = client.post("/api/execute", json={"path": "tests/anytext", "payload": {"value": value}})
    assert r.status_code == 201, r.text
    execution_id = r.json()["execution_id"]
    doc = _ended(client, execution_id)
    step = client.get(f"/api/executions/{execution_id}/steps/start")
    assert step.status_code == 200, step.text
    step_doc = step.json()
    text = json.dumps(step_doc)
    if bad_text(result) is not None:
        assert doc["status"] == "failed" and "invalid_result" in text, text
    else:
        assert doc["status"] == "completed", doc
    for suffix in ("", "/summary", "/events", "/steps/start"):
        r = client.get(f"/api/executions/{execution_id}{suffix}")
        assert r.status_code == 200, (suffix, r.text)
        r.content.decode("utf-8")  # valid UTF-8
        r.json()


@settings(FUZZ, max_examples=300, deadline=None)
@given(result=JSON)
def test_the_result_check_refuses_exactly_what_cannot_be_stored(result: Any) -> None:
    """The path every tool's result takes (cheap: many examples): refused with kind
    `invalid_result` naming where, or kept as it is, storable."""
    try:
        kept = _json_result(result)
    except ToolError as exc:
        assert exc.kind == "invalid_result", exc
        found = bad_text(result, "result")
        assert found is not None and exc.data == {"path": found[0]}, (exc, found)
        assert found[0] in exc.message
        return
    assert bad_text(kept) is None, kept
    json.dumps(kept, allow_nan=False).encode("utf-8")


# -- what the fuzzing found ----------------------------------------------------------------


def _post(client: TestClient, path: str, body: Any) -> Any:
    raw = json.dumps(body).encode()
    return client.post(path, content=raw, headers={"content-type": "application/json"})


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/hooks", {**VALID["/api/hooks"], "workload": {"": {"\ud800": None}}}),
        ("/api/schedules", {**VALID["/api/schedules"], "workload": {"a": "nul\x00"}}),
        ("/api/subscriptions", {**VALID["/api/subscriptions"], "workload": {"k\udfff": 1}}),
    ],
    ids=["hook", "schedule", "subscription"],
)
def test_a_trigger_workload_that_cannot_be_stored_is_refused_naming_it(
    client: TestClient, path: str, body: dict[str, Any]
) -> None:
    """It was stored, and its answer (holding it) failed with a 500."""
    r = _post(client, path, body)
    assert r.status_code in (400, 422), r.text
    assert "workload[" in r.text and ("surrogate" in r.text or "NUL" in r.text), r.text
    error = r.json()["error"]
    assert error.get("field") == "workload" or error["fields"][0]["field"] == "workload", error


def test_a_playbook_name_too_long_for_a_file_is_no_server_error(client: TestClient) -> None:
    """The local store probes whether a trigger's playbook names a file: a name longer
    than a file name may be made the probe fail (500)."""
    r = _post(client, "/api/hooks", {**VALID["/api/hooks"], "playbook": "x" * 300})
    assert r.status_code == 404, r.text
