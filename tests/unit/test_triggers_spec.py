"""A schedule as written and stored (flowtide.triggers.spec): `kind: Schedule`
documents, their errors with file positions, and the stored form's round trip."""

from __future__ import annotations

from typing import Any

import pytest

from flowtide.errors import TriggerError
from flowtide.playbook.source import load_yaml
from flowtide.triggers.spec import (
    OVERLAP_POLICIES,
    ScheduleSpec,
    parse_time,
    schedule_from_document,
    spec_from_json,
    spec_to_json,
    validate_name,
)
from flowtide.triggers.when import Cron, Every, cron, every

FULL = """\
apiVersion: noetl.io/v2
kind: Schedule
metadata:
  name: nightly-report
  description: The report, every night
spec:
  playbook: {path: reports/nightly, version: 3}
  cron: "0 2 * * *"
  timezone: Europe/Berlin
  workload: {day: "{{ schedule.time }}", rows: [1, 2]}
  overlap: buffer_one
  catchup: 2h
  jitter: 30s
  paused: true
  start: "2026-01-01T00:00:00Z"
  end: 2026-12-31T23:00:00+01:00
  notify:
    - {on: failed, webhook: "https://example.test/hook"}
"""


def read(text: str, source: str = "nightly.yaml") -> ScheduleSpec:
    doc, positions = load_yaml(text, source)
    return schedule_from_document(doc, source=source, positions=positions)


def refused(text: str, source: str = "s.yaml") -> TriggerError:
    with pytest.raises(TriggerError) as err:
        read(text, source)
    return err.value


def minimal(**spec: Any) -> str:
    lines = ["kind: Schedule", "metadata: {name: s1}", "spec:", "  playbook: examples/hello"]
    lines += [f"  {key}: {value}" for key, value in spec.items()]
    return "\n".join(lines) + "\n"


def test_a_full_document() -> None:
    spec = read(FULL)
    assert spec == ScheduleSpec(
        name="nightly-report",
        playbook="reports/nightly",
        version=3,
        when=Cron("0 2 * * *", "Europe/Berlin"),
        workload={"day": "{{ schedule.time }}", "rows": [1, 2]},
        overlap="buffer_one",
        catchup=7200.0,
        jitter=30.0,
        paused=True,
        start=1767225600.0,
        end=1798754400.0,
        notify=[{"on": "failed", "webhook": "https://example.test/hook"}],
        description="The report, every night",
    )


def test_defaults_and_every() -> None:
    spec = read(minimal(every="15m", offset="30s"))
    assert spec.when == Every(900.0, 30.0)
    assert (spec.version, spec.overlap, spec.catchup, spec.jitter) == (None, "skip", 3600.0, 0.0)
    assert (spec.paused, spec.start, spec.end, spec.notify, spec.workload) == (
        False,
        None,
        None,
        [],
        {},
    )
    assert read(minimal(cron="'@hourly'")).when == Cron("@hourly", "UTC")
    assert read(minimal(every=2, catchup=0)).catchup == 0.0
    assert read("apiVersion: flowtide.io/v1\n" + minimal(every="1s")).when == Every(1.0)


def test_an_unknown_field_suggests_the_close_one_with_its_position() -> None:
    err = refused(minimal(cronn="'0 2 * * *'"))
    assert err.field == "spec.cronn"
    assert err.name == "s1"
    assert err.location == "s.yaml:5:3"
    assert "unknown field 'cronn' (did you mean 'cron'?)" in str(err)
    err = refused(FULL.replace("  description:", "  descripton:"))
    assert "did you mean 'description'?" in str(err) and err.location == "s.yaml:5:3"
    err = refused("kind: Schedule\nmetdata: {name: x}\n")
    assert "did you mean 'metadata'?" in str(err)
    err = refused(FULL.replace("version: 3", "versoin: 3"))
    assert "unknown field 'versoin'" in str(err)


@pytest.mark.parametrize(
    ("spec", "field", "message", "line"),
    [
        ({"cron": "'61 * * * *'"}, "cron", "minute 61 out of range 0-59", 5),
        ({"cron": "'0 2 * * *'", "timezone": "Europe/Berln"}, "timezone", "did you mean", 6),
        ({"every": "15 minutes"}, "every", "is not a duration", 5),
        ({"every": "1m", "offset": "2m"}, "offset", "less than the interval", 6),
        ({"every": "1m", "jitter": "soon"}, "jitter", "is not a duration", 6),
        ({"every": "1m", "catchup": "-1h"}, "catchup", "is not a duration", 6),
        ({"every": "1m", "overlap": "buffer"}, "overlap", "did you mean 'buffer_one'?", 6),
        ({"every": "1m", "paused": "'yes'"}, "paused", "expected true or false", 6),
        ({"every": "1m", "start": "2026-01-01T00:00:00"}, "start", "has no time zone", 6),
        ({"every": "1m", "start": 10, "end": 5}, "end", "end must be after start", 7),
        ({"every": "1m", "workload": "[1]"}, "workload", "must be a mapping", 6),
        ({"every": "1m", "notify": "{a: 1}"}, "notify", "must be a list", 6),
        ({"every": "1m", "timezone": "UTC"}, "timezone", "goes with 'cron'", 6),
        ({"cron": "'@daily'", "offset": "1s"}, "offset", "goes with 'every'", 6),
        ({}, "when", "exactly one of 'cron' and 'every'", 3),
        ({"cron": "'@daily'", "every": "1m"}, "when", "exactly one of", 3),
    ],
)
def test_field_errors_name_the_schedule_field_and_position(
    spec: dict[str, Any], field: str, message: str, line: int
) -> None:
    err = refused(minimal(**spec))
    assert err.field == field
    assert err.name == "s1"
    assert message in str(err)
    assert err.location is not None and err.location.startswith(f"s.yaml:{line}:")
    assert str(err).startswith(f"{err.location}: schedule 's1', field '{field}': ")


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        ("kind: Playbook\nmetadata: {name: x}\nspec: {}\n", "kind", "expected kind: Schedule"),
        ("apiVersion: v1\nkind: Schedule\n", "apiVersion", "unsupported apiVersion"),
        ("kind: Schedule\nspec: {}\n", "metadata", "'metadata' must be a mapping"),
        ("kind: Schedule\nmetadata: {}\n", "name", "needs metadata.name"),
        ("kind: Schedule\nmetadata: {name: -x}\n", "name", "is not a schedule name"),
        ("kind: Schedule\nmetadata: {name: x}\n", "spec", "'spec' must be a mapping"),
        (
            "kind: Schedule\nmetadata: {name: x}\nspec: {every: 1s}\n",
            "playbook",
            "needs spec.playbook",
        ),
        (
            "kind: Schedule\nmetadata: {name: x}\nspec: {every: 1s, playbook: {path: a, version: x}}\n",
            "version",
            "must be an integer",
        ),
        (
            "kind: Schedule\nmetadata: {name: x}\nspec: {every: 1s, playbook: {path: a, version: 0}}\n",
            "version",
            "positive integer",
        ),
        (
            "kind: Schedule\nmetadata: {name: x}\nspec: {every: 1s, playbook: ''}\n",
            "playbook",
            "needs a playbook",
        ),
        (
            "kind: Schedule\nmetadata: {name: x}\nspec: {every: 1s, playbook: [a]}\n",
            "playbook",
            "a path or",
        ),
    ],
)
def test_document_errors(text: str, field: str, message: str) -> None:
    err = refused(text)
    assert err.field == field
    assert message in str(err)


def test_without_positions_the_location_is_the_source() -> None:
    doc, _ = load_yaml(minimal(cron="'61 * * * *'"))
    with pytest.raises(TriggerError) as err:
        schedule_from_document(doc, source="s.yaml")
    assert err.value.location == "s.yaml"
    with pytest.raises(TriggerError) as err:
        schedule_from_document(doc)
    assert err.value.location is None
    # a plain mapping of paths to positions works too
    with pytest.raises(TriggerError) as err:
        schedule_from_document(doc, source="s.yaml", positions={("spec", "cron"): (9, 4)})
    assert err.value.location == "s.yaml:9:4"


def test_names() -> None:
    for good in ("a", "nightly-report", "v1.2_x", "A" * 128):
        assert validate_name(good) == good
    for bad in ("", "-a", ".a", "a b", "a/b", "A" * 129, 5, None, "é"):
        with pytest.raises(TriggerError) as err:
            validate_name(bad)
        assert err.value.field == "name"


def test_times() -> None:
    assert parse_time("2026-01-01T00:00:00Z", "start") == 1767225600.0
    assert parse_time("2026-01-01T02:00:00+02:00", "start") == 1767225600.0
    assert parse_time(1767225600, "start") == 1767225600.0
    assert parse_time("1767225600.5", "start") == 1767225600.5
    for bad, message in (
        ("2026-01-01T00:00:00", "has no time zone"),
        ("2026-01-01", "has no time zone"),
        ("tomorrow", "is not a time"),
        ("nan", "is not a time"),
        (True, "expected a time"),
        ([], "expected a time"),
    ):
        with pytest.raises(TriggerError, match=message) as err:
            parse_time(bad, "end")
        assert err.value.field == "end"


def test_the_stored_form_round_trips_exactly() -> None:
    for spec in (
        read(FULL),
        ScheduleSpec(name="a", playbook="x.yaml", when=every("2s", "1s")),
        ScheduleSpec(name="b", playbook="p", when=cron("*/5 * * * * *"), catchup=0.0, jitter=1.5),
    ):
        stored = spec_to_json(spec)
        import json

        again = spec_from_json(json.loads(json.dumps(stored)))
        assert again == spec
        assert spec_to_json(again) == stored
    # integers where floats were stored (jsonb does that) read back equal
    stored = spec_to_json(ScheduleSpec(name="a", playbook="p", when=every(2)))
    stored.update(catchup=3600, jitter=0, when={"every": 2, "offset": 0})
    assert spec_from_json(stored) == ScheduleSpec(name="a", playbook="p", when=every(2))
    assert isinstance(spec_from_json(stored).catchup, float)


def test_the_stored_form_is_checked_too() -> None:
    stored = spec_to_json(ScheduleSpec(name="a", playbook="p", when=every(2)))
    for change, field in (
        ({"extra": 1}, "extra"),
        ({"when": {"cron": "61 * * * *"}}, "cron"),
        ({"overlap": "never"}, "overlap"),
        ({"catchup": "1h"}, "catchup"),
        ({"version": "3"}, "version"),
    ):
        with pytest.raises(TriggerError) as err:
            spec_from_json({**stored, **change})
        assert err.value.field == field


def test_construction_validates() -> None:
    with pytest.raises(TriggerError) as err:
        ScheduleSpec(name="a", playbook="p")
    assert err.value.field == "when"
    for kwargs, field in (
        ({"overlap": "buffer_some"}, "overlap"),
        ({"catchup": -1.0}, "catchup"),
        ({"jitter": float("inf")}, "jitter"),
        ({"workload": {"a": object()}}, "workload"),
        ({"workload": {1: "a"}}, "workload"),
        ({"workload": {"a": float("nan")}}, "workload"),
        ({"workload": {"a": "x" * 300_000}}, "workload"),
        ({"notify": ["webhook"]}, "notify"),
        ({"description": 5}, "description"),
        ({"start": True}, "start"),
    ):
        with pytest.raises(TriggerError) as err:
            ScheduleSpec(name="a", playbook="p", when=every(1), **kwargs)
        assert err.value.field == field, kwargs
    assert OVERLAP_POLICIES == ("skip", "buffer_one", "buffer_all", "cancel_other", "allow")
