"""Which metadata.path values can key the catalog (`flowtide.store.base`)."""

from __future__ import annotations

import pytest

from flowtide.store.base import catalog_path_problem


@pytest.mark.parametrize("path", ["examples/quickstart", "a", "etl/v1.2/load", "a..b/.c"])
def test_ordinary_paths_are_keys(path: str) -> None:
    assert catalog_path_problem(path) is None


@pytest.mark.parametrize(
    ("path", "why"),
    [
        (None, "no metadata.path"),
        ("", "no metadata.path"),
        (["a"], "not text"),
        ("a\x00b", "NUL"),
        ("a\ud800", "lone surrogates"),
        ("../api/tokens", "'..' segment"),
        ("etl/../admin", "'..' segment"),
        ("etl/./x", "'.' or '..' segment"),
    ],
)
def test_paths_that_cannot_be_keys_say_why(path: object, why: str) -> None:
    problem = catalog_path_problem(path)
    assert problem is not None and why in problem
