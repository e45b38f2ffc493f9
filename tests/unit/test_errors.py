"""One error tree: what flowtide raises derives from FlowtideError, and each error meets
its HTTP status and its exit status in one place."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest

import flowtide
from flowtide.errors import (
    EXIT_FAILED,
    EXIT_INVALID,
    AuthError,
    ClaimConflict,
    CredentialError,
    ExecutionFinished,
    FlowtideError,
    NotFoundError,
    PlaybookError,
    ServerError,
    StoreError,
    TemplateError,
    ToolError,
    WrongPool,
    exit_code,
)

_BUILTIN_ERRORS = {
    name
    for name in dir(builtins)
    if isinstance(getattr(builtins, name), type)
    and issubclass(getattr(builtins, name), BaseException)
}
#: Public exception classes outside the tree, each with why.
_OUTSIDE = {
    # Raised and caught inside the sandbox; flowtide.playbook.template turns it into a
    # TemplateError before it leaves.
    "LimitExceeded",
}


def test_every_public_exception_class_is_in_the_tree() -> None:
    """A public class whose bases are only builtin exceptions is a root of its own."""
    root = Path(flowtide.__file__).parent
    roots = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
                continue
            bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
            if bases and all(b in _BUILTIN_ERRORS for b in bases):
                roots.append(f"{path.relative_to(root)}:{node.name}")
    assert sorted(r for r in roots if r.rsplit(":", 1)[1] not in _OUTSIDE) == [
        "errors.py:FlowtideError"
    ]


def test_the_errors_that_were_outside_are_in_it() -> None:
    from flowtide.client import ServerError as ClientServerError
    from flowtide.dev.postgres import PostgresSetupError
    from flowtide.dev.stack import DevStackError
    from flowtide.server.claims import ClaimConflict as ServerClaimConflict
    from flowtide.server.coordinator import ExecutionFinished as ServerExecutionFinished

    assert ClientServerError is ServerError
    assert ServerClaimConflict is ClaimConflict
    assert ServerExecutionFinished is ExecutionFinished
    for cls in (ServerError, ClaimConflict, ExecutionFinished, WrongPool):
        assert issubclass(cls, FlowtideError)
    # Still what they were for callers that catch RuntimeError.
    for cls in (PostgresSetupError, DevStackError):
        assert issubclass(cls, FlowtideError) and issubclass(cls, RuntimeError)


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (AuthError("no token", status=401), (401, "no token", {})),
        (AuthError("not yours"), (403, "not yours", {})),
        (WrongPool("pool gpu"), (403, "pool gpu", {})),
        (NotFoundError("execution 7 not found"), (404, "execution 7 not found", {})),
        (ClaimConflict("held", holder="w2"), (409, "held", {"holder": "w2"})),
        (
            ExecutionFinished(7, "completed"),
            (409, "execution 7 is completed", {"execution_status": "completed"}),
        ),
        (StoreError("down"), (503, "store unavailable: down", {})),
        (CredentialError("bad key"), (422, "bad key", {})),
        (ToolError("boom"), (422, "boom", {})),
        (KeyError("x"), (500, "KeyError: 'x'", {})),
    ],
)
def test_the_http_status_of_each_error(
    exc: BaseException, expected: tuple[int, str, dict[str, object]]
) -> None:
    from flowtide.web.errors import problem

    assert problem(exc) == expected


def test_the_exit_status_of_each_error() -> None:
    assert exit_code(PlaybookError("bad")) == EXIT_INVALID
    assert exit_code(TemplateError("bad", expression="{{ x }}")) == EXIT_INVALID
    assert exit_code(ServerError("refused", 422)) == EXIT_INVALID
    assert exit_code(ServerError("unreachable")) == EXIT_FAILED
    assert exit_code(ServerError("down", 503)) == EXIT_FAILED
    assert exit_code(ToolError("boom")) == EXIT_FAILED
    assert exit_code(RuntimeError("bug")) == EXIT_FAILED


def test_the_exit_status_of_what_the_user_named_wrong() -> None:
    from flowtide.kv.errors import (
        BucketNotFoundError,
        InvalidKeyError,
        KeyNotFoundError,
        KVError,
        KVUnavailable,
    )

    assert exit_code(NotFoundError("execution 7 not found")) == EXIT_INVALID
    assert exit_code(KeyNotFoundError("b", "k")) == EXIT_INVALID
    assert exit_code(BucketNotFoundError("b")) == EXIT_INVALID
    assert exit_code(InvalidKeyError("a..b", "empty token")) == EXIT_INVALID
    assert exit_code(KVUnavailable("cannot open KV bucket 'b' at nats://127.0.0.1:1")) == 2
    # A store or a KV that fails us is a failure, not bad input.
    assert exit_code(StoreError("down")) == EXIT_FAILED
    assert exit_code(KVError("stream lost")) == EXIT_FAILED
