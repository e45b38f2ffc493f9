"""The dev stack's processes keep their files under HOME/dev (their own FLOWTIDE_HOME), so
that `dev down --purge` removes all of it; a stack made before that keeps its credentials
readable (its master key copied from HOME)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowtide.dev.stack import DevStack


def test_the_stacks_processes_have_the_stack_folder_as_home(tmp_path: Path) -> None:
    stack = DevStack(tmp_path)
    assert stack.procs.env["FLOWTIDE_HOME"] == str(tmp_path / "dev")


def test_a_new_stack_makes_its_own_key_and_takes_nothing_of_the_home(tmp_path: Path) -> None:
    (tmp_path / "master.key").write_text("the user's own key\n")
    stack = DevStack(tmp_path)
    stack.dir.mkdir()
    lines: list[str] = []
    stack._own_home(lines.append)
    assert not (stack.dir / "master.key").exists() and lines == []
    assert json.loads((stack.dir / "stack.json").read_text())["own_home"] is True


def test_an_older_stack_keeps_its_master_key(tmp_path: Path) -> None:
    (tmp_path / "master.key").write_text("the key its credentials are sealed with\n")
    (tmp_path / "dev" / "pg" / "data").mkdir(parents=True)
    (tmp_path / "dev" / "pg" / "data" / "PG_VERSION").write_text("16\n")
    (tmp_path / "dev" / "stack.json").write_text(json.dumps({"server_port": 8082}))
    stack = DevStack(tmp_path)
    assert stack.config.own_home is False
    lines: list[str] = []
    stack._own_home(lines.append)
    copied = stack.dir / "master.key"
    assert copied.read_text() == "the key its credentials are sealed with\n"
    assert copied.stat().st_mode & 0o077 == 0
    assert len(lines) == 1 and str(tmp_path / "master.key") in lines[0]
    # Once: a later `up` leaves the stack's key alone.
    (tmp_path / "master.key").write_text("rotated by the user\n")
    DevStack(tmp_path)._own_home(lines.append)
    assert copied.read_text() == "the key its credentials are sealed with\n" and len(lines) == 1


def test_dev_up_says_how_commands_find_a_home_given_by_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `dev up --home /tmp/h` said "commands run from this directory find it on their
    # own", and the `flowtide run ... --server` it printed then failed: no CA, no token.
    from flowtide.cli.dev import home_hint

    monkeypatch.delenv("FLOWTIDE_HOME", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    elsewhere = tmp_path / "h"
    finds, flag = home_hint(elsewhere, cwd=tmp_path)
    assert flag == f" --home {elsewhere}" and f"--home {elsewhere}" in finds
    project = tmp_path / "proj"
    (project / ".flowtide").mkdir(parents=True, mode=0o700)
    finds, flag = home_hint(project / ".flowtide", cwd=project)
    assert flag == "" and "on their own" in finds
    monkeypatch.setenv("FLOWTIDE_HOME", str(elsewhere))
    assert home_hint(elsewhere, cwd=tmp_path)[1] == ""
