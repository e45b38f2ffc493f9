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
"""

from __future__ import annotations

import ast
import builtins
import contextvars
import ctypes
import functools
import importlib
import inspect
import json
import sys
import threading
import types
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from flowtide.errors import ToolError
from flowtide.jsonvalues import MAX_DEPTH, to_json
from flowtide.tools.base import ToolContext
from flowtide.tools.python_pool import ChildPool, Isolation

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

_CODE_FILENAME = "<code>"
_COMPILE_CACHE_SIZE = 512
_BODY_NAME = "__flowtide_body__"
_SEED_ARG = "__flowtide_seed__"
_END_ARG = "__flowtide_end__"
_MODULE_NAME = "__flowtide__"
# How long a timed-out helper thread gets to unwind after the injected exception.
_TIMEOUT_GRACE = 0.5
_MAX_MESSAGE = 2000
_MAX_TRACE_FRAMES = 12
_MISSING = object()


# --------------------------------------------------------------------------------------
# Compilation (cached per distinct source text)
# --------------------------------------------------------------------------------------


class _Unit:
    """A compiled code block plus what the runner needs to know about it."""

    __slots__ = ("code", "pre_code", "wrapped", "uses_context", "filename", "lines")

    def __init__(
        self,
        code: types.CodeType,
        *,
        pre_code: types.CodeType | None,
        wrapped: bool,
        uses_context: bool,
        filename: str,
        lines: tuple[str, ...],
    ) -> None:
        self.code = code
        self.pre_code = pre_code
        self.wrapped = wrapped
        self.uses_context = uses_context
        self.filename = filename
        self.lines = lines

    def line(self, lineno: int) -> str:
        if 1 <= lineno <= len(self.lines):
            return self.lines[lineno - 1].strip()
        return ""


class _FellThrough:
    """Returned by a wrapped body that ended without `return`; carries its local scope."""

    __slots__ = ("scope",)

    def __init__(self, scope: dict[str, Any]) -> None:
        self.scope = scope


def _module_level_statements(body: list[ast.stmt]) -> Iterable[ast.stmt]:
    """Every statement executed in module scope: nested blocks yes, def/class bodies no."""
    stack = list(reversed(body))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                stack.append(child)
            elif isinstance(child, ast.ExceptHandler | ast.match_case):
                stack.extend(s for s in child.body if isinstance(s, ast.stmt))


def _has_module_return(tree: ast.Module) -> bool:
    return any(isinstance(s, ast.Return) for s in _module_level_statements(tree.body))


def _place(node: ast.AST, lineno: int) -> None:
    """Give a synthesized node (and its children) one fixed source position."""
    for sub in ast.walk(node):
        if "lineno" in sub._attributes:
            sub.lineno = sub.end_lineno = lineno  # type: ignore[attr-defined]
            sub.col_offset = sub.end_col_offset = 0  # type: ignore[attr-defined]


def _body_code(module_code: types.CodeType) -> types.CodeType:
    for const in module_code.co_consts:
        if isinstance(const, types.CodeType) and const.co_name == _BODY_NAME:
            return const
    raise AssertionError("wrapped body function not found")  # pragma: no cover


def _compile_wrapped(
    tree: ast.Module, filename: str
) -> tuple[types.CodeType, types.CodeType | None]:
    """Compile a module that uses `return` at top level as the body of a function.

    The function is `def body(seed, end)`: names the body assigns are locals of the
    function, so each is first seeded from the namespace when present - otherwise
    `x = x + 1` on an input `x` would raise UnboundLocalError, unlike at module level.
    Names the body only reads resolve as globals, i.e. in the namespace. A body that ends
    without `return` hands back `end(locals())` so `main`/`result` can still be found.
    Source line numbers are untouched, so tracebacks point at the user's lines.
    """
    # `from __future__` must stay first in the module, and `import *` is illegal inside a
    # function; both are hoisted out of the wrapper.
    hoisted = [
        s
        for s in tree.body
        if isinstance(s, ast.ImportFrom)
        and (s.module == "__future__" or any(a.name == "*" for a in s.names))
    ]
    body = [s for s in tree.body if not any(s is h for h in hoisted)]
    first = body[0].lineno if body else 1
    last = (body[-1].end_lineno or first) if body else 1

    template = ast.parse(f"def {_BODY_NAME}({_SEED_ARG}, {_END_ARG}):\n    pass\n")
    func = template.body[0]
    assert isinstance(func, ast.FunctionDef)
    _place(func, first)
    fall_through = ast.parse(f"return {_END_ARG}(locals())").body[0]
    _place(fall_through, last)
    future = [s for s in hoisted if s.module == "__future__"]

    def build(prologue: list[ast.stmt]) -> types.CodeType:
        func.body = [*prologue, *body, fall_through]
        module = ast.Module(body=[*future, func], type_ignores=[])
        return _body_code(compile(module, filename, "exec", dont_inherit=True))

    # First pass only to learn which names the body binds locally (the compiler knows
    # better than any AST walk: walrus in comprehensions, match captures, `global`...).
    probe = build([])
    params = {_SEED_ARG, _END_ARG}
    local_names = sorted(
        (set(probe.co_varnames[probe.co_argcount :]) | set(probe.co_cellvars)) - params
    )
    prologue: list[ast.stmt] = []
    for name in local_names:
        stmt = ast.parse(f"if {name!r} in {_SEED_ARG}: {name} = {_SEED_ARG}[{name!r}]").body[0]
        _place(stmt, first)
        prologue.append(stmt)
    code = build(prologue).replace(co_name="<module>", co_qualname="<module>")

    stars: list[ast.stmt] = [s for s in hoisted if s.module != "__future__"]
    pre_code = None
    if stars:
        module = ast.Module(body=stars, type_ignores=[])
        pre_code = compile(module, filename, "exec", dont_inherit=True)
    return code, pre_code


@functools.lru_cache(maxsize=_COMPILE_CACHE_SIZE)
def _compile_unit(source: str, filename: str) -> _Unit:
    """Parse and compile one code block. Raises SyntaxError/ValueError on bad source."""
    tree = ast.parse(source, filename, "exec")
    lines = tuple(source.splitlines())
    # Building `context` deep-copies the render context, so only do it for code that can
    # see it; a substring test is conservative (comments, strings and globals() lookups
    # spelled out all count) and costs nothing at run time.
    uses_context = "context" in source
    if _has_module_return(tree):
        code, pre_code = _compile_wrapped(tree, filename)
        return _Unit(
            code,
            pre_code=pre_code,
            wrapped=True,
            uses_context=uses_context,
            filename=filename,
            lines=lines,
        )
    code = compile(tree, filename, "exec", dont_inherit=True)
    return _Unit(
        code,
        pre_code=None,
        wrapped=False,
        uses_context=uses_context,
        filename=filename,
        lines=lines,
    )


def _compiled(source: str, filename: str) -> _Unit:
    """`_compile_unit`, with bad source as a ToolError (raised outside the handler, so it
    does not chain the SyntaxError)."""
    error: ToolError | None = None
    try:
        return _compile_unit(source, filename)
    except (SyntaxError, ValueError) as exc:
        error = _syntax_error(exc, filename)
    raise error


def compile_cache_info() -> functools._CacheInfo:
    """Hits, misses and size of the compiled-code cache (keyed by source text and file)."""
    return _compile_unit.cache_info()


def compile_cache_clear() -> None:
    """Drop every cached code object (tests, or after editing script files in place)."""
    _compile_unit.cache_clear()


# --------------------------------------------------------------------------------------
# Output capture
# --------------------------------------------------------------------------------------


class _Capture:
    """One call's output buffer, capped at `limit` characters."""

    __slots__ = ("parts", "size", "limit", "dropped", "closed")

    def __init__(self, limit: int) -> None:
        self.parts: list[str] = []
        self.size = 0
        self.limit = limit
        self.dropped = 0
        self.closed = False

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        n = len(text)
        if self.closed:
            # An abandoned (timed-out) thread still printing: its call already reported.
            return n
        room = self.limit - self.size
        if n <= room:
            self.parts.append(text)
            self.size += n
        else:
            if room > 0:
                self.parts.append(text[:room])
                self.size = self.limit
            self.dropped += n - max(room, 0)
        return n

    def drain_into(self, sink: list[str]) -> None:
        """Append the output to `sink` one line per string, then stop accepting writes."""
        self.closed = True
        text = "".join(self.parts)
        self.parts = []
        if text:
            lines = text.split("\n")
            if lines[-1] == "":
                lines.pop()
            sink.extend(lines)
        if self.dropped:
            sink.append(
                f"[flowtide: output truncated at {self.limit} characters; "
                f"{self.dropped} more not shown]"
            )


_tls = threading.local()
_routing_lock = threading.Lock()


class _RoutingStream:
    """Stand-in for sys.stdout/sys.stderr that routes writes by thread.

    A thread running python-tool code has `_tls.capture` set: its writes go there. Every
    other thread writes through to the stream that was installed before us, so the
    process's real output is never taken over.
    """

    def __init__(self, target: Any) -> None:
        self._target = target

    def write(self, text: str) -> int:
        capture: _Capture | None = getattr(_tls, "capture", None)
        if capture is not None:
            return capture.write(text)
        if self._target is None:  # pythonw-style interpreter without a console
            return len(text)
        written = self._target.write(text)
        return len(text) if written is None else int(written)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if getattr(_tls, "capture", None) is None and self._target is not None:
            self._target.flush()

    def isatty(self) -> bool:
        if getattr(_tls, "capture", None) is not None or self._target is None:
            return False
        return bool(self._target.isatty())

    def __getattr__(self, name: str) -> Any:
        # encoding, errors, fileno, buffer, ...: whatever the wrapped stream offers.
        return getattr(self._target, name)


def _ensure_routing() -> None:
    """Install the routing proxy on sys.stdout/sys.stderr unless it is already there."""
    if type(sys.stdout) is _RoutingStream and type(sys.stderr) is _RoutingStream:
        return
    with _routing_lock:
        for name in ("stdout", "stderr"):
            current = getattr(sys, name)
            if type(current) is not _RoutingStream:
                setattr(sys, name, _RoutingStream(current))


def _make_print(capture: _Capture) -> Callable[..., None]:
    """A `print` for the code's namespace that writes to this call's buffer."""
    real_print = builtins.print

    def print(
        *args: Any,
        sep: str | None = " ",
        end: str | None = "\n",
        file: Any = None,
        flush: bool = False,
    ) -> None:
        if file is not None:
            real_print(*args, sep=sep, end=end, file=file, flush=flush)
            return
        if sep is None:
            sep = " "
        if end is None:
            end = "\n"
        if not isinstance(sep, str) or not isinstance(end, str):
            raise TypeError("sep and end must be None or a string")
        capture.write(sep.join([str(a) for a in args]) + end)

    return print


# --------------------------------------------------------------------------------------
# Namespace, libs, main()
# --------------------------------------------------------------------------------------


def _plain(value: Any, depth: int = 0) -> Any:
    """Detached plain copy of a JSON-like value: Mappings -> dict, sequences -> list.

    Inputs and the render context may share objects with engine state (step results);
    user code mutating them in place must not change what the engine recorded. A step
    that has not run (a template Undefined) is None: what the code sees is then the same
    in a child process, which gets the copy as JSON (the Undefined cannot be written).
    """
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value  # the common leaves, without the slower ABC isinstance checks
    if depth > MAX_DEPTH:
        return value
    if kind is dict or isinstance(value, Mapping):
        return {k: _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, depth + 1) for v in value]
    jinja2 = sys.modules.get("jinja2")
    if jinja2 is not None and isinstance(value, jinja2.Undefined):
        return None
    return value


def _invalid(message: str) -> ToolError:
    return ToolError(message, kind="python_error", code="InvalidConfig")


def _import_lib(alias: str, spec: Any) -> Any:
    if spec is None or spec is True:
        return importlib.import_module(alias)
    if isinstance(spec, str):
        return importlib.import_module(spec)
    if isinstance(spec, Mapping):
        source = spec.get("from")
        name = spec.get("import")
        if isinstance(source, str) and isinstance(name, str):
            module = importlib.import_module(source)
            try:
                return getattr(module, name)
            except AttributeError:
                # `from google.cloud import storage`: a submodule not imported by its parent.
                return importlib.import_module(f"{source}.{name}")
        if isinstance(name, str):
            return importlib.import_module(name)
        if isinstance(source, str):
            return importlib.import_module(source)
    raise _invalid(
        f"libs.{alias}: expected a module name or {{from: package, import: name}}, got {spec!r}"
    )


def _load_libs(libs: Any) -> dict[str, Any]:
    """Import the `libs` aliases. A list (or string) of pip names is ignored."""
    if libs is None or isinstance(libs, list | tuple | str):
        return {}
    if not isinstance(libs, Mapping):
        raise _invalid(f"libs: expected a mapping or a list, got {type(libs).__name__}")
    loaded: dict[str, Any] = {}
    for alias, spec in libs.items():
        if not isinstance(alias, str) or not alias.isidentifier():
            raise _invalid(f"libs: alias {alias!r} is not a valid Python name")
        try:
            loaded[alias] = _import_lib(alias, spec)
        except ImportError as exc:
            raise ToolError(
                f"{type(exc).__name__}: libs.{alias}: cannot import {spec!r}: {exc}",
                kind="python_error",
                code=type(exc).__name__,
            ) from None
    return loaded


def _call_main(main: Callable[..., Any], inputs: Any, ns: Mapping[str, Any]) -> Any:
    """Call `main` with the input values its signature names (`**kwargs` gets them all).

    A parameter the input lacks but that names a namespace special (`input_data`,
    `context`, `execution_id`) is filled from the namespace.
    """
    source = inputs if isinstance(inputs, dict) else {}
    positional: list[Any] = []
    kwargs: dict[str, Any] = {}
    var_kw = False
    if isinstance(main, types.FunctionType):
        code = main.__code__
        n_pos_only = code.co_posonlyargcount
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        var_kw = bool(code.co_flags & inspect.CO_VARKEYWORDS)
    else:
        params = inspect.signature(main).parameters.values()
        kinds = inspect.Parameter
        pos_only = [p.name for p in params if p.kind is kinds.POSITIONAL_ONLY]
        n_pos_only = len(pos_only)
        names = tuple(
            p.name
            for p in params
            if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)
        )
        var_kw = any(p.kind is kinds.VAR_KEYWORD for p in params)

    def lookup(name: str) -> Any:
        if name in source:
            return source[name]
        if name in ("input_data", "context", "execution_id") and name in ns:
            return ns[name]
        return _MISSING

    positional_open = True
    for index, name in enumerate(names):
        value = lookup(name)
        if index < n_pos_only:
            # A gap ends the positional run: later positional-only ones cannot be passed.
            positional_open = positional_open and value is not _MISSING
            if positional_open:
                positional.append(value)
        elif value is not _MISSING:
            kwargs[name] = value
    if var_kw:
        for key, value in source.items():
            if isinstance(key, str) and key not in kwargs and key not in names[:n_pos_only]:
                kwargs[key] = value
    value = main(*positional, **kwargs)
    if inspect.iscoroutine(value):
        import asyncio  # imported here: a python child starts faster without it

        # `async def main`: the call is on a worker thread with no running loop.
        value = asyncio.run(value)
    return value


def _invoke(unit: _Unit, ns: dict[str, Any], inputs: Any) -> Any:
    """Run the compiled code in `ns` and pick the result (main > return > result)."""
    preset_main = ns.get("main", _MISSING)
    if unit.wrapped:
        if unit.pre_code is not None:
            exec(unit.pre_code, ns)
        body = types.FunctionType(unit.code, ns, "<module>")
        outcome = body(ns, _FellThrough)
        if not isinstance(outcome, _FellThrough):
            return outcome
        scope: Mapping[str, Any] = outcome.scope
    else:
        exec(unit.code, ns)
        scope = ns
    main = scope.get("main", ns.get("main", _MISSING))
    if main is not preset_main and callable(main):
        return _call_main(main, inputs, ns)
    if "result" in scope:
        return scope["result"]
    return ns.get("result")


def _execute(unit: _Unit, ns: dict[str, Any], inputs: Any, capture: _Capture) -> Any:
    """`_invoke` with this thread's writes routed to `capture`."""
    previous = getattr(_tls, "capture", None)
    _tls.capture = capture
    try:
        return _invoke(unit, ns, inputs)
    finally:
        _tls.capture = previous


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------


def _exc_text(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # a user __str__ that raises must not hide the real error
        text = "<unprintable>"
    if len(text) > _MAX_MESSAGE:
        text = text[:_MAX_MESSAGE] + "..."
    return text


def _user_error(exc: BaseException, unit: _Unit) -> ToolError:
    """ToolError for an exception raised while running user code."""
    name = type(exc).__name__
    text = _exc_text(exc)
    frames: list[tuple[int, str]] = []
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename == unit.filename:
            frames.append((tb.tb_lineno, code.co_name))
        tb = tb.tb_next
    message = f"{name}: {text}" if text else name
    line: int | None = None
    if frames:
        line = frames[-1][0]
        source_line = unit.line(line)
        message += f" (line {line}: {source_line})" if source_line else f" (line {line})"
    trace = ["Traceback (user code, most recent call last):"]
    if len(frames) > _MAX_TRACE_FRAMES:
        trace.append(f"  ... {len(frames) - _MAX_TRACE_FRAMES} earlier frames omitted")
        frames = frames[-_MAX_TRACE_FRAMES:]
    for lineno, func in frames:
        trace.append(f'  File "{unit.filename}", line {lineno}, in {func}')
        if unit.line(lineno):
            trace.append(f"    {unit.line(lineno)}")
    trace.append(f"{name}: {text}" if text else name)
    return ToolError(
        message,
        kind="python_error",
        code=name,
        data={"exception": name, "line": line, "traceback": "\n".join(trace)},
    )


def _syntax_error(exc: SyntaxError | ValueError, filename: str) -> ToolError:
    """ToolError for source that does not compile (ValueError: e.g. a NUL byte)."""
    name = type(exc).__name__
    if isinstance(exc, SyntaxError):
        line, column, text = exc.lineno, exc.offset, (exc.text or "").strip()
        detail = exc.msg
    else:
        line, column, text, detail = None, None, "", _exc_text(exc)
    where = [] if filename == _CODE_FILENAME else [f"file {filename}"]
    if line is not None:
        where.append(f"line {line}")
    if column is not None:
        where.append(f"column {column}")
    message = f"{name}: {detail}" + (f" ({', '.join(where)})" if where else "")
    if text:
        message += f": {text}"
    return ToolError(
        message,
        kind="python_error",
        code="SyntaxError",
        data={"exception": name, "line": line, "column": column, "text": text or None},
    )


# --------------------------------------------------------------------------------------
# Result conversion
# --------------------------------------------------------------------------------------


def _json_result(value: Any) -> Any:
    return to_json(value, root="result", kind="python_error")


# --------------------------------------------------------------------------------------
# Timeouts
# --------------------------------------------------------------------------------------


class _PythonTimeout(BaseException):
    """Injected into a helper thread whose code ran past its timeout.

    A BaseException so that the user's `except Exception:` does not swallow it.
    """


_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)
_set_async_exc.restype = ctypes.c_int


def _interrupt(thread_id: int) -> bool:
    """Schedule _PythonTimeout in thread `thread_id`; False if the thread is gone."""
    count = _set_async_exc(ctypes.c_ulong(thread_id), ctypes.py_object(_PythonTimeout))
    if count > 1:  # cannot happen for a valid id; undo rather than hit random threads
        _set_async_exc(ctypes.c_ulong(thread_id), ctypes.py_object())
        return False
    return int(count) == 1


class _Run:
    """State shared between the caller and the helper thread of a timed call."""

    __slots__ = ("lock", "done", "active", "value", "error", "interrupted")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.active = True  # still inside user code: interrupting it is safe
        self.value: Any = None
        self.error: BaseException | None = None
        self.interrupted = False


def _run_with_timeout(
    unit: _Unit,
    ns: dict[str, Any],
    inputs: Any,
    capture: _Capture,
    timeout: float,
    step: str,
) -> Any:
    run = _Run()

    def target() -> None:
        try:
            try:
                run.value = _execute(unit, ns, inputs, capture)
            except _PythonTimeout:
                pass
            except BaseException as exc:  # handed to the caller's thread, re-raised there
                run.error = exc
            finally:
                with run.lock:
                    run.active = False
        except _PythonTimeout:
            # The injected exception landed in the bookkeeping above, after user code.
            pass
        finally:
            run.done.set()

    context = contextvars.copy_context()
    thread = threading.Thread(
        target=context.run, args=(target,), name=f"flowtide-python[{step}]", daemon=True
    )
    thread.start()
    if not run.done.wait(timeout):
        with run.lock:
            # Checked under the lock: once `active` is False, the helper has left user
            # code and must not receive an exception.
            if run.active and thread.ident is not None:
                run.interrupted = _interrupt(thread.ident)
        if run.interrupted:
            unwound = run.done.wait(_TIMEOUT_GRACE)
            raise ToolError(
                f"python code timed out after {timeout:g}s"
                + ("" if unwound else " (blocked in a C call; its thread was abandoned)"),
                kind="timeout",
                retryable=True,
                code="Timeout",
                data={"timeout": timeout, "abandoned": not unwound},
            )
        run.done.wait()  # finished right at the deadline: it is only tidying up
    if run.error is not None:
        error, run.error = run.error, None
        if isinstance(error, Exception | SystemExit):
            raise _user_error(error, unit)
        raise error
    return run.value


# --------------------------------------------------------------------------------------
# The tool
# --------------------------------------------------------------------------------------


def _resolve_script_path(raw: str, base_dir: Path) -> Path:
    text = raw.strip()
    if text.startswith("file://"):
        text = text[len("file://") :]
    path = Path(text).expanduser()
    if path.is_absolute():
        candidates = [path]
    else:
        candidates = [Path(base_dir) / path, Path.cwd() / path]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    tried = ", ".join(str(c) for c in candidates)
    raise ToolError(
        f"python script file not found: {raw!r} (tried {tried})",
        kind="python_error",
        code="ScriptNotFound",
        data={"path": raw, "tried": [str(c) for c in candidates]},
    )


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
    if isinstance(script, str):
        script = {"type": "file", "path": script}
    if not isinstance(script, Mapping):
        raise _invalid(f"script: expected a mapping or a path, got {type(script).__name__}")
    source = script.get("source")
    source_map: Mapping[str, Any] = source if isinstance(source, Mapping) else {}
    kind = (
        script.get("type")
        or source_map.get("type")
        or (source if isinstance(source, str) else None)
    )
    inline = script.get("code", source_map.get("code"))
    location = (
        script.get("path") or script.get("uri") or source_map.get("path") or source_map.get("uri")
    )
    if kind is None:
        kind = "inline" if inline is not None else "file"
    if kind == "inline":
        if not isinstance(inline, str):
            raise _invalid("script: type inline needs a `code` string")
        return inline, _CODE_FILENAME
    if kind == "file":
        if not isinstance(location, str) or not location.strip():
            raise _invalid("script: type file needs a `path` or `uri`")
        path = _resolve_script_path(location, ctx.base_dir)
        try:
            return path.read_text(encoding="utf-8"), str(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise ToolError(
                f"cannot read python script {str(path)!r}: {exc}",
                kind="python_error",
                code="ScriptNotReadable",
                data={"path": str(path)},
            ) from None
    raise ToolError(
        f"script source type {kind!r} is not supported (supported: file, inline)",
        kind="python_error",
        code="UnsupportedScriptSource",
    )


def _effective_timeout(config: Mapping[str, Any], ctx: ToolContext) -> float | None:
    values: list[float] = []
    for raw, label in ((config.get("timeout"), "timeout"), (ctx.timeout, "ctx.timeout")):
        if raw is None or raw == "":
            continue
        try:
            seconds = float(raw)
        except (TypeError, ValueError):
            raise _invalid(f"{label}: expected seconds, got {raw!r}") from None
        if seconds > 0:
            values.append(seconds)
    return min(values) if values else None


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
        capture = _Capture(self.output_limit)
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
        reply = self.pool().run(
            request, execution_id=ctx.execution_id, timeout=timeout, cancelled=ctx.cancelled
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


def _namespace(
    unit: _Unit,
    inputs: Any,
    libs: dict[str, Any],
    execution_id: int,
    render_context: Mapping[str, Any],
    capture: _Capture,
) -> dict[str, Any]:
    """Globals for one call. Later entries win: presets < libs < input keys."""
    ns: dict[str, Any] = {
        "__name__": _MODULE_NAME,
        "__builtins__": builtins,
        "json": json,
        "execution_id": execution_id,
    }
    if unit.filename != _CODE_FILENAME:
        ns["__file__"] = unit.filename
    if unit.uses_context:
        ns["context"] = _plain(render_context)
    if libs:
        ns.update(libs)
    if isinstance(inputs, dict):
        for key, value in inputs.items():
            if isinstance(key, str):
                ns[key] = value
        # An explicit `input_data` input is the payload itself: never wrapped again.
        ns["input_data"] = inputs["input_data"] if "input_data" in inputs else inputs
    else:
        ns["input_data"] = inputs
    # Last, so no input key can break output capture.
    ns["print"] = _make_print(capture)
    return ns


def _run_here(unit: _Unit, ns: dict[str, Any], inputs: Any, capture: _Capture) -> Any:
    """`_execute` on this thread, a user exception turned into a ToolError. Raised outside
    the handler so the ToolError does not chain the user exception, whose frames hold the
    whole namespace."""
    error: ToolError | None = None
    try:
        return _execute(unit, ns, inputs, capture)
    except (Exception, SystemExit) as exc:
        error = _user_error(exc, unit)
    raise error


def run_request(request: Mapping[str, Any], stdout: list[str]) -> Any:
    """Run one request of a python child process (`flowtide.tools.python_child`) and
    return its JSON result; printed lines go to `stdout`. Time limits are the parent's.

    Raises:
        ToolError: as `PythonTool.run` does for the code itself.
    """
    unit = _compiled(request["source"], request["filename"])
    raw_input = request.get("input")
    inputs = {} if raw_input is None else raw_input
    libs = _load_libs(request.get("libs"))
    capture = _Capture(int(request.get("limit") or DEFAULT_OUTPUT_LIMIT))
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
    capture = _Capture(DEFAULT_OUTPUT_LIMIT)
    ns = _namespace(unit, dict(inputs), {}, ctx.execution_id, ctx.render_context, capture)
    ns.update({k: v for k, v in (extra_globals or {}).items() if k not in inputs})
    _ensure_routing()
    try:
        return _run_here(unit, ns, merged, capture)
    finally:
        capture.drain_into(ctx.stdout)
