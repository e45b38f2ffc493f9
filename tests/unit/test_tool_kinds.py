"""Tool kinds: the built-in ToolSpecs and the plugins' (entry point group `flowtide.tools`),
merged by `flowtide.tools.kinds`; the loader checks a plugin's fields with positions as
it does a built-in's, and `get_tool` makes its runner on first use.

Plugins here are installed for real, as far as `importlib.metadata` can tell: a
`<name>-1.0.dist-info` with an `entry_points.txt` and a module beside it, in a folder put
on sys.path.
"""

from __future__ import annotations

import importlib
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from textwrap import dedent

import pytest

from flowtide.errors import PlaybookError, PlaybookErrors, ToolError
from flowtide.playbook.loader import parse_playbook
from flowtide.tools import kinds, registry
from flowtide.tools.base import ToolContext
from flowtide.tools.builtin import SPECS

BUILTIN = (
    "python",
    "http",
    "postgres",
    "duckdb",
    "spark",
    "playbook",
    "workbook",
    "noop",
    "nats",
    "shell",
    "script",
    "transfer",
    "artifact",
)

ECHO = """
from flowtide.tools.spec import FieldSpec, ToolSpec

def check(task):
    if task.config.get("times") == 0:
        task.error(task.at("times"), "echo 'times' must not be 0")

SPEC = ToolSpec(
    "echo",
    "echo_runner:EchoTool",
    requires=("message",),
    fields={
        "message": FieldSpec(types=(str,)),
        "times": FieldSpec(types=(int,)),
        "ratio": FieldSpec(types=(float,)),
        "style": FieldSpec(choices=("plain", "loud")),
    },
    strict=True,
    check=check,
)
"""

ECHO_RUNNER = """
class EchoTool:
    kind = "echo"

    def run(self, config, ctx):
        return {"echo": config["message"] * int(config.get("times", 1)), "step": ctx.step}
"""


class Site:
    """A folder on sys.path where fake distributions are installed."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules: list[str] = []

    def install(self, dist: str, entry_points: dict[str, str], **modules: str) -> None:
        # Named as a wheel names it: the distribution's name with `_` for `-`.
        info = self.root / f"{dist.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        lines = "".join(f"{kind} = {value}\n" for kind, value in entry_points.items())
        (info / "entry_points.txt").write_text(f"[flowtide.tools]\n{lines}")
        for name, code in modules.items():
            (self.root / f"{name}.py").write_text(dedent(code))
            self.modules.append(name)
        importlib.invalidate_caches()
        kinds.refresh()


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Site]:
    monkeypatch.syspath_prepend(str(tmp_path))
    kinds.refresh()
    made = Site(tmp_path)
    yield made
    for name in made.modules:
        sys.modules.pop(name, None)
    for kind in ("echo", "python"):
        registry._instances.pop(kind, None)
    monkeypatch.undo()
    kinds.refresh()


def errors_of(text: str) -> list[PlaybookError]:
    with pytest.raises(PlaybookError) as info:
        parse_playbook(dedent(text), "pb.yaml")
    return list(info.value.errors) if isinstance(info.value, PlaybookErrors) else [info.value]


def only(text: str) -> PlaybookError:
    (error,) = errors_of(text)
    return error


# -- built-in kinds ----------------------------------------------------------------------


def test_the_built_in_kinds_come_first_in_their_order() -> None:
    assert tuple(spec.kind for spec in SPECS) == BUILTIN
    assert kinds.known_kinds()[: len(BUILTIN)] == BUILTIN


@pytest.mark.parametrize("spec", [s for s in SPECS if s.runner is not None], ids=lambda s: s.kind)
def test_every_built_in_runner_reference_names_a_tool(spec: kinds.ToolSpec) -> None:
    assert isinstance(spec.runner, str)
    module, _, name = spec.runner.partition(":")
    tool = getattr(importlib.import_module(module), name)
    assert tool.kind == spec.kind and callable(tool.run)


def test_kinds_the_runtime_runs_have_no_tool() -> None:
    with pytest.raises(ToolError, match="kind 'playbook' is run by the runtime"):
        registry.get_tool("playbook")


@pytest.mark.parametrize("kind", kinds.NEEDS_PLUGIN)
def test_noetl_kinds_of_outside_services_need_a_plugin(kind: str) -> None:
    error = only(f"workflow:\n  - step: start\n    tool: {{kind: {kind}}}\n")
    assert error.message == (
        f"kind '{kind}' needs a plugin (pip install a package that provides the "
        f"flowtide.tools entry point '{kind}')"
    )
    assert (error.line, error.column, error.field) == (3, 12, "tool.kind")
    assert error.expected == " | ".join(BUILTIN)
    with pytest.raises(ToolError, match=f"kind '{kind}' needs a plugin") as info:
        registry.get_tool(kind)
    assert info.value.kind == "config_error"


def test_a_misspelt_kind_still_gets_a_suggestion() -> None:
    error = only("workflow:\n  - step: start\n    tool: {kind: snowflak}\n")
    assert error.message == "unknown tool kind 'snowflak'; did you mean 'snowflake'?"
    with pytest.raises(ToolError, match="unknown tool kind 'duckbd'; did you mean 'duckdb'"):
        registry.get_tool("duckbd")


# -- a plugin ----------------------------------------------------------------------------


def test_a_plugin_kind_is_known_checked_and_run(site: Site) -> None:
    site.install(
        "flowtide-echo", {"echo": "echo_spec:SPEC"}, echo_spec=ECHO, echo_runner=ECHO_RUNNER
    )
    assert kinds.known_kinds() == (*BUILTIN, "echo")
    playbook = parse_playbook(
        "workflow:\n  - step: start\n    tool: {kind: echo, message: hi, times: 2}\n"
    )
    assert playbook.steps["start"].tasks[0].config == {"kind": "echo", "message": "hi", "times": 2}
    assert "echo_spec" in sys.modules and "echo_runner" not in sys.modules
    tool = registry.get_tool("echo")
    assert registry.get_tool("echo") is tool
    assert tool.run({"message": "hi", "times": 2}, ToolContext(1, "start")) == {
        "echo": "hihi",
        "step": "start",
    }


def test_a_plugin_s_fields_are_checked_with_positions(site: Site) -> None:
    site.install(
        "flowtide-echo", {"echo": "echo_spec:SPEC"}, echo_spec=ECHO, echo_runner=ECHO_RUNNER
    )
    errors = errors_of(
        """\
        workflow:
          - step: start
            tool:
              kind: echo
              mesage: hi
              times: "2"
              ratio: true
              style: LOUDER
          - step: other
            tool:
              - kind: echo
                spec:
                  message: hi
                  times: 0
                  ratio: 1
        """
    )
    assert [(e.line, e.column, e.step, e.field, e.message, e.expected) for e in errors] == [
        (3, 5, "start", "tool.message", "echo tool requires 'message'", None),
        (
            5,
            7,
            "start",
            "tool.mesage",
            "echo tool has no field 'mesage'; did you mean 'message'?",
            "message | times | ratio | style",
        ),
        (6, 7, "start", "tool.times", "echo 'times' must be an integer, not str", None),
        (7, 7, "start", "tool.ratio", "echo 'ratio' must be a number, not bool", None),
        (
            8,
            7,
            "start",
            "tool.style",
            "unsupported style 'LOUDER'; did you mean 'loud'?",
            "plain | loud",
        ),
        (14, 11, "other", "tool[0].times", "echo 'times' must not be 0", None),
    ]


def test_templates_are_left_to_the_runner(site: Site) -> None:
    site.install(
        "flowtide-echo", {"echo": "echo_spec:SPEC"}, echo_spec=ECHO, echo_runner=ECHO_RUNNER
    )
    parse_playbook(
        "workflow:\n  - step: start\n"
        "    tool: {kind: echo, message: hi, times: '{{ 2 }}', timeout: 5}\n"
    )


def test_a_plugin_cannot_replace_a_built_in_kind(
    site: Site, caplog: pytest.LogCaptureFixture
) -> None:
    site.install("evil", {"python": "evil:SPEC"}, evil="raise RuntimeError('imported')\n")
    with caplog.at_level(logging.WARNING, logger="flowtide.tools.kinds"):
        assert kinds.known_kinds() == BUILTIN
    assert "ignored: evil 1.0 declares tool kind 'python' (evil:SPEC), which is built in" in (
        caplog.text
    )
    assert kinds.find("python") is kinds.BUILTIN["python"]
    assert "evil" not in sys.modules


def test_two_plugins_for_one_kind_are_refused(site: Site) -> None:
    site.install("echo-a", {"echo": "echo_spec:SPEC"}, echo_spec=ECHO, echo_runner=ECHO_RUNNER)
    site.install("echo-b", {"echo": "echo_b:SPEC"})
    assert "echo" not in kinds.known_kinds()
    error = only("workflow:\n  - step: start\n    tool: {kind: echo, message: hi}\n")
    assert error.message == (
        "kind 'echo' is provided by more than one plugin (echo-a 1.0, echo-b 1.0): "
        "uninstall all but one"
    )


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        (
            "import no_such_module\n",
            "kind 'echo' is provided by broken 1.0 (echo_spec:SPEC), which cannot be loaded: "
            "ModuleNotFoundError: No module named 'no_such_module'",
        ),
        (
            "SPEC = {'kind': 'echo'}\n",
            "kind 'echo' is provided by broken 1.0, whose entry point echo_spec:SPEC is a "
            "dict, not a flowtide.tools.spec.ToolSpec",
        ),
        (
            "from flowtide.tools.spec import ToolSpec\nSPEC = ToolSpec('ekko', None)\n",
            "kind 'echo' is provided by broken 1.0, whose ToolSpec (echo_spec:SPEC) declares "
            "kind 'ekko'",
        ),
    ],
    ids=["import-error", "not-a-spec", "other-kind"],
)
def test_a_broken_plugin_says_what_is_wrong(site: Site, spec: str, problem: str) -> None:
    site.install("broken", {"echo": "echo_spec:SPEC"}, echo_spec=spec)
    assert only("workflow:\n  - step: start\n    tool: {kind: echo}\n").message == problem
    with pytest.raises(ToolError) as info:
        registry.get_tool("echo")
    assert str(info.value) == problem


def test_a_runner_that_cannot_be_imported_fails_the_task_not_the_check(site: Site) -> None:
    spec = "from flowtide.tools.spec import ToolSpec\nSPEC = ToolSpec('echo', 'gone:EchoTool')\n"
    site.install("flowtide-echo", {"echo": "echo_spec:SPEC"}, echo_spec=spec)
    parse_playbook("workflow:\n  - step: start\n    tool: {kind: echo}\n")
    with pytest.raises(ToolError, match="tool 'echo' is not available: No module named 'gone'"):
        registry.get_tool("echo")


def test_a_check_that_raises_is_one_error(site: Site) -> None:
    spec = (
        "from flowtide.tools.spec import ToolSpec\n"
        "def check(task):\n    raise KeyError('oops')\n"
        "SPEC = ToolSpec('echo', None, check=check)\n"
    )
    site.install("flowtide-echo", {"echo": "echo_spec:SPEC"}, echo_spec=spec)
    error = only("workflow:\n  - step: start\n    tool: {kind: echo}\n")
    assert error.message == "the checks of kind 'echo' failed: KeyError: 'oops'"
    assert (error.line, error.field) == (3, "tool.kind")


# -- what validating imports -------------------------------------------------------------

ALL_KINDS = """\
workbook:
  - name: act
    tool: {kind: noop}
workflow:
  - step: start
    tool:
      - {kind: python, code: "result = 1"}
      - {kind: http, url: "http://localhost/"}
      - {kind: postgres, command: "select 1", auth: pg}
      - {kind: duckdb, query: "select 1"}
      - {kind: spark, sql: "select 1"}
      - {kind: playbook, path: other}
      - {kind: workbook, name: act}
      - {kind: noop}
      - {kind: nats, operation: kv_get, bucket: b, key: k, auth: nats}
      - {kind: shell, cmds: ["echo hi"]}
      - {kind: script, script: {uri: run.py, source: {type: file}}}
      - {kind: transfer, source: {type: csv, path: in.csv}, target: {type: json, path: o}}
      - {kind: artifact, action: get, result_ref: "{{ start._ref }}"}
"""


@pytest.mark.parametrize("args", [["--help"], ["validate", "pb.yaml"]], ids=["help", "validate"])
def test_the_cli_imports_no_runner(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "pb.yaml").write_text(ALL_KINDS, encoding="utf-8")
    code = (
        "import atexit, sys\n"
        "heavy = ('duckdb', 'psycopg', 'pyspark', 'httpx', 'flowtide.tools.python', "
        "'flowtide.tools.http', 'flowtide.tools.postgres', 'flowtide.tools.duckdb', "
        "'flowtide.tools.spark', 'flowtide.tools.noop', 'flowtide.tools.registry', "
        "'nats', 'flowtide.tools.nats', 'flowtide.tools.shell', 'flowtide.tools.script', "
        "'fsspec', 'flowtide.tools.transfer', 'flowtide.tools.artifact', 'flowtide.artifacts')\n"
        "atexit.register(lambda: print('loaded:', *[m for m in heavy if m in sys.modules]))\n"
        f"sys.argv = ['flowtide', *{args!r}]\n"
        "from flowtide.cli import main\n"
        "main()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "loaded:"
