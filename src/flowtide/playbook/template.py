"""Jinja2 rendering with NoETL semantics.

- Sandboxed environment, strict undefined: a missing name is an error, not "".
- A string that is exactly one `{{ expr }}` renders to the native value (int, list,
  dict), anything else renders to a string.
- Compiled templates are cached by source text: a 100,000-iteration loop renders the
  same few templates over and over.
- Contexts are passed as mappings (e.g. a ChainMap of iteration variables over the
  execution's context) and are never copied.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Mapping
from typing import Any

from jinja2 import StrictUndefined, TemplateSyntaxError, UndefinedError
from jinja2.nodes import Template as TemplateNode
from jinja2.sandbox import ImmutableSandboxedEnvironment

from flowtide.errors import TemplateError

_SINGLE_EXPR = re.compile(r"^\s*\{\{(?P<expr>.*)\}\}\s*$", re.DOTALL)


class NotRun(StrictUndefined):
    """A step of the playbook that has not produced a result (yet).

    Falsy and `default`-able, so `{{ a.x if a else b.x }}` and `{{ a | default({}) }}`
    work, but any attribute access is an error naming the step.
    """

    __slots__ = ()

    def __bool__(self) -> bool:  # type: ignore[override]
        return False


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, indent=indent, default=str, ensure_ascii=False)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


class _Environment(ImmutableSandboxedEnvironment):
    """Sandboxed, and templates cannot mutate the values they render against.

    `a.b` on a mapping prefers the key `b` over an attribute of the same name, so
    `{{ start.items }}` is the step's `items` field, not `dict.items`.
    """

    def getattr(self, obj: Any, attribute: str) -> Any:
        if isinstance(obj, Mapping):
            try:
                return obj[attribute]
            except (KeyError, TypeError):
                pass
        return super().getattr(obj, attribute)


def _make_env() -> _Environment:
    env = _Environment(undefined=StrictUndefined, autoescape=False, keep_trailing_newline=True)
    env.filters["tojson"] = _tojson
    env.filters["to_json"] = _tojson
    env.filters["from_json"] = json.loads
    env.globals["now"] = _now
    return env


ENV = _make_env()
_GLOBALS = dict(ENV.globals)

_expr_cache: dict[str, Any] = {}
_text_cache: dict[str, Any] = {}
_CACHE_LIMIT = 4096


def is_template(value: object) -> bool:
    """True if `value` is a string containing Jinja markup."""
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def _single_expression(source: str) -> str | None:
    match = _SINGLE_EXPR.match(source)
    if not match:
        return None
    expr = match.group("expr")
    if "{{" in expr or "}}" in expr or "{%" in expr:
        return None
    return expr


def _compile_expr(expr: str) -> Any:
    tmpl = _expr_cache.get(expr)
    if tmpl is None:
        if len(_expr_cache) > _CACHE_LIMIT:
            _expr_cache.clear()
        tmpl = ENV.from_string("{% set __value__ = (" + expr + ") %}")
        _expr_cache[expr] = tmpl
    return tmpl


def _compile_text(source: str) -> Any:
    tmpl = _text_cache.get(source)
    if tmpl is None:
        if len(_text_cache) > _CACHE_LIMIT:
            _text_cache.clear()
        tmpl = ENV.from_string(source)
        _text_cache[source] = tmpl
    return tmpl


class _Scope(Mapping[str, Any]):
    """Context mapping for Jinja: the caller's mapping, then the environment globals."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        try:
            return self._data[key]
        except KeyError:
            return _GLOBALS[key]

    def __contains__(self, key: object) -> bool:
        return key in self._data or key in _GLOBALS

    def __iter__(self) -> Any:
        yield from self._data
        yield from (k for k in _GLOBALS if k not in self._data)

    def __len__(self) -> int:
        return len(set(self._data) | set(_GLOBALS))


def _missing_name(exc: UndefinedError) -> str | None:
    match = re.search(r"step '([^']+)' has not run", str(exc)) or re.search(
        r"'([^']+)' is undefined", str(exc)
    )
    if match:
        return match.group(1)
    match = re.search(r"has no attribute '([^']+)'", str(exc))
    return match.group(1) if match else None


def render_string(
    source: str, context: Mapping[str, Any], *, step: str | None = None, field: str | None = None
) -> Any:
    """Render one template string; native value when it is a single `{{ expr }}`.

    Raises:
        TemplateError: syntax error or a missing name (named in `.missing`).
    """
    if "{{" not in source and "{%" not in source:
        return source
    expr = _single_expression(source)
    try:
        if expr is not None:
            tmpl = _compile_expr(expr)
            ctx = tmpl.new_context(_Scope(context), shared=True)
            for _ in tmpl.root_render_func(ctx):
                pass
            value = ctx.vars["__value__"]
            if isinstance(value, StrictUndefined):
                # Touching it raises with Jinja's own message naming what is missing.
                str(value)
            return value
        tmpl = _compile_text(source)
        ctx = tmpl.new_context(_Scope(context), shared=True)
        return ENV.concat(tmpl.root_render_func(ctx))
    except UndefinedError as exc:
        raise TemplateError(
            str(exc), expression=source, step=step, field=field, missing=_missing_name(exc)
        ) from exc
    except TemplateSyntaxError as exc:
        raise TemplateError(
            f"syntax error: {exc.message}", expression=source, step=step, field=field
        ) from exc
    except TemplateError:
        raise
    except Exception as exc:  # noqa: BLE001 - any error inside an expression fails the render
        raise TemplateError(
            f"{type(exc).__name__}: {exc}", expression=source, step=step, field=field
        ) from exc


def render(
    value: Any, context: Mapping[str, Any], *, step: str | None = None, field: str | None = None
) -> Any:
    """Render every template string inside `value` (dicts and lists recursively)."""
    if isinstance(value, str):
        if "{{" not in value and "{%" not in value:
            return value
        return render_string(value, context, step=step, field=field)
    if isinstance(value, dict):
        return {
            k: render(v, context, step=step, field=f"{field}.{k}" if field else str(k))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [render(v, context, step=step, field=field) for v in value]
    return value


def check_syntax(source: str) -> str | None:
    """Return a syntax error message for template `source`, or None when it parses."""
    expr = _single_expression(source)
    try:
        if expr is not None:
            ENV.parse("{% set __value__ = (" + expr + ") %}")
        else:
            ENV.parse(source)
    except TemplateSyntaxError as exc:
        return exc.message or "syntax error"
    return None


def truthy(value: Any) -> bool:
    """NoETL truthiness for `when`: YAML bools, rendered bools, and the strings true/false."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("", "false", "0", "none", "null", "no", "off"):
            return False
        return True
    return bool(value)


__all__ = [
    "ENV",
    "NotRun",
    "TemplateNode",
    "check_syntax",
    "is_template",
    "render",
    "render_string",
    "truthy",
]
