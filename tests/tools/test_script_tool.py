"""`kind: script` (NoETL's script runner) as a local process: a python file run with the
task's `args` as JSON in argv[1], NoETL's result shape, failures the policy sees, a
timeout that kills it, and remote sources refused with a clear error."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import flowtide
from flowtide.errors import PlaybookError, ToolError
from flowtide.playbook.loader import load_playbook
from flowtide.tools.base import ToolContext
from flowtide.tools.python_pool import Isolation
from flowtide.tools.registry import get_tool
from flowtide.tools.script import ScriptTool
from pyuser import PYTHON_USER

SCRIPT = """\
import json, os, sys
args = json.loads(sys.argv[1])
print("args:", json.dumps(args, sort_keys=True))
print("token:", os.environ.get("API_TOKEN"))
print("to stderr", file=sys.stderr)
sys.exit(int(args.get("exit", 0)))
"""


@pytest.fixture(autouse=True)
def python_user() -> Iterator[None]:
    """Scripts run as the python steps' user: the one that can run this interpreter."""
    tool = get_tool("python")
    old = tool.isolation
    tool.configure(Isolation(mode=old.mode, user=PYTHON_USER, embedded=old.embedded))
    try:
        yield
    finally:
        tool.configure(old)


@pytest.fixture
def scripts(open_dir: Path) -> Path:
    """The scripts, where their user (nobody, when the tests run as root) can read them."""
    folder = open_dir / "scripts"
    folder.mkdir()
    folder.chmod(0o755)
    (folder / "job.py").write_text(SCRIPT)
    (folder / "slow.py").write_text("import time\ntime.sleep(60)\n")
    (folder / "packages.py").write_text(
        "import json, sys\nimport flowtide, httpx\n"
        "print(json.dumps([list(sys.version_info[:2]), flowtide.__file__, httpx.__name__]))\n"
    )
    return open_dir


def ctx(base: Path, **fields: Any) -> ToolContext:
    return ToolContext(execution_id=42, step="run_job", task="run_job", base_dir=base, **fields)


def test_a_file_script_runs_with_args_and_env(scripts: Path) -> None:
    result = ScriptTool().run(
        {
            "script": {"uri": "scripts/job.py", "source": {"type": "file"}},
            "args": {"input": "data.csv", "n": 3},
            "job": {"image": "python:3.11-slim", "env": {"API_TOKEN": "t0k"}},
        },
        ctx(scripts),
    )
    assert result["status"] == "completed"
    assert result["succeeded"] == 1 and result["failed"] == 0 and result["exit_code"] == 0
    assert result["job_name"] == "script-run-job-42"
    output = result["output"]
    assert 'args: {"input": "data.csv", "n": 3}' in output
    assert "token: t0k" in output and "to stderr" in output
    assert result["runner"] == "local" and result["truncated"] is False


def test_a_path_string_and_file_uri_work(scripts: Path) -> None:
    assert ScriptTool().run({"script": "scripts/job.py"}, ctx(scripts))["status"] == "completed"
    uri = f"file://{scripts / 'scripts' / 'job.py'}"
    assert ScriptTool().run({"script": {"uri": uri}}, ctx(scripts))["exit_code"] == 0


def test_a_script_has_this_python_and_its_packages_as_python_steps_do(scripts: Path) -> None:
    """As root, the script runs as nobody with the interpreter python steps get (the
    system's of this version when this one is out of nobody's reach), and still imports
    what this process has installed (flowtide, httpx)."""
    import json
    import sys

    result = ScriptTool().run({"script": "scripts/packages.py"}, ctx(scripts))
    version, flowtide_file, httpx_name = json.loads(result["output"])
    assert version == list(sys.version_info[:2])
    assert flowtide_file == flowtide.__file__ and httpx_name == "httpx"


def test_a_failing_script_is_a_script_error_with_its_output(scripts: Path) -> None:
    with pytest.raises(ToolError) as info:
        ScriptTool().run({"script": {"uri": "scripts/job.py"}, "args": {"exit": 5}}, ctx(scripts))
    error = info.value
    assert error.kind == "script_error" and error.code == "5"
    assert error.data["status"] == "failed" and error.data["failed"] == 1
    assert "to stderr" in error.data["output"]


def test_timeout_kills_the_script(scripts: Path) -> None:
    with pytest.raises(ToolError) as info:
        ScriptTool().run(
            {"script": {"uri": "scripts/slow.py"}, "job": {"timeout": 1}}, ctx(scripts)
        )
    assert info.value.kind == "timeout" and info.value.retryable
    assert info.value.data["status"] == "failed"


@pytest.mark.parametrize(
    "script, words",
    [
        ({"uri": "gs://bucket/job.py", "source": {"type": "gcs", "auth": "gcp"}}, "Google Cloud"),
        ({"uri": "s3://bucket/job.py"}, "Amazon S3"),
        ({"uri": "https://example.com/job.py", "source": {"type": "http"}}, "HTTP server"),
    ],
)
def test_remote_sources_are_refused_clearly(
    scripts: Path, script: dict[str, Any], words: str
) -> None:
    with pytest.raises(ToolError) as info:
        ScriptTool().run({"script": script}, ctx(scripts))
    assert info.value.kind == "config_error"
    assert words in info.value.message and "source: {type: file}" in info.value.message


def test_a_missing_file_says_where_it_looked(scripts: Path) -> None:
    with pytest.raises(ToolError) as info:
        ScriptTool().run({"script": {"uri": "scripts/nope.py"}}, ctx(scripts))
    assert "not found" in info.value.message and "nope.py" in info.value.message


def test_through_a_playbook_with_a_policy(scripts: Path) -> None:
    book = scripts / "pb.yaml"
    book.write_text(
        textwrap.dedent(
            """\
            apiVersion: noetl.io/v2
            kind: Playbook
            metadata: {name: script_job, path: script_job}
            workload: {code: 0}
            workflow:
            - step: start
              tool:
                kind: script
                script: {uri: scripts/job.py, source: {type: file}}
                args: {exit: "{{ code }}"}
                spec:
                  policy:
                    rules:
                      - when: "{{ output.error.kind == 'script_error' }}"
                        then: {do: continue}
            """
        )
    )
    doc = flowtide.run(book, home=scripts / "home")
    assert doc["status"] == "completed", doc
    assert doc["steps"]["start"]["result"]["status"] == "completed"
    doc = flowtide.run(book, workload={"code": 2}, home=scripts / "home")
    assert doc["status"] == "completed", doc
    assert doc["steps"]["start"]["result"]["exit_code"] == 2


def test_validation_wants_a_script_with_a_uri(tmp_path: Path) -> None:
    book = tmp_path / "bad.yaml"
    book.write_text(
        textwrap.dedent(
            """\
            apiVersion: noetl.io/v2
            kind: Playbook
            metadata: {name: bad, path: bad}
            workflow:
            - step: start
              tool:
                kind: script
                script: {source: {type: file}}
                args: [1, 2]
            """
        )
    )
    with pytest.raises(PlaybookError) as info:
        load_playbook(book)
    text = str(info.value)
    assert "bad.yaml:8:" in text and "tool.script" in text and "'uri'" in text
    assert "bad.yaml:9:" in text and "tool.args" in text
