"""schemathesis over the API's own /openapi.json, on a live server: no 5xx, and every
answer (status, content type, body, headers, 405s and their Allow) is one the document
promises, so a client generated from it is never surprised.

Each role runs the operations it can reach: an admin all of them, a worker those of its
rule, and a reader all of them again (mostly 403s, which must conform too). Examples are
bounded (`MAX_EXAMPLES` per operation and phase) to keep the module near a minute on a
two-core machine.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import BaseSchema, Case

from flowtide.web.access import RULES

from .stack import Stack

#: No worker: nothing here needs a command run, and schemathesis registers and
#: deregisters worker ids of its own, which must not be the stack's.
STACK_WORKERS = 0
MAX_EXAMPLES = 10

CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "response_headers_conformance",
    "negative_data_rejection",
    "missing_required_header",
    "unsupported_method",
    "allow_header_conformance",
)
# Left out:
# - ignored_auth: it re-sends a request with a credential it makes up, but here the token
#   rides in every request's headers (tests/distributed/test_access.py sends none, bad
#   ones and the wrong roles);
# - positive_data_acceptance: some rules join fields, which no JSON Schema states (exactly
#   one of path/catalog_id/playbook; a keychain `execution_id` only with scope
#   local/shared; `pool` only on worker tokens; `content` must be a playbook), so
#   schema-valid requests are refused by design, with a 4xx naming the field.

#: What refusing invalid data may look like. 413: the generator builds bodies past the
#: server's 16 MiB cap (1000 reports of events), which the Gate refuses unread.
REFUSALS = [400, 401, 403, 404, 405, 406, 409, 413, 415, 422]

ROLES = ("admin", "worker", "reader")


def _label(method: str, declared: str) -> str:
    # The document writes `{path:path}` and `{event_id:int}` without their convertors.
    path = re.sub(r"\{(\w+):\w+\}", r"{\1}", declared)
    return f"{method} {path}"


def _left_out(role: str) -> list[str]:
    """Labels of the operations `role` does not run."""
    # Revoking a token by id or name (which may be learnt from GET /api/tokens) would
    # revoke the tokens this module calls with.
    out = ["DELETE /api/tokens/{token}"]
    if role == "worker":
        # A worker is refused all but these, as the reader run shows for people's routes.
        out += [_label(m, p) for (m, p), rule in RULES.items() if "worker" not in rule.roles]
    return out


SEED = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: seed, path: tests/schemathesis/seed}
workflow:
  - step: only
    tool: {kind: python, code: "result = {'ok': True}"}
"""


@pytest.fixture(scope="module")
def seeded(stack: Stack) -> dict[str, list[Any]]:
    """Rows for the generated requests to find, as dictionaries of values schemathesis
    draws parameters from half of the time: a catalog entry with a keychain entry, a
    credential, and executions with a variable. The executions are finalized: no worker
    runs them, and the event stream of a running one would wait for events to come."""
    executions: list[Any] = []
    with stack.client("admin") as admin:
        r = admin.post("/api/catalog/register", json={"content": SEED})
        assert r.status_code == 201, r.text
        catalog_id = r.json()["catalog_id"]
        r = admin.post(f"/api/keychain/{catalog_id}/seed_token", json={"data": {"t": "x" * 24}})
        assert r.status_code == 200, r.text
        r = admin.post("/api/credentials", json={"name": "seed_pg", "data": {"password": "p" * 24}})
        assert r.status_code == 201, r.text
        for status in ("completed", "failed"):
            r = admin.post("/api/execute", json={"catalog_id": catalog_id})
            assert r.status_code == 201, r.text
            execution_id = r.json()["execution_id"]
            executions.append(int(execution_id))
            r = admin.post(f"/api/vars/{execution_id}", json={"variables": {"seed": [1, "a"]}})
            assert r.status_code == 200, r.text
            body = {"status": status, "reason": "seeded for schemathesis"}
            r = admin.post(f"/api/executions/{execution_id}/finalize", json=body)
            assert r.status_code == 200, r.text
    path = catalog_id.partition("@")[0]
    return {
        "executions": executions,
        "catalog_ids": [catalog_id, path],
        "paths": [path],
        "names": ["seed", "seed_pg", "seed_token"],
    }


@pytest.fixture(scope="module", params=ROLES)
def api(stack: Stack, seeded: dict[str, list[Any]], request: pytest.FixtureRequest) -> BaseSchema:
    role: str = request.param
    config = schemathesis.Config.from_dict(
        {
            "headers": stack.headers(role),
            "request-timeout": 30,
            # The event stream of an execution that is still running never ends.
            "max-stream-events": 5,
            # Derandomized: CI fails when the server or its document changes, not by the
            # luck of a draw (raise MAX_EXAMPLES and drop this to hunt further).
            "generation": {
                "max-examples": MAX_EXAMPLES,
                "database": "none",
                "deterministic": True,
            },
            "dictionaries": {name: {"values": values} for name, values in seeded.items()},
            "parameters": {
                key: {"dictionary": name, "probability": 0.5}
                for key, name in (
                    ("path.execution_id", "executions"),
                    ("path.catalog_id", "catalog_ids"),
                    ("query.catalog_id", "catalog_ids"),
                    ("path.path", "paths"),
                    ("path.name", "names"),
                )
            },
            "phases": {
                "examples": {"enabled": True},
                "coverage": {"enabled": True},
                "fuzzing": {"enabled": True},
                "stateful": {"enabled": False},
            },
            "checks": {
                "enabled": False,
                **{name: {"enabled": True} for name in CHECKS},
                "negative_data_rejection": {"enabled": True, "expected-statuses": REFUSALS},
            },
            "operations": [{"include-name": _left_out(role), "enabled": False}],
        }
    )
    return schemathesis.openapi.from_url(
        f"{stack.url}/openapi.json", config=config, headers=stack.headers(role), timeout=30
    )


schema = schemathesis.pytest.from_fixture("api")


@pytest.fixture(autouse=True)
def _node_id(request: pytest.FixtureRequest) -> None:
    # schemathesis 4.32 names each operation's subtest by rewriting the test item's
    # private `_nodeid`, which pytest 9.2 items no longer have.
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid


@pytest.mark.postgres
@pytest.mark.nats
@pytest.mark.timeout(300)
@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_the_api_answers_as_its_document_says(case: Case) -> None:
    case.call_and_validate()


def test_a_405_names_every_method_of_the_path(stack: Stack) -> None:
    # GET, POST and DELETE of /api/vars/{execution_id} are three routes: Starlette's
    # own 405 named the first one's method only, in a body of its own format.
    with stack.client("admin") as admin:
        r = admin.options("/api/vars/1")
    assert r.status_code == 405
    assert r.headers["allow"] == "DELETE, GET, POST"
    assert r.json()["error"] == {"status": 405, "message": "Method Not Allowed"}
