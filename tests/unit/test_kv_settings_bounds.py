"""KV bucket settings a reviewer tried to break (flowtide.kv.options): values JetStream
cannot hold were sent as they were and came back as Go JSON errors or a Python
OverflowError naming no setting, and a republish destination could reach NATS's own
subjects (another bucket's `$KV.`: two buckets republishing into each other wrote in a
loop), a worker's inbox, or flowtide's command stream."""

from __future__ import annotations

import pytest

from flowtide import wire
from flowtide.kv import KVError, Republish, connect
from flowtide.kv.base import BucketConfig
from flowtide.kv.options import RESERVED_SUBJECTS, subjects_overlap


@pytest.mark.parametrize(
    ("setting", "value", "named"),
    [
        ("ttl", 1e300, "ttl must be at most"),
        ("ttl", float("inf"), "ttl must be at most"),
        ("limit_marker_ttl", 1e30, "limit_marker_ttl must be at most"),
        ("max_bytes", 10**20, "max_bytes must be 1.."),
        ("max_bytes", -5, "max_bytes must be 1.."),
        ("max_value_size", 2**31, "max_value_size must be 1.."),
    ],
)
def test_values_jetstream_cannot_hold_are_refused_by_name(
    setting: str, value: float, named: str
) -> None:
    with pytest.raises(KVError, match=named):
        BucketConfig("b", **{setting: value})


def test_the_largest_values_are_accepted() -> None:
    config = BucketConfig("b", ttl=9_223_372_036, max_bytes=2**63 - 1, max_value_size=2**31 - 1)
    assert config.max_bytes == 2**63 - 1


@pytest.mark.parametrize(
    "destination",
    [
        "$KV.other.>",
        "$JS.API.STREAM.PURGE.KV_flowtide_state",
        "$SYS.REQ.SERVER.PING",
        "_INBOX.x",
        "_WORKER_INBOX.default.x",
        "flowtide.commands.default.0.1",
        "flowtide.*.default.0.1",
        "flowtide.>",
        "flowtide.logs.default.1.2",
        ">",
        "*.x.y",
        "out.\x00",
        "out.\n",
    ],
)
def test_republish_destination_stays_out_of_reserved_subjects(destination: str) -> None:
    with pytest.raises(KVError, match="republish destination"):
        Republish(destination)


@pytest.mark.parametrize("destination", ["out.>", "flowtide.state.>", "orders.updates"])
def test_republish_to_a_subject_of_ones_own(destination: str) -> None:
    assert Republish(destination).destination == destination


def test_reserved_subjects_cover_flowtides_streams() -> None:
    for subject in (
        wire.command_subject("p", 1, 0),
        wire.log_subject("p", 1, 2),
        f"{wire.worker_inbox('p')}.x",
    ):
        assert subject.startswith("_") or any(
            subjects_overlap(subject, r) for r in RESERVED_SUBJECTS
        ), subject


@pytest.mark.parametrize(
    ("a", "b", "overlap"),
    [
        ("a.b", "a.b", True),
        ("a.*", "a.b", True),
        ("a.>", "a", False),
        ("a.>", "a.b.c", True),
        ("a.b", "a.b.c", False),
        ("a.*.c", "a.b.d", False),
    ],
)
def test_subjects_overlap(a: str, b: str, overlap: bool) -> None:
    assert subjects_overlap(a, b) is overlap
    assert subjects_overlap(b, a) is overlap


def test_memory_refuses_them_too() -> None:
    import asyncio

    with pytest.raises(KVError, match="ttl must be at most"):
        asyncio.run(connect("memory://", "bounds", ttl=1e300))


def test_keys_and_filters_have_a_length_limit() -> None:
    from flowtide.kv import InvalidKeyError
    from flowtide.kv.keys import MAX_KEY_LENGTH, validate_filter, validate_key

    assert validate_key("k" * MAX_KEY_LENGTH)
    with pytest.raises(InvalidKeyError, match="at most"):
        validate_key("k" * (MAX_KEY_LENGTH + 1))
    with pytest.raises(InvalidKeyError, match="at most"):
        validate_filter("k" * MAX_KEY_LENGTH + ".>")
