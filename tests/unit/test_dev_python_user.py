"""Who the dev stack's workers run python steps as (issue 31): `nobody` (no variable
passed) wherever nobody can start an interpreter of this version, root only where none
works, said out loud."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowtide.dev.stack import DevStack
from flowtide.tools import python_pool
from pyuser import PYTHON_USER


def _choose(home: Path) -> tuple[dict[str, str], list[str]]:
    said: list[str] = []
    return DevStack(home)._python_user(said.append), said


def test_workers_get_the_default_user_where_an_interpreter_works(tmp_path: Path) -> None:
    if PYTHON_USER is not None:
        pytest.skip("no interpreter of this Python version that nobody may run here")
    assert _choose(tmp_path) == ({}, [])


def test_root_only_where_no_interpreter_works_and_said_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(python_pool, "default_user_works", lambda executable=None: False)
    env, said = _choose(tmp_path)
    assert env == {"FLOWTIDE_PYTHON_USER": "root"}
    assert len(said) == 1 and "python steps run as root" in said[0]
    assert "FLOWTIDE_PYTHON_USER" in said[0]
    # A user chosen by the operator is the workers' own setting: nothing added.
    monkeypatch.setenv("FLOWTIDE_PYTHON_USER", "daemon")
    assert _choose(tmp_path) == ({}, [])
