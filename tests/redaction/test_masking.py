"""Display masking (`flowtide.redaction`) and the secret set the engine folds: pure logic."""

from __future__ import annotations

import logging

import pytest

from flowtide.engine import events as ev
from flowtide.engine.events import Event
from flowtide.engine.state import ExecutionState, fold
from flowtide.playbook.loader import parse_playbook
from flowtide.redaction import (
    install_log_masking,
    mask_event_doc,
    mask_text,
    mask_value,
    remember,
    weak_fields,
    weak_reason,
)

LONG = "Zq7-hunter2-Kx9"


def test_a_long_secret_is_masked_wherever_it_appears() -> None:
    assert mask_text(f"dsn=postgresql://app:{LONG}@db/x", {LONG}) == "dsn=postgresql://app:***@db/x"
    assert mask_text(f"prefix{LONG}suffix", {LONG}) == "prefix***suffix"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("demographics", "demographics"),
        ("pft_test_patient_demographics", "pft_test_patient_demographics"),
        ("demo", "***"),
        ("user=demo password=demo", "user=*** password=***"),
        (
            "postgresql://demo:demo@localhost/demo_noetl",
            "postgresql://***:***@localhost/demo_noetl",
        ),
        ("Demo", "Demo"),
    ],
)
def test_a_short_secret_is_masked_only_as_a_whole_word(text: str, shown: str) -> None:
    assert mask_text(text, {"demo"}) == shown


def test_the_longer_of_two_overlapping_secrets_wins() -> None:
    assert mask_text("token abcdefgh12345678", {"abcdefgh", "abcdefgh12345678"}) == "token ***"


def test_mask_value_masks_strings_and_keys_and_leaves_the_input_alone() -> None:
    value = {"rows": [{"pw": LONG, "n": 3}], LONG: [LONG, 1.5, None, True]}
    masked = mask_value(value, {LONG})
    assert masked == {"rows": [{"pw": "***", "n": 3}], "***": ["***", 1.5, None, True]}
    assert value["rows"][0]["pw"] == LONG  # a copy: the data itself is never altered
    assert mask_value(value, frozenset()) is value


def test_mask_event_doc_masks_payload_and_error_only() -> None:
    doc = Event(1, 2, "call.error", "load", "error", {"out": LONG}, {"message": LONG}).to_dict()
    masked = mask_event_doc(doc, {LONG})
    assert masked["payload"] == {"out": "***"} and masked["error"] == {"message": "***"}
    assert masked["step"] == "load" and doc["payload"] == {"out": LONG}


@pytest.mark.parametrize(
    ("value", "weak"),
    [("demo", True), ("Password", True), ("abc1234", True), ("postgres", True), (LONG, False)],
)
def test_weak_values(value: str, weak: bool) -> None:
    assert (weak_reason(value) is not None) is weak


def test_weak_fields_name_the_secret_fields_only() -> None:
    body = {"host": "db", "user": "demo", "password": "demo", "database": "demo", "port": 5432}
    assert weak_fields(body) == [("password", "a common word")]
    assert weak_fields({"type": "bearer", "token": "abc"}) == [
        ("token", "shorter than 8 characters")
    ]
    assert weak_fields({"password": LONG}) == []
    assert weak_fields({"headers": {"X-Api-Key": "k-123", "Accept": "application/json"}}) == [
        ("headers.X-Api-Key", "shorter than 8 characters")
    ]


def test_log_records_are_masked_with_every_secret_the_process_met(
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = "log-secret-7f3a9c1e"
    install_log_masking()
    remember({secret})
    logger = logging.getLogger("flowtide.test_redaction")
    with caplog.at_level(logging.WARNING, logger="flowtide.test_redaction"):
        logger.warning("connecting with %s", secret)
        try:
            raise RuntimeError(f"refused: {secret}")
        except RuntimeError:
            logger.exception("failed")
    text = "\n".join(caplog.text.splitlines())
    assert "connecting with ***" in text and "refused: ***" in text
    assert secret not in text


def test_the_engine_folds_the_secret_set_and_keeps_it_out_of_the_context() -> None:
    playbook = parse_playbook(
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: p}\n"
        "workflow:\n  - step: start\n    tool: {kind: noop}\n"
    )
    log = [
        Event(1, 7, ev.PLAYBOOK_INITIALIZED, payload={"workload": {"x": 1}}),
        Event(2, 7, ev.SECRETS_ADDED, payload={"values": ["demo", LONG]}),
        Event(3, 7, ev.SECRETS_ADDED, payload={"values": ["demo", 5, ""]}),
    ]
    state = fold(playbook, 7, log)
    assert state.secrets == {"demo", LONG}
    assert "demo" not in repr(state.context()) and LONG not in repr(state.context_parts())
    assert ExecutionState(playbook, 7).secrets == frozenset()
