"""The `python` tool: runs a step's Python code the way NoETL playbooks write it.

Where it runs (`Isolation`, flowtide.tools.python_pool): in this process, on the calling
thread ("thread", the embedded default), or in a child process of a warm pool
("process", the worker's default), which a timeout or a cancel kills. Both give the same
results, errors and captured output; what follows describes the code's side of it, which
is the same in a child (the child runs `run_request`).

Config (every template already rendered, including Jinja inside `code`):

* `code: str`, or `script:` in one of the shapes `{uri|path, source: {type: file}}`,
  `{type: file, path|uri}`, `{type: inline, code}` or a bare path string. File paths are
  resolved against `ctx.base_dir`, then the working directory. `code` wins over `script`.
* `input: dict | None` - every key becomes a global; the dict itself is `input_data`
  (an input key named `input_data` is used as is, not wrapped again).
* `libs:` - `{alias: module}`, `{alias: {from: pkg, import: name}}`, or a list of pip
  names (ignored: such code does its own imports).
* `timeout:` seconds (the smaller of it and `ctx.timeout` applies).

The code also sees `json` (pre-imported), `context` (the render context as a plain dict),
`execution_id` and the `libs` aliases. The result is, in order of precedence: the return
value of a `main` callable the code defines (called with the input values its signature
names, `**kwargs` gets all); the value of a module-level `return`; the global `result`;
otherwise None. It becomes JSON by the rules every tool's results follow
(`flowtide.jsonvalues`, README "Results as JSON"): the same in a child process, and the
same as a postgres or duckdb row holding those values. A value with no JSON form fails
the call (code "ResultNotSerializable") naming its type and path (`result['rows'][3]`).

Output capture. `print` output goes to `ctx.stdout`, one string per line, capped at
64 KiB. Two mechanisms work together, because either alone has a hole:

* the namespace gets its own `print` bound to this call's buffer. It cannot be
  misrouted - not by another thread swapping `sys.stdout` (pytest, `redirect_stdout`
  elsewhere), nor when the code prints from threads it starts itself - and it is the
  cheapest path. It only covers `print` calls made by the code itself, though;
* so `sys.stdout`/`sys.stderr` are also replaced, once, by a thread-routing proxy: a write
  from a thread that is running a python task goes to that task's buffer, any other write
  passes through to the stream that was there before. This catches `sys.stdout.write` and
  prints inside library functions. If something later replaces `sys.stdout`, the proxy is
  re-installed on top of it at the next call.

Writes made straight to file descriptor 1/2 (C extensions, subprocesses) are not captured.

Timeouts in-process. Without a timeout the code runs on the calling (worker) thread: no extra thread
on the hot path. With one, it runs on a helper thread; when time runs out an exception is
injected into that thread with `PyThreadState_SetAsyncExc`. That interrupts pure-Python
code (loops, comprehensions) but not a blocking C call (`time.sleep`, a socket read): such
a thread is abandoned, the exception fires whenever it next runs Python code, and the call
fails with `kind="timeout"` straight away. Code that catches `BaseException` (or uses a
bare `except:`) can swallow the injected exception; the call still reports a timeout.

The parts: compilation, cached per source text, and the errors of user code in
`python_code`; the namespace, `libs`, `main`'s arguments and the JSON result in
`python_namespace`; output capture in `python_output`; running in this process, with or
without a timeout, in `python_run`; process isolation in `python_pool` and
`python_child`. This module is the tool itself: its config, `PythonTool`, `run_request`
(what a child runs) and `run_user_code` (how other tools embed user Python).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from flowtide.errors import ToolError
from flowtide.tools.base import ToolContext, seconds
from flowtide.tools.python_code import (
    _CODE_FILENAME,
    _compiled,
    compile_cache_clear,
    compile_cache_info,
)
from flowtide.tools.python_namespace import _invalid, _json_result, _load_libs, _namespace, _plain
from flowtide.tools.python_output import _Capture, _ensure_routing
from flowtide.tools.python_pool import ChildPool, Isolation
from flowtide.tools.python_run import _run_here, _run_with_timeout
from flowtide.tools.script_source import load_script

__all__ = [
    "DEFAULT_OUTPUT_LIMIT",
    "PythonTool",
    "compile_cache_clear",
    "compile_cache_info",
    "run_request",
    "run_user_code",
]

DEFAULT_OUTPUT_LIMIT = 64 * 1024
"""Characters of captured output kept per call; the rest is counted and dropped."""


def _load_source(config: Mapping[str, Any], ctx: ToolContext) -> tuple[str, str]:
    """The code to run and the filename it is compiled under."""
    code = config.get("code")
    if code is not None:
        if not isinstance(code, str):
            raise _invalid(f"code: expected a string, got {type(code).__name__}")
        return code, _CODE_FILENAME
    script = config.get("script")
    if script is None:
        raise _invalid("python tool needs `code` or `script`")
    text, path = load_script(
        script, ctx.base_dir, tool="python", step=ctx.step, kind="python_error"
    )
    return text, path or _CODE_FILENAME


def _tee(ctx: ToolContext) -> Callable[[str], None] | None:
    """Where the code's output goes as it is printed: the command's live log."""
    return None if ctx.log is None else ctx.log.write


def _effective_timeout(config: Mapping[str, Any], ctx: ToolContext) -> float | None:
    return seconds(config, ctx, "timeout", default=None, invalid=_invalid)


class PythonTool:
    """Runs python code (`kind: python`); see the module docstring."""

    kind = "python"

    def __init__(
        self, *, output_limit: int = DEFAULT_OUTPUT_LIMIT, isolation: Isolation | None = None
    ) -> None:
        """`output_limit`: characters of printed output kept per call. `isolation`: where
        the code runs (default: `Isolation.from_env()`, in-process unless
        FLOWTIDE_PYTHON_ISOLATION=process)."""
        self.output_limit = output_limit
        self.isolation = isolation or Isolation.from_env()
        self._pool: ChildPool | None = None
        self._pool_lock = threading.Lock()

    def configure(self, isolation: Isolation) -> None:
        """Use `isolation` from now on (the worker's flags); children of the old settings
        are stopped."""
        with self._pool_lock:
            old, self._pool = self._pool, None
            self.isolation = isolation
        if old is not None:
            old.close()

    def pool(self) -> ChildPool:
        """The child pool of process isolation (created on first use)."""
        with self._pool_lock:
            if self._pool is None:
                self._pool = ChildPool(self.isolation)
            return self._pool

    def warm(self) -> None:
        """Start a child ahead of the first call (process isolation only)."""
        if self.isolation.mode == "process":
            self.pool().prestart(1)

    def cancel(self, execution_id: int | None = None) -> int:
        """Kill the child processes running `execution_id`'s code (every one when None).
        Code running in-process cannot be stopped from outside: it is left to finish."""
        pool = self._pool
        return pool.cancel(execution_id) if pool is not None else 0

    def run(self, config: dict[str, Any], ctx: ToolContext) -> Any:
        """Run one python task and return its JSON-serialisable result.

        Raises:
            ToolError: kind "python_error" (code = exception class name, "SyntaxError",
                "ResultNotSerializable", "InvalidConfig", "ScriptNotFound", ...), kind
                "timeout" (retryable); with process isolation also "cancelled", "crashed"
                (the child died: killed, out of memory) and "result_too_large".
        """
        source, filename = _load_source(config, ctx)
        timeout = _effective_timeout(config, ctx)
        if self.isolation.mode == "process":
            return self._run_in_child(source, filename, config, timeout, ctx)
        unit = _compiled(source, filename)
        raw_input = config.get("input")
        inputs = {} if raw_input is None else _plain(raw_input)
        libs = _load_libs(config.get("libs"))
        capture = _Capture(self.output_limit, _tee(ctx))
        ns = _namespace(unit, inputs, libs, ctx.execution_id, ctx.render_context, capture)
        _ensure_routing()
        try:
            if timeout is None:
                # Hot path: run right here on the worker thread.
                value = _run_here(unit, ns, inputs, capture)
            else:
                value = _run_with_timeout(unit, ns, inputs, capture, timeout, ctx.step)
        finally:
            capture.drain_into(ctx.stdout)
        return _json_result(value)

    def _run_in_child(
        self,
        source: str,
        filename: str,
        config: Mapping[str, Any],
        timeout: float | None,
        ctx: ToolContext,
    ) -> Any:
        request: dict[str, Any] = {
            "source": source,
            "filename": filename,
            "input": _plain(config.get("input")),
            "libs": config.get("libs"),
            "execution_id": ctx.execution_id,
            "limit": self.output_limit,
        }
        if "context" in source:  # the rule `_Unit.uses_context` follows
            request["context"] = _plain(ctx.render_context)
        if ctx.log is not None:
            request["live"] = True  # the child forwards what it prints as it prints it
        reply = self.pool().run(
            request,
            execution_id=ctx.execution_id,
            timeout=timeout,
            cancelled=ctx.cancelled,
            log=_tee(ctx),
        )
        ctx.stdout.extend(str(line) for line in reply["stdout"])
        if reply.get("ok"):
            return reply.get("result")
        raw_error = reply.get("error")
        error: dict[str, Any] = raw_error if isinstance(raw_error, dict) else {}
        message = str(error.get("message") or "the python step failed")
        if error.get("code") == "MemoryError" and self.isolation.memory_mb:
            message += (
                f" (a python step may use {self.isolation.memory_mb} MiB:"
                " FLOWTIDE_PYTHON_MEMORY_MB / --python-memory-mb)"
            )
        raise ToolError(
            message,
            kind=str(error.get("kind") or "python_error"),
            code=error.get("code"),
            data=error.get("data"),
            retryable=bool(error.get("retryable")),
        )


def run_request(
    request: Mapping[str, Any], stdout: list[str], tee: Callable[[str], None] | None = None
) -> Any:
    """Run one request of a python child process (`flowtide.tools.python_child`) and
    return its JSON result; printed lines go to `stdout` (and, as printed, to `tee`).
    Time limits are the parent's.

    Raises:
        ToolError: as `PythonTool.run` does for the code itself.
    """
    unit = _compiled(request["source"], request["filename"])
    raw_input = request.get("input")
    inputs = {} if raw_input is None else raw_input
    libs = _load_libs(request.get("libs"))
    capture = _Capture(int(request.get("limit") or DEFAULT_OUTPUT_LIMIT), tee)
    ns = _namespace(
        unit, inputs, libs, request["execution_id"], request.get("context") or {}, capture
    )
    _ensure_routing()
    try:
        value = _run_here(unit, ns, inputs, capture)
    finally:
        capture.drain_into(stdout)
    return _json_result(value)


def run_user_code(
    source: str,
    ctx: ToolContext,
    *,
    inputs: Mapping[str, Any],
    extra_globals: Mapping[str, Any] | None = None,
    filename: str = _CODE_FILENAME,
) -> Any:
    """Run `source` the way the python tool does and return its raw result (not converted
    to JSON): `main(...)` called with the values of `inputs` its signature names, else a
    module-level `return`, else the global `result`. `inputs` keys are also globals;
    `extra_globals` are globals that `main` can name as parameters too. Printed output goes
    to `ctx.stdout`. Other tools (spark `code:`) embed user Python through this.

    Raises:
        ToolError: kind "python_error" (syntax error, or an exception from the code, with
            the user's line).
    """
    unit = _compiled(source, filename)
    merged = {**(extra_globals or {}), **inputs}
    capture = _Capture(DEFAULT_OUTPUT_LIMIT, _tee(ctx))
    ns = _namespace(unit, dict(inputs), {}, ctx.execution_id, ctx.render_context, capture)
    ns.update({k: v for k, v in (extra_globals or {}).items() if k not in inputs})
    _ensure_routing()
    try:
        return _run_here(unit, ns, merged, capture)
    finally:
        capture.drain_into(ctx.stdout)
