"""Jinja2 rendering with NoETL semantics.

- Sandboxed environment, strict undefined: a missing name is an error, not "".
- A string that is exactly one `{{ expr }}` renders to the native value (int, list,
  dict), anything else renders to a string.
- Sizes and work are limited (`flowtide.playbook.sandbox`): a template cannot make a
  10 GB string or loop for hours, on the server least of all.
- Compiled templates are cached by source text: a 100,000-iteration loop renders the
  same few templates over and over.
- Contexts are passed as mappings (e.g. a ChainMap of iteration variables over the
  execution's context) and are never copied.
- `env` in a context is whatever the runtime passes (`visible_env`): templates never
  read the process environment themselves.
"""

from __future__ import annotations

import datetime
import fnmatch
import json
import re
import shlex
from collections import ChainMap
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jinja2 import StrictUndefined, TemplateSyntaxError, Undefined, UndefinedError, nodes
from jinja2.nodes import Template as TemplateNode

from flowtide.errors import TemplateError
from flowtide.playbook.sandbox import (
    TEMPLATE_LIMITS,
    LimitExceeded,
    SizedSandbox,
    TemplateEnv,
    measure,
    render_budget,
    tojson,
)

_SINGLE_EXPR = re.compile(r"^\s*\{\{(?P<expr>.*)\}\}\s*$", re.DOTALL)


class NotRun(StrictUndefined):
    """A step of the playbook that has not produced a result (yet).

    Falsy and `default`-able, so `{{ a.x if a else b.x }}` and `{{ a | default({}) }}`
    work, but any attribute access is an error naming the step.
    """

    __slots__ = ()

    def __bool__(self) -> bool:  # type: ignore[override]
        return False


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


def shlex_quote(value: Any) -> str:
    """`shlex_quote`: `value` as exactly one word of a command line (a `kind: shell`
    command, or any text a shell reads): `'...'` quoting as Python's `shlex.quote`. A
    string is quoted as it is, a list or mapping as its JSON text, None as the empty
    word `''`, anything else as its text."""
    if value is None:
        text = ""
    elif isinstance(value, str):
        text = value
    elif isinstance(value, dict | list | tuple):
        text = json.dumps(value, ensure_ascii=False, default=str)
    else:
        text = str(value)
    return shlex.quote(text)


def _make_env() -> SizedSandbox:
    env = SizedSandbox(undefined=StrictUndefined, autoescape=False, keep_trailing_newline=True)
    env.add_filter("tojson", tojson, guarded=False)
    env.add_filter("to_json", tojson, guarded=False)
    env.add_filter("from_json", json.loads)
    env.add_filter("shlex_quote", shlex_quote)
    env.globals["now"] = _now
    return env


ENV = _make_env()
_GLOBALS = dict(ENV.globals)

#: Variable that lists the environment variables templates may read (comma-separated
#: names or shell-style patterns such as `MY_APP_*`).
TEMPLATE_ENV_VAR = "FLOWTIDE_TEMPLATE_ENV"
#: Prefix of flowtide's own settings (tokens, master key, database DSNs): never visible.
_PRIVATE_PREFIX = "FLOWTIDE_"


def visible_env(environ: Mapping[str, str], *, embedded: bool) -> TemplateEnv:
    """The `env` mapping templates see, chosen from `environ` (the process environment).

    `FLOWTIDE_TEMPLATE_ENV` (in `environ`) lists the names to show, comma-separated,
    shell-style patterns allowed. Unset, an embedded run (`flowtide run`: the user's own
    machine) shows every variable, a server or worker none. Names starting with
    `FLOWTIDE_` are never shown, listed or not: flowtide's secrets live there.
    """
    spec = environ.get(TEMPLATE_ENV_VAR)
    patterns = [p.strip() for p in spec.split(",") if p.strip()] if spec is not None else None
    if patterns is None:
        chosen = dict(environ) if embedded else {}
        why = (
            "it is not set"
            if embedded
            else f"a server or worker shows templates only the variables listed in "
            f"{TEMPLATE_ENV_VAR}, and it is not set"
        )
    else:
        chosen = {
            name: value
            for name, value in environ.items()
            if any(fnmatch.fnmatchcase(name, p) for p in patterns)
        }
        why = f"it is not set, or not listed in {TEMPLATE_ENV_VAR} ({spec})"
    shown = {k: v for k, v in chosen.items() if not k.startswith(_PRIVATE_PREFIX)}
    private = f"variables named {_PRIVATE_PREFIX}* are never visible to templates"
    return _PrefixAwareEnv(shown, why, private)


class _PrefixAwareEnv(TemplateEnv):
    __slots__ = ("_private",)

    def __init__(self, values: Mapping[str, str], why: str, private: str) -> None:
        super().__init__(values, why)
        self._private = private

    def explain(self, name: str) -> str:
        if name.startswith(_PRIVATE_PREFIX):
            return f"'env' has no attribute '{name}': {self._private}"
        return super().explain(name)


@dataclass(frozen=True)
class SyntaxProblem:
    """A template that does not parse: what is wrong and on which line of the template."""

    message: str
    line: int
    text: str  # that line of the template

    def __str__(self) -> str:
        return f"{self.message} in {self.text!r}"


# Jinja2 names tokens for its own parser ("unexpected 'end of print statement'"); a user
# wrote the delimiters.
_TOKEN_WORDS = (
    ("end of print statement", "}}"),
    ("begin of print statement", "{{"),
    ("end of statement block", "%}"),
    ("begin of statement block", "{%"),
)


def _problem(exc: TemplateSyntaxError, source: str) -> SyntaxProblem:
    message = exc.message or "syntax error"
    for words, token in _TOKEN_WORDS:
        message = message.replace(f"'{words}'", f"'{token}'").replace(words, f"'{token}'")
    lines = source.splitlines() or [source]
    line = min(max(exc.lineno or 1, 1), len(lines))
    text = lines[line - 1].strip()
    if len(text) > 120:
        text = text[:117] + "..."
    return SyntaxProblem(message.rstrip("."), line, text)


@dataclass(frozen=True)
class _Compiled:
    template: Any
    native: bool  # a single `{{ expr }}`: the value itself, not its text
    lookup: bool  # ... and the expression only reads the context (`a.b`, `a['b']`)
    #: ... and it is a name and constant keys (`iter.x`, `a['b'].c`): read directly
    #: (`_read_path`), Jinja only when that cannot tell the value.
    path: tuple[str, tuple[tuple[bool, Any], ...]] | None = None


_cache: dict[str, _Compiled] = {}
_CACHE_LIMIT = 4096


def is_template(value: object) -> bool:
    """True if `value` is a string containing Jinja markup."""
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def _single_expression(source: str, tree: nodes.Template) -> nodes.Expr | None:
    match = _SINGLE_EXPR.match(source)
    if not match:
        return None
    expr = match.group("expr")
    if "{{" in expr or "}}" in expr or "{%" in expr:
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], nodes.Output):
        return None
    exprs = [n for n in tree.body[0].nodes if not isinstance(n, nodes.TemplateData)]
    return exprs[0] if len(exprs) == 1 else None


def _is_lookup(expr: nodes.Node) -> bool:
    while isinstance(expr, nodes.Getattr | nodes.Getitem):
        if isinstance(expr, nodes.Getitem) and not isinstance(expr.arg, nodes.Const):
            return False
        expr = expr.node
    return isinstance(expr, nodes.Name)


def _lookup_path(expr: nodes.Node) -> tuple[str, tuple[tuple[bool, Any], ...]] | None:
    """A lookup's name and its keys in order (`True` for `.attr`, `False` for `[const]`),
    or None when a key is not a plain string or integer (a slice, a float...)."""
    keys: list[tuple[bool, Any]] = []
    while isinstance(expr, nodes.Getattr | nodes.Getitem):
        if isinstance(expr, nodes.Getattr):
            keys.append((True, expr.attr))
        else:
            assert isinstance(expr.arg, nodes.Const)
            value = expr.arg.value
            if type(value) is not str and type(value) is not int:
                return None
            keys.append((False, value))
        expr = expr.node
    if not isinstance(expr, nodes.Name):
        return None
    return expr.name, tuple(reversed(keys))


_MISSING: Any = object()


def _read_path(path: tuple[str, tuple[tuple[bool, Any], ...]], context: Mapping[str, Any]) -> Any:
    """The value `{{ name.a['b'] }}` renders to, read as the sandbox reads it, or
    `_MISSING` when reading it takes more than a dict's lookups (a missing name or key,
    an attribute, an undefined value, a string over the size limit): then Jinja renders
    it, with its own errors.

    The same value as Jinja's, by the same rules: a name is the context's, then a global
    (`_Scope`; Jinja looks `in` and then reads); `.attr` of a mapping is its key
    (`SizedSandbox.getattr`); `[key]` is `obj[key]` when that does not raise (Jinja's
    `getitem`); a value that is an `Undefined` fails the render (`_run`), so it goes to
    Jinja. tests/unit/test_template_fast_path.py checks it against Jinja's rendering."""
    name, keys = path
    if type(context) is ChainMap:
        # ChainMap's own `in` and `[]`, without its generator and method calls: any map
        # holds the name, then the first map that gives it.
        for layer in context.maps:
            if name in layer:
                break
        else:
            return _MISSING
        for layer in context.maps:
            try:
                value = layer[name]
                break
            except KeyError:
                continue
        else:
            return _MISSING
    elif name not in context:
        return _MISSING
    else:
        try:
            value = context[name]
        except KeyError:
            return _MISSING
    for is_attr, key in keys:
        if is_attr and not isinstance(value, Mapping):
            return _MISSING
        try:
            value = value[key]
        except Exception:  # noqa: BLE001 - Jinja says what is wrong
            return _MISSING
    if isinstance(value, Undefined) or (
        isinstance(value, str) and len(value) > TEMPLATE_LIMITS.max_chars
    ):
        return _MISSING
    return value


def _compile(source: str) -> _Compiled:
    """Parse, instrument and compile `source` (cached).

    Raises:
        TemplateSyntaxError: the template does not parse, or names an unknown filter.
    """
    compiled = _cache.get(source)
    if compiled is not None:
        return compiled
    try:
        tree = ENV.parse(source)
    except RecursionError:
        # Jinja's parser recurses about a dozen frames per bracket: `{{ ((((...)))) }}`
        # a hundred deep broke the loader (and a server's request) with a RecursionError.
        raise TemplateSyntaxError("the expression nests too deeply", 1) from None
    expr = _single_expression(source, tree)
    if expr is not None:
        # `{% set __value__ = expr %}`, built from the user's own parse tree: errors and
        # line numbers refer to what they wrote.
        target = nodes.Name("__value__", "store", lineno=expr.lineno)
        tree = nodes.Template([nodes.Assign(target, expr, lineno=expr.lineno)], lineno=1)
    try:
        template = ENV.from_string(ENV.instrument(tree))
    except (RecursionError, SyntaxError):  # Python's compiler has its own nesting limits
        raise TemplateSyntaxError("the expression nests too deeply", 1) from None
    lookup = expr is not None and _is_lookup(expr)
    path = _lookup_path(expr) if expr is not None and lookup else None
    compiled = _Compiled(template, expr is not None, lookup, path)
    if len(_cache) > _CACHE_LIMIT:
        _cache.clear()
    _cache[source] = compiled
    return compiled


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


#: Jinja names a value of a class of ours by its module path
#: ('flowtide.engine.context.ResultDict object' has no attribute 'x'): say what it is.
_OUR_TYPE = re.compile(r"'flowtide(?:\.\w+)+\.(\w+) object'")
_SHOWN_AS = {"ResultDict": "dict", "ResultList": "list"}


def _undefined_message(exc: UndefinedError) -> str:
    """Jinja's message for a missing name or attribute, without flowtide's class paths."""
    return _OUR_TYPE.sub(lambda m: f"'{_SHOWN_AS.get(m[1], m[1])} object'", str(exc))


def _run(compiled: _Compiled, context: Mapping[str, Any]) -> Any:
    template = compiled.template
    ctx = template.new_context(_Scope(context), shared=True)
    limits = TEMPLATE_LIMITS
    if compiled.native:
        for _ in template.root_render_func(ctx):
            pass
        value = ctx.vars["__value__"]
        if isinstance(value, StrictUndefined):
            # Touching it raises with Jinja's own message naming what is missing.
            str(value)
        if isinstance(value, str):
            size = len(value)
        elif compiled.lookup:
            size = 0
        else:
            size = measure(value, limits.max_chars, limits)
        if size > limits.max_chars:
            # A value read as-is from the context is data that already exists; one the
            # template built (`[big] * 1000`) is checked before it is stored or sent.
            raise LimitExceeded(
                f"the result would take more than {limits.max_chars:,} characters to write out"
            )
        return value
    # Every `{{ }}` and every repeated piece of literal text has been counted against the
    # budget's `max_written` as it was made, so the join below is bounded; the rendered
    # text has its own, smaller limit.
    text = "".join(template.root_render_func(ctx))
    if len(text) > limits.max_chars:
        raise LimitExceeded(
            f"the rendered text is {len(text):,} characters, "
            f"longer than the limit of {limits.max_chars:,}"
        )
    return text


def render_string(
    source: str, context: Mapping[str, Any], *, step: str | None = None, field: str | None = None
) -> Any:
    """Render one template string; native value when it is a single `{{ expr }}`.

    Raises:
        TemplateError: syntax error, a missing name (named in `.missing`), or a size or
            work limit of `flowtide.playbook.sandbox.TEMPLATE_LIMITS`.
    """
    if "{{" not in source and "{%" not in source:
        return source
    try:
        compiled = _compile(source)
        if compiled.path is not None:
            value = _read_path(compiled.path, context)
            if value is not _MISSING:
                return value
        with render_budget():
            return _run(compiled, context)
    except UndefinedError as exc:
        raise TemplateError(
            _undefined_message(exc),
            expression=source,
            step=step,
            field=field,
            missing=_missing_name(exc),
        ) from exc
    except TemplateSyntaxError as exc:
        problem = _problem(exc, source)
        where = f" (line {problem.line} of the template)" if "\n" in source.strip() else ""
        raise TemplateError(
            f"syntax error: {problem.message}{where}", expression=source, step=step, field=field
        ) from exc
    except LimitExceeded as exc:
        raise TemplateError(exc.message, expression=source, step=step, field=field) from None
    except TemplateError:
        raise
    except Exception as exc:  # noqa: BLE001 - any error inside an expression fails the render
        raise TemplateError(
            f"{type(exc).__name__}: {exc}", expression=source, step=step, field=field
        ) from exc


def render(
    value: Any, context: Mapping[str, Any], *, step: str | None = None, field: str | None = None
) -> Any:
    """Render every template string inside `value` (dicts and lists recursively); the
    strings share one work budget."""
    if isinstance(value, str):
        if "{{" not in value and "{%" not in value:
            return value
        return render_string(value, context, step=step, field=field)
    if isinstance(value, dict | list):
        with render_budget():
            return _render_nested(value, context, step, field)
    return value


def _render_nested(
    value: Any, context: Mapping[str, Any], step: str | None, field: str | None
) -> Any:
    if isinstance(value, str):
        return render(value, context, step=step, field=field)
    if isinstance(value, dict):
        return {
            k: _render_nested(v, context, step, f"{field}.{k}" if field else str(k))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_render_nested(v, context, step, field) for v in value]
    return value


def check_syntax(source: str) -> SyntaxProblem | None:
    """What is wrong with template `source`, or None when it compiles (which also warms
    the cache `render` uses)."""
    try:
        _compile(source)
    except TemplateSyntaxError as exc:
        return _problem(exc, source)
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
    "TEMPLATE_ENV_VAR",
    "NotRun",
    "SyntaxProblem",
    "TemplateEnv",
    "TemplateNode",
    "check_syntax",
    "render_budget",
    "visible_env",
    "is_template",
    "render",
    "render_string",
    "truthy",
]
