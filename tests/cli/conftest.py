"""Fixtures of the end-to-end CLI tests (helpers live in helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import Flowtide


@pytest.fixture
def ft(tmp_path: Path) -> Flowtide:
    """The CLI with a fresh FLOWTIDE_HOME and a scratch working directory."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    return Flowtide(tmp_path / "home", cwd)
