"""Reading the tree: a section from the environment (or a given mapping), once per
process (`current`), with errors that name the variable.

A process reads its settings when it starts (the CLI's commands, the server's app
factory, a runner's first step), never when a module is imported. `current` keeps what
it read; `reset` forgets it (tests that change the environment).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings

from flowtide.errors import SettingsError

__all__ = ["current", "env_name", "env_names", "read", "reset", "to_env"]

S = TypeVar("S", bound=BaseSettings)

_cache: dict[type[BaseSettings], BaseSettings] = {}
_lock = threading.Lock()


def env_name(section: type[BaseSettings], field: str) -> str:
    """The variable `section.field` is read from: the section's prefix and the field's
    name in capitals, unless the field names an older variable (`env=`)."""
    info = section.model_fields[field]
    alias = info.validation_alias
    if isinstance(alias, str):
        return alias
    return f"{section.model_config.get('env_prefix', '')}{field}".upper()


def env_names(section: type[BaseSettings]) -> dict[str, str]:
    """Each field of `section` by the variable it is read from."""
    return {env_name(section, field): field for field in section.model_fields}


#: Pydantic's words for a bad value, as a variable's reader says them.
_REASONS = {
    "int_parsing": "expected a number (a whole one)",
    "int_from_float": "expected a number (a whole one)",
    "float_parsing": "expected a number",
    "bool_parsing": "expected 1 or 0",
}


def _error(
    section: type[BaseSettings], exc: ValidationError, given: Mapping[str, Any]
) -> SettingsError:
    """The first problem of `exc`, named by its variable and the value it held."""
    first = exc.errors(include_url=False)[0]
    loc = first.get("loc") or ("?",)
    key = str(loc[0])
    names = {field: env for env, field in env_names(section).items()}
    env = names.get(key) or key.upper()
    value = first.get("input")
    shown = value if isinstance(value, str) else given.get(env, value)
    reason = _REASONS.get(str(first.get("type")))
    choices = re.fullmatch(r"\^\(([\w|]+)\)\$", str((first.get("ctx") or {}).get("pattern", "")))
    if first.get("type") == "string_pattern_mismatch" and choices:
        reason = "must be " + " or ".join(choices.group(1).split("|"))
    if reason is None:
        reason = str(first.get("msg", "invalid")).removeprefix("Value error, ")
        reason = reason.replace("Input should be", "must be")
    return SettingsError(f"{env}={shown!r}: {reason}", env=env, value=str(shown))


def read(section: type[S], environ: Mapping[str, str] | None = None, **given: Any) -> S:
    """`section` as the environment (or `environ`) sets it, `given` values (flags on a
    command line) winning over both.

    Raises:
        SettingsError: a value the declaration refuses, naming its variable.
    """
    try:
        if environ is None:
            return section(**given)
        values: dict[str, Any] = {}
        for env, field in env_names(section).items():
            raw = environ.get(env)
            if raw is not None and raw.strip() != "":
                values[field] = raw
        values.update(given)
        return section.model_validate(values)
    except ValidationError as exc:
        raise _error(section, exc, environ if environ is not None else _environ()) from None


def _environ() -> Mapping[str, str]:
    import os

    return os.environ


def current(section: type[S]) -> S:
    """`section` as this process read it the first time it asked (see `reset`)."""
    found = _cache.get(section)
    if found is None:
        with _lock:
            found = _cache.get(section)
            if found is None:
                found = _cache[section] = read(section)
    return found  # type: ignore[return-value]


def reset() -> None:
    """Forget what `current` read: the next call reads the environment again."""
    with _lock:
        _cache.clear()


def to_env(values: BaseSettings, *, only: set[str] | None = None) -> dict[str, str]:
    """The variables that hand `values` to a child process (`read` there gives them
    back): None as empty (unset), a flag as `1` or empty."""
    section = type(values)
    out: dict[str, str] = {}
    for env, field in env_names(section).items():
        if only is not None and field not in only:
            continue
        value = getattr(values, field)
        if value is None or value is False:
            out[env] = ""
        elif value is True:
            out[env] = "1"
        else:
            out[env] = str(value)
    return out
