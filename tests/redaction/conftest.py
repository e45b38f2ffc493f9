"""Fixtures of the redaction tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .echo import serve_echo


@pytest.fixture(scope="module")
def echo() -> Iterator[str]:
    """The URL of a loopback server echoing the Authorization header back."""
    with serve_echo() as url:
        yield url
