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

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import BaseSchema, Case

from flowtide.server.access import RULES

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
# Left out: ignored_auth, which re-sends a request with the credential it generates, but
# the token rides in every request's headers here (tests/distributed/test_access.py sends
# none, bad ones and the wrong roles); and positive_data_acceptance. Some rules join fields and no JSON Schema states
# them (exactly one of path/catalog_id/playbook; a keychain `execution_id` only with
# scope local/shared; `pool` only on worker tokens; `content` must be a playbook), so
# schema-valid requests are refused by design, with a 4xx naming the field.

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


@pytest.fixture(scope="module", params=ROLES)
def api(stack: Stack, request: pytest.FixtureRequest) -> BaseSchema:
    role: str = request.param
    config = schemathesis.Config.from_dict(
        {
            "headers": stack.headers(role),
            "request-timeout": 30,
            # The event stream of an execution that is still running never ends.
            "max-stream-events": 5,
            "generation": {"max-examples": MAX_EXAMPLES, "database": "none"},
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
