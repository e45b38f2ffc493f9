"""A schedule as written (CLI flags, an API body, a `kind: Schedule` document) and as
stored. Pure: validation only, every error a `TriggerError` naming the schedule, the
field and, for a document, where it was written (`file:line:column`).
"""

from __future__ import annotations

import datetime
import difflib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from flowtide.errors import TriggerError
from flowtide.triggers.when import Cron, When, cron, every, from_json, parse_duration, to_json

__all__ = [
    "OVERLAP_POLICIES",
    "ScheduleSpec",
    "parse_time",
    "schedule_from_document",
    "spec_from_json",
    "spec_to_json",
    "validate_name",
]

OVERLAP_POLICIES: Final = ("skip", "buffer_one", "buffer_all", "cancel_other", "allow")
_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_SPEC_FIELDS: Final = (
    "playbook",
    "cron",
    "every",
    "offset",
    "timezone",
    "workload",
    "overlap",
    "catchup",
    "jitter",
    "paused",
    "start",
    "end",
    "notify",
    "version",
)
_TOP_FIELDS: Final = ("apiVersion", "kind", "metadata", "spec")
_API_VERSIONS: Final = ("noetl.io/v2", "noetl.io/v1", "flowtide.io/v1")
#: Largest workload a schedule keeps (its JSON text is stored with the definition).
MAX_WORKLOAD_KEYS: Final = 1000


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A checked schedule (see the README's "Schedules")."""

    name: str
    #: A catalog path, or (on a local store) an absolute file path.
    playbook: str
    when: When
    version: int | None = None
    workload: dict[str, Any] = field(default_factory=dict)
    overlap: str = "skip"
    #: Seconds: after a downtime, missed slots this recent fire; 0: none.
    catchup: float = 3600.0
    jitter: float = 0.0
    paused: bool = False
    start: float | None = None
    end: float | None = None
    notify: list[dict[str, Any]] = field(default_factory=list)
    description: str = ""


class _Positions(Protocol):
    def get(self, path: Any) -> tuple[int | None, int | None]: ...


def validate_name(name: object) -> str:
    """A schedule's name: 1-128 of letters, digits, `.`, `_`, `-`, not starting with a
    sign. Raises TriggerError."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise TriggerError(
            f"{name!r} is not a valid name: 1-128 letters, digits, '.', '_' or '-',"
            " starting with a letter or digit",
            field="name",
        )
    return name


def parse_time(value: object, field: str) -> float:
    """Unix seconds of an ISO 8601 time with a zone (`2026-01-01T00:00:00Z`,
    `...+01:00`) or a number. Raises TriggerError: a naive time is refused (which zone
    would it be in?)."""
    if isinstance(value, bool):
        raise TriggerError(f"{value!r} is not a time", field=field)
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise TriggerError(f"{value!r} is not a time", field=field)
        return float(value)
    if isinstance(value, datetime.datetime):
        parsed = value
    elif isinstance(value, str):
        try:
            parsed = datetime.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise TriggerError(
                f"{value!r} is not an ISO 8601 time (like 2026-01-01T00:00:00Z)", field=field
            ) from None
    else:
        raise TriggerError(f"{value!r} is not a time", field=field)
    if parsed.tzinfo is None:
        raise TriggerError(f"{value!r} has no zone: add one (Z for UTC, or +01:00)", field=field)
    return parsed.timestamp()


def _seconds(value: object, field_name: str, *, zero: bool) -> float:
    if zero and value in (0, "0", 0.0):
        return 0.0
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise TriggerError(f"{value!r} is not a duration", field=field_name)
    return parse_duration(value, field=field_name)


class _Reader:
    """Reads one document's fields, errors located at their position."""

    def __init__(self, name: str | None, source: str | None, positions: _Positions | None):
        self.name = name
        self.source = source
        self.positions = positions

    def where(self, path: tuple[Any, ...]) -> str | None:
        if self.source is None:
            return None
        if self.positions is None:
            return self.source
        line, column = self.positions.get(path)
        if line is None:
            return self.source
        return f"{self.source}:{line}:{column}"

    def fail(self, path: tuple[Any, ...], message: str, field_name: str) -> TriggerError:
        return TriggerError(message, name=self.name, field=field_name, location=self.where(path))

    def unknown(
        self, keys: Mapping[str, Any], allowed: tuple[str, ...], path: tuple[Any, ...]
    ) -> None:
        for key in keys:
            if key not in allowed:
                close = difflib.get_close_matches(str(key), allowed, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise self.fail(
                    (*path, key),
                    f"unknown field {key!r}{hint}; a schedule has {', '.join(allowed)}",
                    str(key),
                )


def schedule_from_document(
    doc: Any, *, source: str | None = None, positions: _Positions | None = None
) -> ScheduleSpec:
    """The schedule a `kind: Schedule` document defines (see the README). `source` names
    the file and `positions` locate its fields (`flowtide.playbook.source.load_yaml`).

    Raises:
        TriggerError: naming the schedule, the field and where it was written.
    """
    top = _Reader(None, source, positions)
    if not isinstance(doc, Mapping):
        raise top.fail((), "a schedule must be a YAML mapping (kind: Schedule)", "kind")
    top.unknown(doc, _TOP_FIELDS, ())
    if doc.get("kind") != "Schedule":
        raise top.fail(("kind",), f"kind must be Schedule, not {doc.get('kind')!r}", "kind")
    version = doc.get("apiVersion")
    if version is not None and version not in _API_VERSIONS:
        raise top.fail(
            ("apiVersion",),
            f"apiVersion {version!r} is not one of {', '.join(_API_VERSIONS)}",
            "apiVersion",
        )
    meta = doc.get("metadata")
    if not isinstance(meta, Mapping) or "name" not in meta:
        raise top.fail(("metadata",), "metadata.name names the schedule", "metadata.name")
    top.unknown(meta, ("name", "description", "labels"), ("metadata",))
    try:
        name = validate_name(meta["name"])
    except TriggerError as exc:
        raise top.fail(("metadata", "name"), exc.message, "metadata.name") from None
    description = meta.get("description") or ""
    if not isinstance(description, str) or len(description) > 1000:
        raise top.fail(("metadata", "description"), "a line of text (at most 1,000)", "description")
    spec = doc.get("spec")
    r = _Reader(name, source, positions)
    if not isinstance(spec, Mapping):
        raise r.fail(("spec",), "spec must be a mapping (playbook, cron or every, ...)", "spec")
    r.unknown(spec, _SPEC_FIELDS, ("spec",))
    return _read_spec(r, name, description, spec)


def _read_spec(r: _Reader, name: str, description: str, spec: Mapping[str, Any]) -> ScheduleSpec:
    at = ("spec",)
    playbook = spec.get("playbook")
    version = spec.get("version")
    if isinstance(playbook, Mapping):
        r.unknown(playbook, ("path", "version"), (*at, "playbook"))
        version = playbook.get("version", version)
        playbook = playbook.get("path")
    if not isinstance(playbook, str) or not playbook.strip() or len(playbook) > 4096:
        raise r.fail((*at, "playbook"), "name the playbook: a catalog path", "playbook")
    if version is not None and (
        isinstance(version, bool) or not isinstance(version, int) or version < 1
    ):
        raise r.fail((*at, "version"), f"version must be a number >= 1, not {version!r}", "version")
    when = _read_when(r, spec)
    workload = spec.get("workload") or {}
    if not isinstance(workload, Mapping):
        raise r.fail((*at, "workload"), "workload must be a mapping", "workload")
    if len(workload) > MAX_WORKLOAD_KEYS:
        raise r.fail((*at, "workload"), f"more than {MAX_WORKLOAD_KEYS} keys", "workload")
    overlap = spec.get("overlap", "skip")
    if overlap not in OVERLAP_POLICIES:
        raise r.fail(
            (*at, "overlap"),
            f"overlap {overlap!r} is not one of {', '.join(OVERLAP_POLICIES)}",
            "overlap",
        )
    notify = spec.get("notify") or []
    if not isinstance(notify, list) or not all(isinstance(n, Mapping) for n in notify):
        raise r.fail((*at, "notify"), "notify must be a list of targets", "notify")
    paused = spec.get("paused", False)
    if not isinstance(paused, bool):
        raise r.fail((*at, "paused"), f"paused must be true or false, not {paused!r}", "paused")
    values: dict[str, Any] = {}
    for key, zero in (("catchup", True), ("jitter", True)):
        if spec.get(key) is not None:
            try:
                values[key] = _seconds(spec[key], key, zero=zero)
            except TriggerError as exc:
                raise r.fail((*at, key), exc.message, key) from None
    for key in ("start", "end"):
        if spec.get(key) is not None:
            try:
                values[key] = parse_time(spec[key], key)
            except TriggerError as exc:
                raise r.fail((*at, key), exc.message, key) from None
    if values.get("start") is not None and values.get("end") is not None:
        if values["end"] < values["start"]:
            raise r.fail((*at, "end"), "end is before start", "end")
    return ScheduleSpec(
        name=name,
        playbook=playbook.strip(),
        when=when,
        version=version,
        workload=dict(workload),
        overlap=str(overlap),
        paused=paused,
        notify=[dict(n) for n in notify],
        description=description,
        **values,
    )


def _read_when(r: _Reader, spec: Mapping[str, Any]) -> When:
    at = ("spec",)
    has_cron, has_every = spec.get("cron") is not None, spec.get("every") is not None
    if has_cron == has_every:
        raise r.fail(
            at,
            "give exactly one of cron (an expression) or every (an interval)",
            "cron" if not has_cron else "every",
        )
    try:
        if has_cron:
            if spec.get("offset") is not None:
                raise TriggerError("offset goes with every, not cron", field="offset")
            return cron(str(spec["cron"]), str(spec.get("timezone") or "UTC"))
        if spec.get("timezone") not in (None, "UTC"):
            raise TriggerError(
                "timezone goes with cron: every's slots are counted in UTC", field="timezone"
            )
        return every(spec["every"], spec.get("offset") or 0)
    except TriggerError as exc:
        key = exc.field or ("cron" if has_cron else "every")
        raise r.fail((*at, key), exc.message, key) from None


def spec_to_json(spec: ScheduleSpec) -> dict[str, Any]:
    """The stored form (JSON values only)."""
    return {
        "name": spec.name,
        "playbook": spec.playbook,
        "version": spec.version,
        "when": to_json(spec.when),
        "workload": spec.workload,
        "overlap": spec.overlap,
        "catchup": spec.catchup,
        "jitter": spec.jitter,
        "paused": spec.paused,
        "start": spec.start,
        "end": spec.end,
        "notify": spec.notify,
        "description": spec.description,
    }


def spec_from_json(doc: Mapping[str, Any]) -> ScheduleSpec:
    """`spec_to_json`'s inverse. Raises TriggerError on a stored form it cannot read."""
    try:
        return ScheduleSpec(
            name=str(doc["name"]),
            playbook=str(doc["playbook"]),
            version=doc.get("version"),
            when=from_json(dict(doc["when"])),
            workload=dict(doc.get("workload") or {}),
            overlap=str(doc.get("overlap") or "skip"),
            catchup=float(doc.get("catchup", 3600.0)),
            jitter=float(doc.get("jitter") or 0.0),
            paused=bool(doc.get("paused", False)),
            start=doc.get("start"),
            end=doc.get("end"),
            notify=list(doc.get("notify") or []),
            description=str(doc.get("description") or ""),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise TriggerError(f"a stored schedule cannot be read: {exc}") from None


def zone_of(spec: ScheduleSpec) -> str:
    """The zone a schedule's times are shown in: its cron zone, else UTC."""
    return spec.when.timezone if isinstance(spec.when, Cron) else "UTC"
