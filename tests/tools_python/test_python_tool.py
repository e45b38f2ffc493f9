"""PythonTool: the code conventions real NoETL playbooks use (DSL-NOTES C1).

Every test runs twice: with the code in-process (isolation "thread") and in a child
process of the warm pool (isolation "process"); both must behave the same. Tests of
what only one of them has (helper threads, the in-process compile cache) say so.
"""

from __future__ import annotations

import datetime as dt
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from flowtide.errors import ToolError
from flowtide.tools.base import ToolContext
from flowtide.tools.python import PythonTool, compile_cache_clear, compile_cache_info
from flowtide.tools.python_pool import Isolation
from pyuser import PYTHON_USER

E2E_PLAYBOOKS = Path("/work/shared/noetl-e2e/playbooks")
SCRIPT_DIR = E2E_PLAYBOOKS / "script_execution"


def make_ctx(**kwargs: Any) -> ToolContext:
    kwargs.setdefault("execution_id", 4242)
    kwargs.setdefault("step", "test_step")
    return ToolContext(**kwargs)


_MODE = {"isolation": "thread"}
_TOOLS: dict[tuple[str, int], PythonTool] = {}


@pytest.fixture(autouse=True, scope="module", params=["thread", "process"])
def isolation(request: pytest.FixtureRequest) -> Any:
    _MODE["isolation"] = request.param
    yield request.param
    for tool_ in _TOOLS.values():
        tool_.configure(Isolation())  # stops the children
    _TOOLS.clear()
    _MODE["isolation"] = "thread"


def tool(output_limit: int = 64 * 1024) -> PythonTool:
    """The tool of the current isolation (one per setting: the process pools stay warm)."""
    key = (_MODE["isolation"], output_limit)
    if key not in _TOOLS:
        _TOOLS[key] = PythonTool(
            output_limit=output_limit,
            isolation=Isolation(mode=_MODE["isolation"], user=PYTHON_USER),
        )
    return _TOOLS[key]


def thread_isolation_only(what: str) -> None:
    if _MODE["isolation"] != "thread":
        pytest.skip(f"in-process isolation only: {what}")


def run(config: dict[str, Any], ctx: ToolContext | None = None, **tool_kw: Any) -> Any:
    return tool(**tool_kw).run(config, ctx or make_ctx())


def run_error(config: dict[str, Any], ctx: ToolContext | None = None) -> ToolError:
    with pytest.raises(ToolError) as info:
        tool().run(config, ctx or make_ctx())
    return info.value


# ---------------------------------------------------------------- fixture shapes


def test_hello_world_bare_input_global_and_print() -> None:
    ctx = make_ctx()
    config = {
        "kind": "python",
        "input": {"message": "Hello World"},
        "code": 'print(f"HELLO_WORLD: {message}")\n'
        'result = {"status": "ok", "data": {"message": message}}\n',
    }
    assert run(config, ctx) == {"status": "ok", "data": {"message": "Hello World"}}
    assert ctx.stdout == ["HELLO_WORLD: Hello World"]


def test_empty_input_and_global_result() -> None:
    assert run({"input": {}, "code": 'result = {"status": "initialized"}\n'}) == {
        "status": "initialized"
    }


DUCKDB_PROCESS = """\
print(f"[PROCESS] Processing DuckDB query results")
print(f"[PROCESS] Input data type: {type(input_data).__name__}")

# Extract query results from args
query_results = input_data.get('query_results', []) if isinstance(input_data, dict) else input_data

if isinstance(query_results, list):
    print(f"[PROCESS] Found {len(query_results)} users")

    total_age = sum(row.get('age', 0) for row in query_results)
    avg_age = total_age / len(query_results) if query_results else 0

    for row in query_results:
        name = row.get('name', 'unknown')
        age = row.get('age', 0)
        print(f"[PROCESS]   {name}: {age} years old")

    return {
        "status": "success",
        "total_users": len(query_results),
        "average_age": avg_age,
        "users": query_results
    }

return {"status": "error", "message": "Invalid query result format"}
"""

DUCKDB_VERIFY = """\
print(f"[VERIFY] Verifying DuckDB test results")

process_result = input_data.get('process_result', {})

if isinstance(process_result, str):
    import json, ast
    try:
        process_result = json.loads(process_result)
    except:
        process_result = ast.literal_eval(process_result)

total_users = process_result.get('total_users', 0)
avg_age = process_result.get('average_age', 0)

verification = {
    "verified": total_users == 2,
    "avg_age": avg_age,
    "status": "passed" if total_users == 2 else "failed"
}

print(f"[VERIFY] Verification: {verification['status']}")
return verification
"""


def test_duckdb_input_data_get_and_module_level_return() -> None:
    rows = [{"name": "Alice", "age": 30}, {"name": "Charlie", "age": 35}]
    ctx = make_ctx()
    out = run({"input": {"query_results": rows}, "code": DUCKDB_PROCESS}, ctx)
    assert out == {"status": "success", "total_users": 2, "average_age": 32.5, "users": rows}
    assert ctx.stdout[0] == "[PROCESS] Processing DuckDB query results"
    assert "[PROCESS] Input data type: dict" in ctx.stdout
    assert "[PROCESS]   Charlie: 35 years old" in ctx.stdout

    # the second `return` (after the if) is reached for non-list input
    assert run({"input": {"query_results": "oops"}, "code": DUCKDB_PROCESS}) == {
        "status": "error",
        "message": "Invalid query result format",
    }


def test_duckdb_verify_reassigns_an_input_name_and_imports_inside_wrapper() -> None:
    # `process_result` is both an input key and assigned by the wrapped body; the string
    # form exercises the in-body `import json, ast` and the bare except.
    as_dict = {"total_users": 2, "average_age": 32.5}
    expected = {"verified": True, "avg_age": 32.5, "status": "passed"}
    assert run({"input": {"process_result": as_dict}, "code": DUCKDB_VERIFY}) == expected
    as_text = "{'total_users': 2, 'average_age': 32.5}"  # python repr: needs literal_eval
    assert run({"input": {"process_result": as_text}, "code": DUCKDB_VERIFY}) == expected


def test_script_file_main_with_signature_defaults() -> None:
    config = {
        "kind": "python",
        "script": {"uri": "scripts/hello_world.py", "source": {"type": "file"}},
        "input": {"name": "NoETL", "count": 3},
    }
    out = run(config, make_ctx(base_dir=SCRIPT_DIR))
    assert out == {
        "status": "success",
        "messages": [
            "Hello, NoETL! (Greeting #1)",
            "Hello, NoETL! (Greeting #2)",
            "Hello, NoETL! (Greeting #3)",
        ],
        "total_greetings": 3,
        "script_source": "file",
    }
    # defaults apply for inputs the signature names but the input lacks
    out = run({**config, "input": {}}, make_ctx(base_dir=SCRIPT_DIR))
    assert out["messages"] == ["Hello, World! (Greeting #1)"]

    # the playbook's verify step: an input named `result`, asserts, then rebinds `result`
    verify = """\
assert result['status'] == 'success', f"Expected success, got {result['status']}"
assert result['total_greetings'] == 3, f"Expected 3 greetings, got {result['total_greetings']}"
assert result['script_source'] == 'file', f"Expected file source, got {result['script_source']}"
assert len(result['messages']) == 3, f"Expected 3 messages, got {len(result['messages'])}"

result = {
    "status": "verified",
    "checks_passed": 4,
    "result": result
}
"""
    first = run(config, make_ctx(base_dir=SCRIPT_DIR))
    verified = run({"input": {"result": first}, "code": verify})
    assert verified == {"status": "verified", "checks_passed": 4, "result": first}


@pytest.mark.parametrize(
    "script",
    [
        {"type": "file", "path": "scripts/hello_world.py"},
        {"type": "file", "uri": "scripts/hello_world.py"},
        {"path": "scripts/hello_world.py", "source": {"type": "file"}},
        {"type": "file", "path": str(SCRIPT_DIR / "scripts/hello_world.py")},
        {"type": "file", "path": "file://" + str(SCRIPT_DIR / "scripts/hello_world.py")},
        "scripts/hello_world.py",
    ],
)
def test_script_file_shapes(script: Any) -> None:
    out = run({"script": script, "input": {"name": "x"}}, make_ctx(base_dir=SCRIPT_DIR))
    assert out["messages"] == ["Hello, x! (Greeting #1)"]


def test_script_path_falls_back_to_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(SCRIPT_DIR)
    config = {"script": {"type": "file", "path": "scripts/hello_world.py"}}
    assert run(config, make_ctx(base_dir=tmp_path))["total_greetings"] == 1


def test_script_missing_file_names_the_path(tmp_path: Path) -> None:
    err = run_error(
        {"script": {"uri": "./nope/missing.py", "source": {"type": "file"}}},
        make_ctx(base_dir=tmp_path),
    )
    assert err.kind == "python_error"
    assert err.code == "ScriptNotFound"
    assert "./nope/missing.py" in err.message
    assert str(tmp_path / "nope/missing.py") in err.message


def test_script_inline_and_unsupported_source() -> None:
    assert run({"script": {"type": "inline", "code": "result = 7"}}) == 7
    err = run_error({"script": {"type": "http", "endpoint": "http://x/a.py"}})
    assert err.code == "UnsupportedScriptSource"
    assert run_error({"input": {}}).code == "InvalidConfig"


def test_error_in_script_file_reports_its_path(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("def main():\n    return {}['missing']\n")
    err = run_error({"script": {"type": "file", "path": "bad.py"}}, make_ctx(base_dir=tmp_path))
    assert err.code == "KeyError"
    assert "(line 2: return {}['missing'])" in err.message
    assert str(tmp_path / "bad.py") in err.data["traceback"]


@pytest.mark.parametrize("temperature", ["30", 30, 30.5])
def test_control_flow_float_of_input(temperature: Any) -> None:
    code = """\
is_hot = float(temperature_c) >= 25.0
msg = "hot" if is_hot else "cold"
result = {"is_hot": is_hot, "message": msg}
"""
    assert run({"input": {"temperature_c": temperature}, "code": code}) == {
        "is_hot": True,
        "message": "hot",
    }


# ---------------------------------------------------------------- namespace


def test_input_named_input_data_is_not_wrapped_again() -> None:
    code = "result = {'payload': input_data, 'other': other}"
    out = run({"input": {"input_data": {"temp_table": "t1"}, "other": 5}, "code": code})
    assert out == {"payload": {"temp_table": "t1"}, "other": 5}
    # the pagination fixture passes a list as `input_data`
    out = run({"input": {"input_data": [1, 2]}, "code": "result = len(input_data)"})
    assert out == 2


def test_input_data_is_the_whole_input() -> None:
    code = "result = [input_data, a]"
    assert run({"input": {"a": 1, "b": [2]}, "code": code}) == [{"a": 1, "b": [2]}, 1]


@pytest.mark.parametrize("config", [{}, {"input": None}])
def test_absent_or_null_input(config: dict[str, Any]) -> None:
    assert run({**config, "code": "result = input_data"}) == {}


def test_non_mapping_input_is_input_data() -> None:
    assert run({"input": [1, 2, 3], "code": "result = sum(input_data)"}) == 6


def test_input_is_detached_from_the_caller() -> None:
    items = [1]
    config = {"input": {"items": items}, "code": "items.append(2)\nresult = items"}
    assert run(config) == [1, 2]
    assert items == [1]


def test_context_execution_id_and_json() -> None:
    render = {"workload": {"action": "list_users"}, "use_vars_in_template": {"a": 1}}
    ctx = make_ctx(render_context=render)
    code = """\
result = {
    "vars": context.get("use_vars_in_template", {}),
    "has": "workload" in context,
    "type": type(context).__name__,
    "eid": execution_id,
    "dumped": json.dumps({"k": 1}),
}
context["workload"]["action"] = "mutated"
"""
    out = run({"code": code}, ctx)
    assert out == {
        "vars": {"a": 1},
        "has": True,
        "type": "dict",
        "eid": "4242",
        "dumped": '{"k": 1}',
    }
    assert render["workload"]["action"] == "list_users"


def test_input_keys_override_presets() -> None:
    assert run({"input": {"execution_id": "x"}, "code": "result = execution_id"}) == "x"


# ---------------------------------------------------------------- libs


def test_libs_alias_to_module() -> None:
    out = run({"libs": {"rnd": "random"}, "code": "result = rnd.__name__"})
    assert out == "random"


def test_libs_from_import() -> None:
    config = {
        "libs": {"datetime": {"from": "datetime", "import": "datetime"}},
        "code": "result = datetime.now().year > 2000 and datetime.__name__",
    }
    assert run(config) == "datetime"


def test_libs_from_import_of_unimported_submodule(
    open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In a folder the child's user (nobody, under a root run) can read.
    pkg = open_dir / "flowtide_libs_probe"
    pkg.mkdir(mode=0o755)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub.py").write_text("VALUE = 'from-submodule'\n")
    monkeypatch.syspath_prepend(str(open_dir))
    config = {
        "libs": {"storage": {"from": "flowtide_libs_probe", "import": "sub"}},
        "code": "result = storage.VALUE",
    }
    try:
        assert run(config) == "from-submodule"
    finally:
        sys.modules.pop("flowtide_libs_probe.sub", None)
        sys.modules.pop("flowtide_libs_probe", None)


def test_libs_list_of_pip_names_is_ignored() -> None:
    config = {"libs": ["psycopg2-binary", "pandas"], "code": "import math\nresult = math.pi > 3"}
    assert run(config) is True


def test_libs_errors() -> None:
    err = run_error({"libs": {"x": "no_such_module_flowtide"}, "code": "result = 1"})
    assert err.kind == "python_error"
    assert err.code == "ModuleNotFoundError"
    assert "libs.x" in err.message
    assert run_error({"libs": {"bad-alias": "json"}, "code": ""}).code == "InvalidConfig"
    assert run_error({"libs": {"x": 3}, "code": ""}).code == "InvalidConfig"


# ---------------------------------------------------------------- result conventions


def test_main_without_parameters() -> None:
    assert run({"code": 'def main():\n    return {"status": "ok"}\n'}) == {"status": "ok"}


def test_main_gets_matching_inputs_only() -> None:
    code = "def main(a, b=1):\n    return [a, b]\n"
    assert run({"input": {"a": 5, "unrelated": 9}, "code": code}) == [5, 1]
    assert run({"input": {"a": 5, "b": 2}, "code": code}) == [5, 2]


def test_main_kwargs_gets_everything() -> None:
    code = "def main(a, **kw):\n    return {'a': a, 'kw': kw}\n"
    assert run({"input": {"a": 1, "b": 2, "c": 3}, "code": code}) == {
        "a": 1,
        "kw": {"b": 2, "c": 3},
    }


def test_main_positional_only_and_namespace_specials() -> None:
    code = (
        "def main(a, /, input_data, execution_id=None):\n    return [a, input_data, execution_id]"
    )
    assert run({"input": {"a": 1}, "code": code}) == [1, {"a": 1}, "4242"]


def test_main_missing_required_parameter_is_a_type_error() -> None:
    err = run_error({"input": {}, "code": "def main(needed):\n    return needed\n"})
    assert err.code == "TypeError"
    assert "needed" in err.message


def test_async_main() -> None:
    code = "import asyncio\nasync def main(x):\n    await asyncio.sleep(0)\n    return x * 2\n"
    assert run({"input": {"x": 21}, "code": code}) == 42


def test_main_takes_precedence_over_result() -> None:
    code = "result = 'global'\ndef main():\n    return 'main'\n"
    assert run({"code": code}) == "main"


def test_main_called_from_input_is_not_main() -> None:
    # an input value that happens to be named `main` is data, not an entry point
    assert run({"input": {"main": "data"}, "code": "result = main"}) == "data"


def test_nothing_defined_gives_none() -> None:
    assert run({"code": "x = 1\nprint(x)\n"}) is None
    assert run({"code": ""}) is None


def test_return_in_nested_blocks_and_fall_through_to_result() -> None:
    code = """\
total = 0
for n in numbers:
    if n < 0:
        return {"error": n}
    total = total + n
result = {"total": total}
"""
    assert run({"input": {"numbers": [1, 2, -3]}, "code": code}) == {"error": -3}
    assert run({"input": {"numbers": [1, 2, 3]}, "code": code}) == {"total": 6}


def test_wrapped_body_reads_an_input_before_rebinding_it() -> None:
    code = "count = count + 1\nreturn count"
    assert run({"input": {"count": 1}, "code": code}) == 2


def test_wrapped_body_closures_globals_and_main() -> None:
    code = """\
factor = 3
def scale(x):
    return x * factor
global seen
seen = scale(2)
if flag:
    return {"scaled": scale(5), "seen": seen}
def main(flag):
    return {"main": flag}
"""
    assert run({"input": {"flag": True}, "code": code}) == {"scaled": 15, "seen": 6}
    # no return reached: `main` defined in the wrapped body still wins
    assert run({"input": {"flag": False}, "code": code}) == {"main": False}


def test_wrapped_body_keeps_future_and_star_imports() -> None:
    code = "from __future__ import annotations\nfrom math import *\nx: int = 1\nreturn floor(2.5)"
    assert run({"code": code}) == 2


def test_wrapped_explicit_return_none_beats_result() -> None:
    assert run({"code": "result = 1\nreturn None"}) is None
    assert run({"code": "result = 1\nif False:\n    return 2"}) == 1


def test_user_code_does_not_inherit_future_flags() -> None:
    # this test module and the tool use `from __future__ import annotations`; the user's
    # code must be compiled with plain semantics
    code = "def f(x: int):\n    pass\nresult = f.__annotations__['x'] is int"
    assert run({"code": code}) is True
    assert run({"code": code + "\nreturn result"}) is True


def test_return_inside_function_only_does_not_wrap() -> None:
    code = "def helper():\n    return 5\nresult = helper()"
    assert run({"code": code}) == 5


# ---------------------------------------------------------------- result conversion


def test_result_is_converted_to_plain_json() -> None:
    code = """\
import datetime as dt
from decimal import Decimal
result = {
    "tuple": (1, (2, 3)),
    "set": {3, 1, 2},
    "datetime": dt.datetime(2024, 1, 2, 3, 4, 5),
    "date": dt.date(2024, 1, 2),
    "decimal": Decimal("1.5"),
    "text_bytes": b"abc",
    "binary": bytes([255, 0]),
    1: "int key",
    None: "none key",
}
"""
    assert run({"code": code}) == {
        "tuple": [1, [2, 3]],
        "set": [1, 2, 3],
        "datetime": "2024-01-02T03:04:05",
        "date": "2024-01-02",
        "decimal": 1.5,
        "text_bytes": "YWJj",  # bytes are base64, decodable or not (was "abc")
        "binary": "/wA=",
        "1": "int key",
        "null": "none key",
    }


def test_steps_that_have_not_run_are_none_in_context_and_inputs() -> None:
    """The render context and the inputs hold a step that has not run as a template
    Undefined; the code sees None in a child process (the copy it gets is JSON) and in
    this process alike (NoETL e2e playbook_composition, whose code names `context`)."""
    from flowtide.playbook.template import NotRun

    def later() -> NotRun:
        return NotRun(name="later", hint="step 'later' has not run")

    ctx = make_ctx(render_context={"done": {"x": 1}, "later": later()})
    code = "result = {'later': context['later'], 'done': context['done'], 'maybe': maybe}"
    assert run({"code": code, "input": {"maybe": later()}}, ctx) == {
        "later": None,
        "done": {"x": 1},
        "maybe": None,
    }


def test_values_from_main_are_converted_too() -> None:
    moment = dt.datetime(2024, 5, 6, 7, 8, 9)
    code = "import datetime\ndef main():\n    return (datetime.datetime(2024, 5, 6, 7, 8, 9),)"
    assert run({"code": code}) == [moment.isoformat()]


def test_non_serialisable_result_names_type_and_path() -> None:
    code = "class Thing:\n    pass\nresult = {'rows': [1, Thing()]}"
    err = run_error({"code": code})
    assert err.kind == "python_error"
    assert err.code == "ResultNotSerializable"
    assert "result['rows'][1]" in err.message
    assert "Thing" in err.message


# ---------------------------------------------------------------- errors


def test_exception_shape_and_user_only_traceback() -> None:
    code = "x = 1\n\ndef boom(v):\n    return v / 0\n\nboom(x)\n"
    err = run_error({"code": code})
    assert err.kind == "python_error"
    assert err.code == "ZeroDivisionError"
    assert err.retryable is False
    assert err.message == "ZeroDivisionError: division by zero (line 4: return v / 0)"
    assert err.data["line"] == 4
    trace = err.data["traceback"]
    assert "line 6, in <module>" in trace
    assert "line 4, in boom" in trace
    assert "flowtide" not in trace and "python.py" not in trace


def test_exception_inside_library_points_at_user_line() -> None:
    err = run_error({"code": "data = '{'\nparsed = json.loads(data)\n"})
    assert err.code == "JSONDecodeError"
    assert err.message.startswith("JSONDecodeError: ")
    assert err.data["line"] == 2
    assert "json/decoder.py" not in err.data["traceback"]


def test_exception_line_numbers_in_wrapped_code() -> None:
    err = run_error({"code": "a = 1\nb = {}\nc = b['nope']\nreturn c\n"})
    assert err.code == "KeyError"
    assert err.data["line"] == 3
    assert "(line 3: c = b['nope'])" in err.message


def test_assertion_error_keeps_its_message() -> None:
    err = run_error({"input": {"n": 3}, "code": 'assert n == 20, f"Expected 20 items, got {n}"'})
    assert err.code == "AssertionError"
    assert err.message.startswith("AssertionError: Expected 20 items, got 3 (line 1: assert")
    bare = run_error({"code": "assert False"})
    assert bare.message == "AssertionError (line 1: assert False)"


def test_syntax_error_has_line_and_column() -> None:
    err = run_error({"code": "x = 1\ny = (2 +\n"})
    assert err.kind == "python_error"
    assert err.code == "SyntaxError"
    assert err.data["line"] == 2
    assert err.data["column"] is not None
    assert "line 2" in err.message
    indent = run_error({"code": "x = 1\n    y = 2\n"})
    assert indent.code == "SyntaxError"
    assert indent.data["exception"] == "IndentationError"


def test_syntax_error_inside_wrapped_code() -> None:
    err = run_error({"code": "x = 1\nreturn x\ndef f(:\n    pass\n"})
    assert err.code == "SyntaxError"
    assert err.data["line"] == 3


def test_system_exit_is_an_error() -> None:
    err = run_error({"code": "import sys\nsys.exit(3)"})
    assert err.code == "SystemExit"
    assert err.message.startswith("SystemExit: 3")


def test_output_before_an_error_is_kept() -> None:
    ctx = make_ctx()
    with pytest.raises(ToolError):
        tool().run({"code": "print('before')\nraise ValueError('bad')"}, ctx)
    assert ctx.stdout == ["before"]


# ---------------------------------------------------------------- stdout capture


def test_stdout_routes_every_write_path() -> None:
    ctx = make_ctx()
    code = """\
import sys, builtins
print("a", "b", sep="-")
print("no newline", end="")
print()
sys.stdout.write("written\\n")
builtins.print("builtin print")
print("to stderr", file=sys.stderr)
"""
    assert run({"code": code}, ctx) is None
    assert ctx.stdout == ["a-b", "no newline", "written", "builtin print", "to stderr"]


def test_output_is_capped() -> None:
    ctx = make_ctx()
    run({"code": "for i in range(50):\n    print('x' * 9)"}, ctx, output_limit=100)
    kept = ctx.stdout[:-1]
    assert sum(len(line) + 1 for line in kept) <= 100 + 1
    assert ctx.stdout[-1].startswith("[flowtide: output truncated at 100 characters; 400 more")


def test_concurrent_calls_do_not_mix_output(capsys: pytest.CaptureFixture[str]) -> None:
    code = """\
import sys, time
for i in range(40):
    print(f"{tag}:{i}")
    sys.stdout.write(f"{tag}:w{i}\\n")
    time.sleep(0)
result = tag
"""
    n = 16
    barrier = threading.Barrier(n + 1)
    contexts = [make_ctx(step=f"s{i}") for i in range(n)]
    results: dict[int, Any] = {}
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        barrier.wait()
        try:
            results[i] = tool().run({"input": {"tag": f"t{i}"}, "code": code}, contexts[i])
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    barrier.wait()
    # a thread that is not running python code keeps writing to the real stdout
    for _ in range(20):
        print("outside-line")
        time.sleep(0)
    for thread in threads:
        thread.join()
    assert not errors
    for i, ctx in enumerate(contexts):
        assert results[i] == f"t{i}"
        expected = []
        for k in range(40):
            expected += [f"t{i}:{k}", f"t{i}:w{k}"]
        assert ctx.stdout == expected
    captured = capsys.readouterr().out
    assert captured.count("outside-line") == 20
    assert "t0:" not in captured


def test_real_stdout_is_not_taken_over(capsys: pytest.CaptureFixture[str]) -> None:
    ctx = make_ctx()
    run({"code": "print('inside')"}, ctx)
    print("after the call")
    sys.stdout.write("direct write\n")
    assert ctx.stdout == ["inside"]
    out = capsys.readouterr().out
    assert "after the call" in out and "direct write" in out
    assert "inside" not in out


# ---------------------------------------------------------------- timeout


def _python_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("flowtide-python")]


def test_timeout_interrupts_busy_loop() -> None:
    thread_isolation_only("a helper thread is interrupted (a child process is killed instead)")
    started = time.monotonic()
    ctx = make_ctx(step="spin")
    err = run_error({"code": "print('spinning')\nwhile True:\n    pass\n", "timeout": 0.3}, ctx)
    elapsed = time.monotonic() - started
    assert err.kind == "timeout"
    assert err.retryable is True
    assert err.data["abandoned"] is False
    assert 0.25 <= elapsed < 2.0
    assert ctx.stdout == ["spinning"]
    deadline = time.monotonic() + 2
    while any(t.name == "flowtide-python[spin]" for t in _python_threads()):
        assert time.monotonic() < deadline, "helper thread still alive"
        time.sleep(0.01)


def test_timeout_is_not_swallowed_by_except_exception() -> None:
    code = "while True:\n    try:\n        x = [1] * 10\n    except Exception:\n        pass\n"
    err = run_error({"code": code, "timeout": "0.2"})
    assert err.kind == "timeout"


def test_ctx_timeout_applies() -> None:
    err = run_error({"code": "while True:\n    pass\n"}, make_ctx(timeout=0.2))
    assert err.kind == "timeout"


def test_with_timeout_fast_code_behaves_the_same() -> None:
    ctx = make_ctx()
    config = {"input": {"a": 2}, "code": "print('hi')\nreturn {'a': a}", "timeout": 5}
    assert run(config, ctx) == {"a": 2}
    assert ctx.stdout == ["hi"]
    err = run_error({"code": "x = 1\nraise ValueError('bad value')", "timeout": 5})
    assert err.kind == "python_error"
    assert err.code == "ValueError"
    assert err.message == "ValueError: bad value (line 2: raise ValueError('bad value'))"


def test_invalid_timeout_is_a_config_error() -> None:
    assert run_error({"code": "", "timeout": "soon"}).code == "InvalidConfig"


# ---------------------------------------------------------------- compile cache


def test_compile_cache_hits_in_a_loop() -> None:
    thread_isolation_only("the cache of this process (a child has its own)")
    compile_cache_clear()
    code = "result = {'n': n * 2}  # compile-cache probe"
    for n in range(1000):
        assert tool().run({"input": {"n": n}, "code": code}, make_ctx()) == {"n": n * 2}
    info = compile_cache_info()
    assert info.misses == 1
    assert info.hits == 999


def test_timeout_abandons_a_thread_blocked_in_c() -> None:
    thread_isolation_only("a thread blocked in C is abandoned (a child process is killed)")
    started = time.monotonic()
    ctx = make_ctx(step="sleeper")
    err = run_error({"code": "import time\ntime.sleep(1.2)\nprint('late')", "timeout": 0.2}, ctx)
    assert err.kind == "timeout"
    assert err.data["abandoned"] is True
    assert "abandoned" in err.message
    assert time.monotonic() - started < 1.0
    # once the sleep returns, the pending exception stops the thread; its late output
    # never reaches the already-reported call
    deadline = time.monotonic() + 3
    while any(t.name == "flowtide-python[sleeper]" for t in _python_threads()):
        assert time.monotonic() < deadline, "abandoned thread never finished"
        time.sleep(0.05)
    assert ctx.stdout == []


# ---------------------------------------------------------------- live log


class _Lines:
    """A command's live log that records what it is given."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> None:
        self.parts.append(text)

    def add_secrets(self, values: Any) -> None:
        pass


def test_what_the_code_prints_goes_to_the_live_log_too() -> None:
    live = _Lines()
    ctx = make_ctx()
    ctx.log = live
    code = "import sys\nprint('one')\nsys.stdout.write('two\\n')\nprint('three', file=sys.stderr)"
    run({"code": code}, ctx)
    assert ctx.stdout == ["one", "two", "three"]
    # In-process as each is printed, from a child with its reply: the same text.
    assert "".join(live.parts) == "one\ntwo\nthree\n"


def test_a_failure_reports_the_users_frames() -> None:
    code = "def inner():\n    raise KeyError('k')\n\ndef main():\n    return inner()\n"
    error = run_error({"code": code})
    frames = error.data["frames"]
    assert [(f["line"], f["function"]) for f in frames][-2:] == [(5, "main"), (2, "inner")]
    assert frames[-1]["source"] == "raise KeyError('k')" and error.data["filename"] == "<code>"


def test_the_live_log_gets_output_while_the_code_runs() -> None:
    folder = Path(tempfile.mkdtemp(prefix="flowtide-live-"))
    folder.chmod(0o755)  # a child may run as the python steps' user
    go = folder / "go"
    live = _Lines()
    ctx = make_ctx()
    ctx.log = live
    code = (
        "import os, time\nprint('first')\ndeadline = time.monotonic() + 30\n"
        "while not os.path.exists(go) and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\nprint('second')\nresult = os.path.exists(go)"
    )
    done: list[Any] = []
    worker = threading.Thread(
        target=lambda: done.append(run({"code": code, "input": {"go": str(go)}}, ctx))
    )
    worker.start()
    try:
        deadline = time.monotonic() + 15
        while "first\n" not in "".join(live.parts):
            assert time.monotonic() < deadline, live.parts
            time.sleep(0.01)
        assert done == []  # still waiting for `go`
    finally:
        go.touch()
        worker.join(30)
    assert done == [True]
    assert "".join(live.parts) == "first\nsecond\n"
    shutil.rmtree(folder)
