"""A schedule as written (CLI flags or a `kind: Schedule` document) and as stored.

    apiVersion: noetl.io/v2          # or flowtide.io/v1; optional
    kind: Schedule
    metadata: {name: nightly-report, description: "..."}
    spec:
      playbook: reports/nightly      # or {path: reports/nightly, version: 3}
      cron: "0 2 * * *"              # or every: 15m (+ offset: 30s); exactly one
      timezone: Europe/Berlin        # cron only; default UTC
      workload: {day: "{{ schedule.time }}"}
      overlap: skip                  # skip|buffer_one|buffer_all|cancel_other|allow
      catchup: 1h                    # 0: never catch up
      jitter: 30s
      paused: false
      start: "2026-01-01T00:00:00Z"  # ISO 8601 with a zone, or Unix seconds
      end: ...
      notify: [...]                  # kept as given (validated by notifications)

Every error is a `TriggerError` with the schedule's name, the field and, when the
caller passes the document's positions, `file:line:column`. Unknown keys are errors.
"""

from __future__ import annotations

import copy
import datetime as dt
import difflib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from flowtide.errors import TriggerError
from flowtide.triggers.when import LATEST, Cron, Every, When, cron, every, parse_duration
from flowtide.triggers.when import from_json as when_from_json
from flowtide.triggers.when import to_json as when_to_json

OVERLAP_POLICIES = ("skip", "buffer_one", "buffer_all", "cancel_other", "allow")

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_API_VERSIONS = ("noetl.io/", "flowtide.io/")

#: Largest workload or notify list of a schedule, as JSON text.
MAX_SPEC_JSON = 256 * 1024
#: Deepest nesting of a trigger's workload, notify list or config (a person writes
#: them; deeper ones broke the copies and answers made of them with a RecursionError).
MAX_NESTING = 64
#: Largest catalog version (the store's integer).
MAX_VERSION = 2**31 - 1
MAX_PLAYBOOK_REF = 1024
MAX_DESCRIPTION = 4096


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A schedule: run `playbook` (a catalog path or file, `version` None = the latest at
    fire time) with `workload` at the instants of `when`. Validated on construction.

    `catchup` (seconds): how late a missed slot may still fire after downtime (0: only
    on time, within `plan.CATCHUP_GRACE`). `jitter`: each slot starts up to this much
    later (the same delay on every server). `start`/`end`: no slot before/after these
    Unix seconds.
    """

    name: str
    playbook: str
    version: int | None = None
    when: When = field(default=None)  # type: ignore[assignment]
    workload: dict[str, Any] = field(default_factory=dict)
    overlap: str = "skip"
    catchup: float = 3600.0
    jitter: float = 0.0
    paused: bool = False
    start: float | None = None
    end: float | None = None
    notify: list[dict[str, Any]] = field(default_factory=list)
    description: str = ""

    def __post_init__(self) -> None:
        validate_name(self.name)

        def bad(message: str, at: str) -> TriggerError:
            return TriggerError(message, name=self.name, field=at)

        if not isinstance(self.playbook, str) or not self.playbook.strip():
            raise bad("a schedule needs a playbook (a catalog path or a file)", "playbook")
        if len(self.playbook) > MAX_PLAYBOOK_REF or "\x00" in self.playbook:
            raise bad("not a playbook path", "playbook")
        if self.version is not None and (
            isinstance(self.version, bool)
            or not isinstance(self.version, int)
            or not 1 <= self.version <= MAX_VERSION
        ):
            raise bad(f"version must be a positive integer, got {self.version!r}", "version")
        if not isinstance(self.when, Cron | Every):
            raise bad("a schedule needs exactly one of 'cron' and 'every'", "when")
        if self.overlap not in OVERLAP_POLICIES:
            raise bad(_unknown("overlap policy", self.overlap, OVERLAP_POLICIES), "overlap")
        for name in ("catchup", "jitter"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise bad(f"expected seconds, got {value!r}", name)
            if not (math.isfinite(value) and 0 <= value <= 366 * 86400):
                raise bad(f"{value!r} seconds is not between 0 and 366 days", name)
        if not isinstance(self.paused, bool):
            raise bad(f"expected true or false, got {self.paused!r}", "paused")
        for name in ("start", "end"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not 0 <= value <= LATEST
            ):
                raise bad(f"expected Unix seconds from 1970 to 9999, got {value!r}", name)
        if self.start is not None and self.end is not None and self.end <= self.start:
            raise bad("end must be after start", "end")
        _check_json(self.workload, self.name, "workload", dict)
        _check_json(self.notify, self.name, "notify", list)
        if any(not isinstance(item, dict) for item in self.notify):
            raise bad("each notify entry must be a mapping", "notify")
        if not isinstance(self.description, str) or len(self.description) > MAX_DESCRIPTION:
            raise bad(f"a string of at most {MAX_DESCRIPTION} characters", "description")


def validate_name(name: Any) -> str:
    """`name` if it is a valid schedule name (`[A-Za-z0-9][A-Za-z0-9._-]{0,127}`).

    Raises:
        TriggerError(field="name"): it is not.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise TriggerError(
            f"{name!r} is not a schedule name: 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit",
            field="name",
        )
    return name


def _unknown(what: str, value: Any, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(str(value), list(known), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else f"one of {', '.join(known)}"
    return f"unknown {what} {value!r} ({hint})"


def nested_too_deep(value: Any, limit: int = MAX_NESTING) -> bool:
    """Whether `value` nests lists and mappings more than `limit` deep (walked without
    recursion)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth >= limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def check_json_value(
    value: Any, at: str, *, name: str | None = None, kind: str = "schedule"
) -> None:
    """Refuse (TriggerError naming `at`) a trigger's JSON field nested more than
    MAX_NESTING deep, larger than MAX_SPEC_JSON as JSON text, or holding text that cannot
    be stored (NUL, a lone surrogate)."""
    if nested_too_deep(value):
        raise TriggerError(
            f"nested more than {MAX_NESTING} levels deep", name=name, field=at, kind=kind
        )
    _check_text(value, at, name, kind)
    try:
        text = json.dumps(value, allow_nan=False, default=str)
    except (TypeError, ValueError) as exc:
        raise TriggerError(f"not JSON values ({exc})", name=name, field=at, kind=kind) from None
    if len(text) > MAX_SPEC_JSON:
        raise TriggerError(
            f"larger than {MAX_SPEC_JSON // 1024} KiB", name=name, field=at, kind=kind
        )


def _check_text(value: Any, at: str, name: str | None, kind: str | None) -> None:
    """Refuse text that cannot be stored or sent (`flowtide.storable`), naming where."""
    from flowtide.storable import bad_text

    found = bad_text(value, at)
    if found is not None:
        where, what = found
        extra = {} if kind is None else {"kind": kind}
        raise TriggerError(
            f"{where} holds {what}, which cannot be stored", name=name, field=at, **extra
        )


def _check_json(value: Any, name: str, at: str, kind: type) -> None:
    if not isinstance(value, kind):
        raise TriggerError(
            f"must be a {'mapping' if kind is dict else 'list'}", name=name, field=at
        )
    if nested_too_deep(value):
        raise TriggerError(f"nested more than {MAX_NESTING} levels deep", name=name, field=at)
    _check_text(value, at, name, None)
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TriggerError(f"not JSON values ({exc})", name=name, field=at) from None
    except RecursionError:
        raise TriggerError("nested too deeply", name=name, field=at) from None
    if len(text) > MAX_SPEC_JSON:
        raise TriggerError(f"larger than {MAX_SPEC_JSON // 1024} KiB", name=name, field=at)
    # JSON turns other keys into strings and tuples into lists: stored, it would differ.
    if json.loads(text) != value:
        raise TriggerError("not JSON values (keys must be strings)", name=name, field=at)


def parse_time(text: Any, field: str) -> float:
    """Unix seconds of `text`: ISO 8601 with a zone (`2026-01-01T00:00:00Z`,
    `...+02:00`), or a number of Unix seconds (given as a number or a numeric string).

    Raises:
        TriggerError(field=field): not a time, or an ISO time without a zone.
    """
    if isinstance(text, bool):
        raise TriggerError(f"expected a time, got {text!r}", field=field)
    if isinstance(text, int | float):
        seconds = float(text) if abs(text) < 1e300 else math.inf  # no OverflowError
    elif isinstance(text, dt.datetime):
        if text.tzinfo is None:
            raise TriggerError(f"{text.isoformat()!r} has no time zone", field=field)
        seconds = text.timestamp()
    elif isinstance(text, str):
        body = text.strip()
        try:
            seconds = float(body)
        except ValueError:
            try:
                at = dt.datetime.fromisoformat(body)
            except ValueError:
                raise TriggerError(
                    f"{text!r} is not a time: write ISO 8601 with a zone "
                    "('2026-01-01T00:00:00Z', '2026-01-01T02:00:00+02:00') or Unix seconds",
                    field=field,
                ) from None
            if at.tzinfo is None:
                raise TriggerError(
                    f"{text!r} has no time zone: add 'Z' for UTC or an offset like '+02:00'",
                    field=field,
                ) from None
            seconds = at.timestamp()
    else:
        raise TriggerError(f"expected a time, got {type(text).__name__}", field=field)
    if not math.isfinite(seconds):
        raise TriggerError(f"{text!r} is not a time", field=field)
    if not 0 <= seconds <= LATEST:
        raise TriggerError(
            f"{text!r} is not a time from 1970 to the end of 9999 (Unix seconds 0 to {LATEST:.0f})",
            field=field,
        )
    return seconds


# -- documents ---------------------------------------------------------------------------


class Positions(Protocol):
    """Where each node of a document was written: `flowtide.playbook.source.Positions`
    (or any mapping-like `get(path)` giving `(line, column)`, 1-based)."""

    def get(self, path: tuple[str | int, ...], /) -> Any: ...


_TOP = ("apiVersion", "kind", "metadata", "spec")
_METADATA = ("name", "description")
_SPEC = (
    "playbook",
    "cron",
    "timezone",
    "every",
    "offset",
    "workload",
    "overlap",
    "catchup",
    "jitter",
    "paused",
    "start",
    "end",
    "notify",
)
_PLAYBOOK = ("path", "version")


class _Reader:
    def __init__(self, source: str | None, positions: Positions | None) -> None:
        self.source = source
        self.positions = positions
        self.name: str | None = None

    def where(self, path: tuple[str | int, ...]) -> str | None:
        if self.positions is not None:
            probe = path
            while True:
                found = self.positions.get(probe)
                if (
                    isinstance(found, tuple)
                    and len(found) == 2
                    and all(isinstance(n, int) for n in found)
                ):
                    return f"{self.source or '<document>'}:{found[0]}:{found[1]}"
                if not probe:
                    break
                probe = probe[:-1]
        return self.source

    def error(self, path: tuple[str | int, ...], message: str, at: str) -> TriggerError:
        return TriggerError(message, name=self.name, field=at, location=self.where(path))

    def relocate(self, exc: TriggerError, path: tuple[str | int, ...]) -> TriggerError:
        return TriggerError(
            exc.message,
            name=self.name,
            field=exc.field,
            location=exc.location or self.where(path),
        )

    def mapping(self, value: Any, path: tuple[str | int, ...], at: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.error(path, f"'{at}' must be a mapping", at)
        return value

    def known(self, doc: Mapping[str, Any], keys: Sequence[str], path: tuple[str, ...]) -> None:
        for key in doc:
            if key not in keys:
                where = ".".join((*path, str(key)))
                raise self.error((*path, key), _unknown("field", key, keys), where)


def schedule_from_document(
    doc: Mapping[str, Any],
    *,
    source: str | None = None,
    positions: Positions | None = None,
) -> ScheduleSpec:
    """The schedule a `kind: Schedule` document describes.

    Args:
        doc: the parsed YAML (or JSON) document.
        source: its file name, for `location`.
        positions: where each node was written (`flowtide.playbook.source.load_yaml`'s
            second result); without it `location` is `source` alone.

    Raises:
        TriggerError: the document is not a valid schedule; `name`, `field` (the spec
            key, e.g. `cron`; dotted for an unknown one, `spec.cronn`) and `location`
            say where.
    """
    r = _Reader(source, positions)
    top = r.mapping(doc, (), "document")
    name_raw = (
        top.get("metadata", {}).get("name") if isinstance(top.get("metadata"), Mapping) else None
    )
    if isinstance(name_raw, str):
        r.name = name_raw
    r.known(top, _TOP, ())
    api = top.get("apiVersion")
    if api is not None and not (isinstance(api, str) and api.startswith(_API_VERSIONS)):
        raise r.error(
            ("apiVersion",),
            f"unsupported apiVersion {api!r} (noetl.io/v2 or flowtide.io/v1)",
            "apiVersion",
        )
    if top.get("kind") != "Schedule":
        raise r.error(("kind",), f"expected kind: Schedule, got {top.get('kind')!r}", "kind")
    meta = r.mapping(top.get("metadata"), ("metadata",), "metadata")
    r.known(meta, _METADATA, ("metadata",))
    if "name" not in meta:
        raise r.error(("metadata",), "a schedule needs metadata.name", "name")
    try:
        validate_name(meta["name"])
    except TriggerError as exc:
        raise r.relocate(exc, ("metadata", "name")) from None
    description = meta.get("description", "")
    if not isinstance(description, str):
        raise r.error(("metadata", "description"), "must be a string", "description")
    spec = r.mapping(top.get("spec"), ("spec",), "spec")
    r.known(spec, _SPEC, ("spec",))

    def at(key: str) -> tuple[str, str]:
        return ("spec", key)

    playbook, version = _playbook(r, spec.get("playbook"))
    if ("cron" in spec) == ("every" in spec):
        raise r.error(("spec",), "write exactly one of 'cron' and 'every'", "when")
    try:
        when: When
        if "cron" in spec:
            if "offset" in spec:
                raise r.error(at("offset"), "'offset' goes with 'every', not 'cron'", "offset")
            zone = spec.get("timezone", "UTC")
            where = at("timezone") if "timezone" in spec else at("cron")
            try:
                when = cron(spec["cron"], zone)
            except TriggerError as exc:
                raise r.relocate(exc, at("cron") if exc.field == "cron" else where) from None
        else:
            if "timezone" in spec:
                raise r.error(
                    at("timezone"),
                    "'timezone' goes with 'cron' ('every' counts from the epoch)",
                    "timezone",
                )
            try:
                when = every(spec["every"], spec.get("offset", 0))
            except TriggerError as exc:
                raise r.relocate(exc, at(exc.field or "every")) from None
        values: dict[str, Any] = {}
        for key in ("catchup", "jitter"):
            if key in spec:
                values[key] = parse_duration(spec[key], field=key, allow_zero=True)
        for key in ("start", "end"):
            if spec.get(key) is not None:
                values[key] = parse_time(spec[key], key)
    except TriggerError as exc:
        raise r.relocate(exc, at(exc.field or "")) from None
    workload = spec.get("workload", {})
    if workload is None:
        workload = {}
    notify = spec.get("notify", [])
    if notify is None:
        notify = []
    for key, value in (("workload", workload), ("notify", notify)):
        kind = Mapping if key == "workload" else list
        if not isinstance(value, kind):
            raise r.error(
                at(key), f"'{key}' must be a {'mapping' if kind is Mapping else 'list'}", key
            )
    try:
        return ScheduleSpec(
            name=meta["name"],
            playbook=playbook,
            version=version,
            when=when,
            workload=dict(workload),
            overlap=spec.get("overlap", "skip"),
            paused=spec.get("paused", False),
            notify=list(notify),
            description=description,
            **values,
        )
    except TriggerError as exc:
        raise r.relocate(exc, at(exc.field or "")) from None


def _playbook(r: _Reader, value: Any) -> tuple[str, int | None]:
    path: tuple[str | int, ...] = ("spec", "playbook")
    if value is None:
        raise r.error(("spec",), "a schedule needs spec.playbook", "playbook")
    if isinstance(value, str):
        return value, None
    if isinstance(value, Mapping):
        r.known(value, _PLAYBOOK, ("spec", "playbook"))
        ref, version = value.get("path"), value.get("version")
        if not isinstance(ref, str):
            raise r.error((*path, "path"), "playbook.path must be a string", "playbook")
        if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
            raise r.error(
                (*path, "version"), f"version must be an integer, got {version!r}", "version"
            )
        return ref, version
    raise r.error(path, "playbook must be a path or {path, version}", "playbook")


# -- stored form -------------------------------------------------------------------------


def spec_to_json(spec: ScheduleSpec) -> dict[str, Any]:
    """The stored form of `spec` (JSON values, copied; `spec_from_json` reads it back
    equal)."""
    return {
        "name": spec.name,
        "playbook": spec.playbook,
        "version": spec.version,
        "when": when_to_json(spec.when),
        "workload": copy.deepcopy(spec.workload),
        "overlap": spec.overlap,
        "catchup": spec.catchup,
        "jitter": spec.jitter,
        "paused": spec.paused,
        "start": spec.start,
        "end": spec.end,
        "notify": copy.deepcopy(spec.notify),
        "description": spec.description,
    }


_STORED = (
    "name",
    "playbook",
    "version",
    "when",
    "workload",
    "overlap",
    "catchup",
    "jitter",
    "paused",
    "start",
    "end",
    "notify",
    "description",
)


def spec_from_json(doc: Mapping[str, Any]) -> ScheduleSpec:
    """The `ScheduleSpec` stored by `spec_to_json`, validated again.

    Raises:
        TriggerError: not a stored schedule.
    """
    if not isinstance(doc, Mapping):
        raise TriggerError("a stored schedule must be an object")
    name = doc.get("name")
    extra = sorted(set(doc) - set(_STORED))
    if extra:
        raise TriggerError(f"unknown stored fields {extra}", name=str(name), field=extra[0])

    def number(key: str, default: float | None) -> float | None:
        value = doc.get(key, default)
        if value is None or isinstance(value, bool) or not isinstance(value, int | float):
            return value  # ScheduleSpec refuses what is not a number
        return float(value)

    try:
        when = when_from_json(doc.get("when"))  # type: ignore[arg-type]
    except TriggerError as exc:
        raise TriggerError(exc.message, name=str(name), field=exc.field) from None
    return ScheduleSpec(
        name=doc.get("name"),  # type: ignore[arg-type]
        playbook=doc.get("playbook"),  # type: ignore[arg-type]
        version=doc.get("version"),
        when=when,
        workload=doc.get("workload", {}),
        overlap=doc.get("overlap", "skip"),
        catchup=number("catchup", 3600.0),  # type: ignore[arg-type]
        jitter=number("jitter", 0.0),  # type: ignore[arg-type]
        paused=doc.get("paused", False),
        start=number("start", None),
        end=number("end", None),
        notify=doc.get("notify", []),
        description=doc.get("description", ""),
    )
