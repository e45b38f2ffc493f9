"""Static check of a python step's inline code: does it compile?

Only parsed and compiled, never run. The python tool accepts a `return` at the top level
of the code (it runs such code as the body of a function), so such code is compiled the
same way here; anything else is compiled as a module, as the tool does.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass


@dataclass(frozen=True)
class PythonProblem:
    """Why the code does not compile, and where (1-based line and column in the code)."""

    message: str
    line: int
    column: int | None
    text: str | None  # the offending line of code


def _module_level_return(statements: list[ast.stmt]) -> bool:
    for statement in statements:
        if isinstance(statement, ast.Return):
            return True
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(statement, field, None)
            if isinstance(inner, list) and _module_level_return(inner):
                return True
        for handler in getattr(statement, "handlers", []) or []:
            if _module_level_return(handler.body):
                return True
        for case in getattr(statement, "cases", []) or []:
            if _module_level_return(case.body):
                return True
    return False


def _as_function(tree: ast.Module) -> ast.Module:
    """The module's code as the body of a function (future and star imports stay at the
    top, where the tool puts them)."""
    hoisted = [
        s
        for s in tree.body
        if isinstance(s, ast.ImportFrom)
        and (s.module == "__future__" or any(a.name == "*" for a in s.names))
    ]
    body = [s for s in tree.body if not any(s is h for h in hoisted)]
    func = ast.parse("def _flowtide_body():\n    pass\n").body[0]
    assert isinstance(func, ast.FunctionDef)
    func.body = body or func.body
    module = ast.Module(body=[*hoisted, func], type_ignores=[])
    return ast.fix_missing_locations(module)


def python_problem(code: str, filename: str = "<code>") -> PythonProblem | None:
    """Why `code` would not compile in a python step, or None when it does."""
    try:
        tree = ast.parse(code, filename, "exec")
        compile(
            _as_function(tree) if _module_level_return(tree.body) else tree,
            filename,
            "exec",
            dont_inherit=True,
        )
    except SyntaxError as exc:
        text = (exc.text or "").strip() or None
        return PythonProblem(exc.msg, exc.lineno or 1, exc.offset, text)
    except (ValueError, RecursionError, MemoryError) as exc:
        # Null bytes in the source, or nesting too deep for the compiler.
        return PythonProblem(f"{type(exc).__name__}: {exc}", 1, None, None)
    return None
