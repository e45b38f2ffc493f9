"""The file roots of in-process tools (`flowtide.tools.files`): pure path rules, and DuckDB
enforcing the same set."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowtide.errors import ToolError
from flowtide.tools.files import FileAccess


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """work/ (a worker's folder) holding the home .flowtide/ (secrets, data/) and data."""
    work = tmp_path / "work"
    (work / ".flowtide" / "data" / "results").mkdir(parents=True)
    (work / ".flowtide" / "dev").mkdir()
    (work / ".flowtide" / "dev" / "stack.json").write_text('{"password": "p"}')
    (work / "inputs").mkdir()
    (work / "inputs" / "a.csv").write_text("n\n1\n")
    (work / "top.csv").write_text("n\n2\n")
    (tmp_path / "outside.txt").write_text("x")
    return work


def _worker(work: Path) -> FileAccess:
    return FileAccess.for_worker(
        [], home=work / ".flowtide", data_dir=work / ".flowtide/data", cwd=work
    )


def test_roots_minus_the_home_but_its_data(tree: Path) -> None:
    access = _worker(tree)
    assert access.allows(tree / "inputs" / "a.csv")
    assert access.allows(tree / "new" / "file.parquet")  # not there yet: may be written
    assert access.allows(tree / ".flowtide" / "data" / "results" / "r.json.gz")
    assert not access.allows(tree / ".flowtide" / "dev" / "stack.json")
    assert not access.allows(tree / ".flowtide")
    assert not access.allows(tree.parent / "outside.txt")
    assert not access.allows("/proc/self/environ")
    # `..` and links are resolved before the check.
    assert not access.allows(tree / "inputs" / ".." / ".." / "outside.txt")
    (tree / "link").symlink_to(tree / ".flowtide" / "dev")
    assert not access.allows(tree / "link" / "stack.json")
    (tree / "ok_link").symlink_to(tree / "inputs")
    assert access.allows(tree / "ok_link" / "a.csv")


def test_check_names_what_and_the_roots(tree: Path) -> None:
    with pytest.raises(ToolError) as caught:
        _worker(tree).check("/etc/passwd", what="step 'load', transfer file")
    assert caught.value.kind == "permission"
    message = str(caught.value)
    assert "step 'load', transfer file '/etc/passwd'" in message and str(tree) in message
    assert "--file-root" in message


def test_unconfined_allows_everything(tree: Path) -> None:
    access = FileAccess.for_worker(["*"], home=tree / ".flowtide", data_dir=tree, cwd=tree)
    assert access.unconfined and access.allows("/proc/self/environ")
    access.check_url("memory://x", what="artifact get")  # no error


def test_worker_settings_that_make_no_sense_are_refused(tree: Path) -> None:
    home, data = tree / ".flowtide", tree / ".flowtide/data"
    with pytest.raises(ToolError, match="cannot be combined"):
        FileAccess.for_worker(["*", str(tree)], home=home, data_dir=data)
    with pytest.raises(ToolError, match="every file of this machine"):
        FileAccess.for_worker(["/"], home=home, data_dir=data)
    with pytest.raises(ToolError, match="working directory is /"):
        FileAccess.for_worker([], home=home, data_dir=data, cwd=Path("/"))


def test_named_roots_replace_the_working_directory(tree: Path) -> None:
    access = FileAccess.for_worker(
        [str(tree / "inputs")], home=tree / ".flowtide", data_dir=tree / ".flowtide/data"
    )
    assert access.allows(tree / "inputs" / "a.csv")
    assert not access.allows(tree / "top.csv")
    assert access.allows(tree / ".flowtide" / "data" / "x")


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("s3://bucket/key.json", True),
        ("gs://bucket/key.json", True),
        ("https://example.invalid/x.json", True),
        ("file:///proc/self/environ", False),
        ("local:///etc/passwd", False),
        ("memory://x", False),
        ("simplecache::s3://bucket/key", False),
        ("zip://a.txt::file:///tmp/a.zip", False),
    ],
)
def test_urls_on_a_confined_worker(tree: Path, url: str, ok: bool) -> None:
    access = _worker(tree)
    if ok:
        access.check_url(url, what="artifact get")
    else:
        with pytest.raises(ToolError) as caught:
            access.check_url(url, what="artifact get")
        assert caught.value.kind == "permission"


def test_duckdb_set_cuts_the_home_out_of_the_working_directory(tree: Path) -> None:
    directories, paths = _worker(tree).duckdb_allowed()
    real = tree.resolve()
    assert sorted(directories) == sorted([f"{real}/inputs/", f"{real}/.flowtide/data/"])
    assert paths == [f"{real}/top.csv"]


def test_duckdb_enforces_the_set(tree: Path) -> None:
    from flowtide.tools import files
    from flowtide.tools.base import ToolContext
    from flowtide.tools.duckdb import DuckDBTool

    ctx = ToolContext(execution_id=1, step="q", base_dir=tree)
    tool = DuckDBTool()
    before = files.current()
    files.configure(_worker(tree))
    try:
        ok = tool.run({"query": f"SELECT n FROM read_csv('{tree}/inputs/a.csv')"}, ctx)
        assert ok == [{"n": 1}]
        for query in (
            f"SELECT * FROM read_json('{tree}/.flowtide/dev/stack.json')",
            "SELECT * FROM read_text('/proc/self/environ')",
            "SET enable_external_access = true",
        ):
            with pytest.raises(ToolError) as caught:
                tool.run({"query": query}, ctx)
            assert "Permission Error" in str(caught.value) or "locked" in str(caught.value)
        with pytest.raises(ToolError) as caught:
            tool.run({"query": "SELECT 1", "database": f"{tree}/.flowtide/dev/x.db"}, ctx)
        assert caught.value.kind == "permission"
    finally:
        files.configure(before)
    # Unconfined again (embedded): the same query reads the file.
    assert tool.run({"query": f"SELECT * FROM read_json('{tree}/.flowtide/dev/stack.json')"}, ctx)
