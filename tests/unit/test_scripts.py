"""`script:` files, one rule for every tool that takes them (`flowtide.tools.script_source`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowtide.errors import ToolError
from flowtide.tools.script_source import load_script


def test_a_relative_uri_is_found_in_the_playbooks_folder(tmp_path: Path) -> None:
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "make.sql").write_text("SELECT 1;")
    script = {"uri": "sql/make.sql", "source": {"type": "file"}}
    text, path = load_script(script, tmp_path, tool="postgres", step="s", kind="config_error")
    assert text == "SELECT 1;" and path == str((tmp_path / "sql" / "make.sql").resolve())


def test_inline_code_has_no_file(tmp_path: Path) -> None:
    script = {"source": {"type": "inline", "code": "SELECT 2;"}}
    assert load_script(script, tmp_path, tool="postgres", step="s", kind="config_error") == (
        "SELECT 2;",
        None,
    )


def test_a_missing_file_names_the_file_the_step_and_the_field(tmp_path: Path) -> None:
    script = {"uri": "nope.sql", "source": {"type": "file"}}
    with pytest.raises(ToolError) as caught:
        load_script(script, tmp_path, tool="postgres", step="load", kind="config_error")
    err = caught.value
    assert err.code == "ScriptNotFound" and err.kind == "config_error"
    assert "step 'load', field 'script.uri'" in str(err) and "'nope.sql'" in str(err)
    assert str(tmp_path / "nope.sql") in str(err)
