"""Where state goes when no command says (flowtide.home.find_home)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flowtide.cli import app
from flowtide.home import find_home, user_home


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("FLOWTIDE_HOME", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    (tmp_path / "project" / "src" / "deep").mkdir(parents=True)
    return tmp_path


def test_explicit_then_env_then_nearest_then_user(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = tree / "project" / "src" / "deep"
    assert find_home(None, cwd=deep) == tree / "xdg" / "flowtide" == user_home()
    (tree / "project" / ".flowtide").mkdir()
    assert find_home(None, cwd=deep) == tree / "project" / ".flowtide"
    (deep / ".flowtide").mkdir()
    assert find_home(None, cwd=deep) == deep / ".flowtide"  # the nearest wins
    monkeypatch.setenv("FLOWTIDE_HOME", str(tree / "env"))
    assert find_home(None, cwd=deep) == tree / "env"
    assert find_home(tree / "flag", cwd=deep) == tree / "flag"


def test_a_file_named_dot_flowtide_is_not_a_home(tree: Path) -> None:
    (tree / "project" / ".flowtide").write_text("not a folder")
    assert find_home(None, cwd=tree / "project") == user_home()


def test_a_dot_flowtide_others_may_write_or_a_link_is_not_a_home(tree: Path) -> None:
    project = tree / "project"
    (project / ".flowtide").mkdir()
    (project / ".flowtide").chmod(0o777)  # anyone could have planted what is in it
    assert find_home(None, cwd=project) == user_home()
    (project / ".flowtide").chmod(0o700)
    if os.geteuid() == 0:  # another user's folder
        os.chown(project / ".flowtide", 65534, 65534)
        assert find_home(None, cwd=project) == user_home()
        os.chown(project / ".flowtide", 0, 0)
    assert find_home(None, cwd=project) == project / ".flowtide"
    (project / ".flowtide").rmdir()
    (tree / "elsewhere").mkdir()
    (project / ".flowtide").symlink_to(tree / "elsewhere")
    assert find_home(None, cwd=project) == user_home()


def test_relative_xdg_data_home_is_ignored(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", "relative/path")  # the spec: only absolute paths
    assert user_home() == Path.home() / ".local" / "share" / "flowtide"


def test_runs_from_two_folders_share_the_user_home(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    playbook = tree / "one.yaml"
    playbook.write_text(
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: one, path: one}\n"
        "workflow:\n  - step: start\n    tool: {kind: noop}\n"
    )
    runner = CliRunner()
    notices = []
    for folder in ("a", "b"):
        (tree / folder).mkdir()
        monkeypatch.chdir(tree / folder)
        done = runner.invoke(app, ["run", str(playbook)])
        assert done.exit_code == 0, done.output
        notices.append(f"state goes to {tree / 'xdg' / 'flowtide'}" in done.output)
    # The first use of the user's home says where state goes; later ones are quiet.
    assert notices == [True, False]
    monkeypatch.chdir(tree / "project")
    listed = runner.invoke(app, ["list", "--json"])
    assert listed.exit_code == 0, listed.output
    assert listed.output.count('"execution_id"') == 2
    assert (tree / "xdg" / "flowtide" / "flowtide.db").is_file()
    assert not (tree / "a" / ".flowtide").exists()


def test_what_a_run_leaves_in_a_new_home_is_the_users_alone(tree: Path) -> None:
    # With the usual umask 022 the home, its database and its command logs were 0755 and
    # 0644: any local user could read every run's results and what its steps printed.
    import flowtide

    playbook = tree / "print.yaml"
    playbook.write_text(
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: p, path: p}\n"
        "workflow:\n  - step: start\n    tool:\n      kind: python\n"
        "      code: \"print('hello', flush=True)\\nresult = 1\"\n"
    )
    old = os.umask(0o022)
    try:
        doc = flowtide.run(playbook, home=user_home())
    finally:
        os.umask(old)
    assert doc["status"] == "completed", doc["error"]
    home = tree / "xdg" / "flowtide"
    logs = list((home / "data" / "logs").rglob("*.log"))
    assert logs, "the step's output has a log file"
    for folder in (tree / "xdg", home, home / "data", home / "data" / "logs", logs[0].parent):
        assert folder.stat().st_mode & 0o777 == 0o700, folder
    for file in (home / "flowtide.db", logs[0]):
        assert file.stat().st_mode & 0o777 == 0o600, file
