"""What a python step's code sees and what comes back out: the globals of one call
(`json`, `context`, `execution_id`, the `libs` aliases, the input keys, `input_data` and
its own `print`), the `libs` imports, detached plain copies of inputs and the render
context, the arguments `main` is called with (the input values its signature names), and
the conversion of the result to JSON.
"""

from __future__ import annotations

import builtins
import importlib
import inspect
import json
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

from flowtide.errors import ToolError
from flowtide.jsonvalues import MAX_DEPTH, to_json
from flowtide.tools.python_code import _CODE_FILENAME, _Unit
from flowtide.tools.python_output import _Capture, _make_print

_MODULE_NAME = "__flowtide__"
_MISSING = object()


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
        # A digit string, as templates see it (`flowtide.engine.context.execution_ids`).
        "execution_id": str(execution_id),
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


def _json_result(value: Any) -> Any:
    return to_json(value, root="result", kind="python_error")
