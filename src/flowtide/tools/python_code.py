"""Compiling a python step's code: each distinct source text is parsed and compiled once
(an LRU cache keyed by source and file name) into a `_Unit`. Code that uses `return` at
module level is compiled as the body of a function whose assigned names are seeded from
the namespace, so it behaves as it would at module level. This module also owns the
errors user code produces: a `SyntaxError` (or a NUL byte) before it runs and an exception
raised while it runs, both as a `ToolError` pointing at the user's line.
"""

from __future__ import annotations

import ast
import functools
import types
from collections.abc import Iterable
from typing import Any

from flowtide.errors import ToolError

_CODE_FILENAME = "<code>"
_COMPILE_CACHE_SIZE = 512
_BODY_NAME = "__flowtide_body__"
_SEED_ARG = "__flowtide_seed__"
_END_ARG = "__flowtide_end__"
_MAX_MESSAGE = 2000
_MAX_TRACE_FRAMES = 12


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
    shown = [{"line": n, "function": f, "source": unit.line(n)} for n, f in frames]
    return ToolError(
        message,
        kind="python_error",
        code=name,
        data={
            "exception": name,
            "line": line,
            "traceback": "\n".join(trace),
            # The user's frames (innermost last), for the runtime to map to the playbook.
            "frames": shown,
            "filename": unit.filename,
        },
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
