"""The server and `flowtide ui` serve the executions API, the catalog and the browser
session from the same routers (`flowtide.web`): every route `flowtide ui` shares with the
server takes the same parameters and bodies and answers the same documents, as their
OpenAPI documents say. (tests/distributed/test_read_parity.py compares what they answer
for the same run.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flowtide.server.app import create_app
from flowtide.server.settings import ServerSettings
from flowtide.store.sqlite import SQLiteStore
from flowtide.ui.local import create_local_app
from flowtide.web.openapi import openapi_document

#: What only `flowtide ui` serves: it runs executions itself.
LOCAL_ONLY = {("post", "/api/executions/{execution_id}/resume")}
#: The executions API and what else both apps serve.
SHARED_PREFIXES = (
    "/api/executions",
    "/api/execute",
    "/api/catalog",
    "/api/hooks",
    "/api/session",
    "/ui",
)
SHARED = {("get", "/api/whoami"), ("get", "/")}


@pytest.fixture(scope="module")
def documents(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    home = tmp_path_factory.mktemp("ui")
    store = SQLiteStore(Path(home) / "flowtide.db")
    try:
        local = create_local_app(
            store, secret="s", hosts=["127.0.0.1:1"], home=Path(home), prewarm=0
        )
        server = create_app(ServerSettings(db="postgresql://unused"))
        return openapi_document(server), openapi_document(local)
    finally:
        store.close()


def _operations(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(m, p): op for p, item in doc["paths"].items() for m, op in item.items()}


def _shared(key: tuple[str, str]) -> bool:
    return key in SHARED or key[1].startswith(SHARED_PREFIXES)


def test_the_local_app_serves_the_servers_executions_api_and_no_other(
    documents: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    server, local = (_operations(d) for d in documents)
    assert set(local) - set(server) == LOCAL_ONLY
    expected = {k for k in server if _shared(k)}
    # Those the server keeps to itself: what workers and admins ask of an execution.
    assert {p for _, p in expected - set(local)} <= {
        "/api/executions/{execution_id}/status",
        "/api/executions/{execution_id}/cancellation-check",
        "/api/executions/{execution_id}/finalize",
    }
    assert len(expected & set(local)) >= 17


def test_every_shared_route_is_described_the_same(
    documents: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    server_doc, local_doc = documents
    server, local = _operations(server_doc), _operations(local_doc)
    shared = sorted(set(server) & set(local))
    assert ("get", "/api/executions/{execution_id}/summary") in shared
    for key in shared:
        for part in ("parameters", "requestBody", "responses"):
            assert server[key].get(part) == local[key].get(part), (key, part)
    # The documents they name are one definition, not two alike.
    names = {
        ref.rsplit("/", 1)[-1] for key in shared for ref in _refs(server[key].get("responses", {}))
    }
    assert {"SummaryDocument", "StepDocument", "TimelineDocument", "EventDocument"} <= names
    for name in names:
        assert (
            server_doc["components"]["schemas"][name] == (local_doc["components"]["schemas"][name])
        ), name


def test_the_documents_are_described(documents: tuple[dict[str, Any], dict[str, Any]]) -> None:
    server, _ = documents
    ops = _operations(server)
    summary = ops[("get", "/api/executions/{execution_id}/summary")]
    schema = summary["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/SummaryDocument"}
    described = server["components"]["schemas"]["SummaryDocument"]
    assert {"steps", "progress", "graph", "taken", "run_here"} <= set(described["properties"])


def _refs(value: Any) -> list[str]:
    if isinstance(value, dict):
        found = [value["$ref"]] if isinstance(value.get("$ref"), str) else []
        return found + [r for v in value.values() for r in _refs(v)]
    if isinstance(value, list):
        return [r for v in value for r in _refs(v)]
    return []
