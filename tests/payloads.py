"""Event payloads checked against their types (`flowtide.engine.events.PAYLOADS`).

The TypedDicts are types only: nothing checks a payload when an event is made (that is
the hot path). The tests check the logs of real runs with `payload_problems` instead, so
a key an emitter writes and its type does not declare (or a required key it leaves out,
or a value of another type) fails a test: the types cannot drift from what is written.
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Mapping
from typing import Any, Union, get_args, get_origin, get_type_hints, is_typeddict

from flowtide.engine import events as ev

__all__ = ["check_payloads", "event_problems", "payload_problems"]


def _value_problems(value: Any, hint: Any, where: str) -> list[str]:
    if hint is Any:
        return []
    if is_typeddict(hint):
        return _dict_problems(value, hint, where)
    origin = get_origin(hint)
    if origin is Union or origin is types.UnionType:
        options = [_value_problems(value, option, where) for option in get_args(hint)]
        return [] if any(not found for found in options) else min(options, key=len)
    if hint is type(None):
        return [] if value is None else [f"{where}: {value!r} is not null"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: {type(value).__name__} is not a list"]
        (item,) = get_args(hint)
        return [p for i, v in enumerate(value) for p in _value_problems(v, item, f"{where}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__} is not a mapping"]
        key, item = get_args(hint)
        return [
            p
            for k, v in value.items()
            for p in _value_problems(k, key, f"{where} key")
            + _value_problems(v, item, f"{where}.{k}")
        ]
    if hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, hint)
    return [] if ok else [f"{where}: {value!r} is not {getattr(hint, '__name__', hint)}"]


def _dict_problems(value: Any, kind: Any, where: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{where}: {type(value).__name__} is not a mapping ({kind.__name__})"]
    hints = get_type_hints(kind)
    problems = [
        f"{where}: key {key!r} is not declared by {kind.__name__}"
        for key in value
        if key not in hints
    ]
    problems += [
        f"{where}: {kind.__name__}'s required key {key!r} is missing"
        for key in sorted(kind.__required_keys__)
        if key not in value
    ]
    for key, item in value.items():
        if key in hints:
            problems += _value_problems(item, hints[key], f"{where}.{key}")
    return problems


def payload_problems(type_: str, payload: Any) -> list[str]:
    """What is wrong with `payload` as the payload of an event of type `type_` (none: it
    is what the type's TypedDict says). No payload (null) stands for an empty one."""
    kind = ev.PAYLOADS.get(type_)
    if kind is None:
        return [f"{type_}: no payload type (engine.events.PAYLOADS)"]
    return _dict_problems({} if payload is None else payload, kind, type_)


def event_problems(events: Iterable[ev.Event | Mapping[str, Any]]) -> list[str]:
    """`payload_problems` of each event (an `Event` or its document)."""
    out: list[str] = []
    for event in events:
        if isinstance(event, ev.Event):
            type_, payload, event_id = event.type, event.payload, event.event_id
        else:
            type_, payload, event_id = event["type"], event.get("payload"), event["event_id"]
        out += [f"event {event_id}: {p}" for p in payload_problems(type_, payload)]
    return out


def check_payloads(events: Iterable[ev.Event | Mapping[str, Any]]) -> None:
    """Fail (AssertionError) when a payload among `events` is not what its type says."""
    problems = event_problems(events)
    assert not problems, "event payloads that their types do not describe:\n" + "\n".join(problems)
