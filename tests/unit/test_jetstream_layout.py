"""The server's streams laid out as the settings say: what an existing stream gets
changed, what is refused, and which JetStream failures are waited out."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import nats.errors
import nats.js.errors
import pytest
from nats.js.api import Placement, RetentionPolicy, StorageType, StreamConfig

from flowtide.errors import NatsError
from flowtide.server import jetstream
from flowtide.server.jetstream import StreamLayout, stream_update, transient, with_retries


def _stream(**over: object) -> StreamConfig:
    base = StreamConfig(
        name="FLOWTIDE_COMMANDS",
        subjects=["flowtide.cmd.>"],
        retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.FILE,
        num_replicas=1,
        max_bytes=-1,
        duplicate_window=120.0,
    )
    for key, value in over.items():
        setattr(base, key, value)
    return base


def test_the_layout_shapes_a_stream_and_reads_the_settings() -> None:
    tree = SimpleNamespace(
        nats_replicas=3,
        nats_placement_cluster="east",
        nats_placement_tags=" ssd, az1 ,",
        nats_storage="memory",
        nats_commands_max_bytes=1 << 30,
        nats_logs_max_bytes=1 << 20,
    )
    layout = StreamLayout.from_tree(tree)
    assert layout.placement_tags == ("ssd", "az1")
    shaped = layout.shape(_stream(), layout.commands_max_bytes)
    assert shaped.num_replicas == 3 and shaped.max_bytes == 1 << 30
    assert shaped.storage == StorageType.MEMORY
    assert shaped.placement == Placement(cluster="east", tags=["ssd", "az1"])
    assert StreamLayout().placement() is None


@pytest.mark.parametrize(
    ("tags", "cluster", "named"),
    [
        ("ssd, a b", None, "FLOWTIDE_NATS_PLACEMENT_TAGS: 'a b' is not one word"),
        ("ssd;az1 x", None, "FLOWTIDE_NATS_PLACEMENT_TAGS"),
        ("ssd,az\x01", None, "FLOWTIDE_NATS_PLACEMENT_TAGS"),
        (None, "east west", "FLOWTIDE_NATS_PLACEMENT_CLUSTER: 'east west'"),
    ],
)
def test_odd_placement_settings_are_refused_by_name(
    tags: str | None, cluster: str | None, named: str
) -> None:
    # A tag with a space went to the streams as it was, and the loop-state bucket then
    # refused it with a KVError naming no setting.
    from flowtide.errors import SettingsError

    tree = SimpleNamespace(
        nats_replicas=1,
        nats_placement_cluster=cluster,
        nats_placement_tags=tags,
        nats_storage="file",
        nats_commands_max_bytes=-1,
        nats_logs_max_bytes=1 << 20,
    )
    with pytest.raises(SettingsError, match=named):
        StreamLayout.from_tree(tree)


def test_blank_placement_settings_mean_none() -> None:
    tree = SimpleNamespace(
        nats_replicas=1,
        nats_placement_cluster="  ",
        nats_placement_tags=" , ,",
        nats_storage="file",
        nats_commands_max_bytes=-1,
        nats_logs_max_bytes=1 << 20,
    )
    layout = StreamLayout.from_tree(tree)
    assert layout.placement() is None and layout.kv_placement() is None


def test_an_existing_stream_gets_what_changed_and_nothing_else() -> None:
    current = _stream()
    wanted = StreamLayout(replicas=3, placement_tags=("az1",)).shape(_stream(), 4096)
    updated, changes = stream_update(current, wanted)
    assert updated is not None
    assert updated.num_replicas == 3 and updated.max_bytes == 4096
    assert updated.placement == Placement(cluster=None, tags=["az1"])
    assert updated.subjects == ["flowtide.cmd.>"]  # the rest as it was
    assert [c.split()[0] for c in changes] == ["num_replicas", "placement", "max_bytes"]
    # Already as wanted: nothing to update (tags in another order are the same placement).
    same = _stream(num_replicas=3, max_bytes=4096, placement=Placement(tags=["az1"]))
    assert stream_update(same, wanted) == (None, [])


def test_placement_removed_is_a_change() -> None:
    current = _stream(placement=Placement(cluster="east"))
    updated, changes = stream_update(current, StreamLayout().shape(_stream(), -1))
    assert updated is not None and updated.placement is None
    assert changes == ["placement ('east', ()) -> None"]


def test_storage_cannot_change_and_the_refusal_says_why_and_how() -> None:
    wanted = StreamLayout(storage="memory").shape(_stream(), -1)
    with pytest.raises(NatsError) as caught:
        stream_update(_stream(), wanted)
    text = str(caught.value)
    assert "FLOWTIDE_COMMANDS keeps storage file" in text
    assert "cannot change a stream's storage" in text
    assert "nats stream rm FLOWTIDE_COMMANDS" in text


def test_what_an_election_answers_is_transient_and_a_refusal_is_not() -> None:
    assert transient(nats.errors.TimeoutError())
    assert transient(nats.errors.NoRespondersError())
    assert transient(nats.js.errors.ServiceUnavailableError(code=503))
    assert transient(nats.js.errors.APIError(code=500, err_code=10008))
    assert not transient(nats.js.errors.BadRequestError(code=400, err_code=10074))
    assert not transient(nats.js.errors.NotFoundError(code=404, err_code=10059))
    assert not transient(ValueError("no"))


def test_retries_wait_out_an_election_and_stop_at_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []
    clock = [0.0]

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    monkeypatch.setattr(jetstream.asyncio, "sleep", fake_sleep)
    monkeypatch.setattr(jetstream.time, "monotonic", lambda: clock[0])
    calls = [0]

    async def elects_after_three() -> str:
        calls[0] += 1
        if calls[0] <= 3:
            raise nats.errors.TimeoutError
        return "ok"

    assert asyncio.run(with_retries(elects_after_three, "x")) == "ok"
    assert slept == [0.1, 0.2, 0.4]

    async def never() -> str:
        calls[0] += 1
        raise nats.js.errors.ServiceUnavailableError(code=503)

    clock[0], calls[0] = 0.0, 0
    with pytest.raises(nats.js.errors.ServiceUnavailableError):
        asyncio.run(with_retries(never, "x", budget=5.0))
    assert 4.0 <= clock[0] <= 5.0 and calls[0] > 3

    async def refused() -> str:
        calls[0] += 1
        raise nats.js.errors.BadRequestError(code=400, err_code=10074)

    calls[0] = 0
    with pytest.raises(nats.js.errors.BadRequestError):
        asyncio.run(with_retries(refused, "x"))
    assert calls[0] == 1


@pytest.mark.parametrize(
    "env", ["FLOWTIDE_NATS_LOGS_MAX_BYTES", "FLOWTIDE_NATS_COMMANDS_MAX_BYTES"]
)
def test_a_size_jetstream_cannot_hold_is_refused_by_name(
    env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It reached STREAM.CREATE as it was, and came back as a Go JSON error at start.
    from flowtide.errors import SettingsError
    from flowtide.settings import ServerSection, read

    monkeypatch.setenv(env, str(2**64))
    with pytest.raises(SettingsError, match=env):
        read(ServerSection, {})


@pytest.mark.parametrize(
    ("env", "value", "said"),
    [
        ("FLOWTIDE_NATS_STORAGE", "disk", "FLOWTIDE_NATS_STORAGE='disk': must be file or memory"),
        ("FLOWTIDE_NATS_PLACEMENT_TAGS", "a b", "FLOWTIDE_NATS_PLACEMENT_TAGS: 'a b' is not one"),
    ],
)
def test_a_bad_nats_setting_is_told_before_the_database_is_tried(
    env: str, value: str, said: str
) -> None:
    from typer.testing import CliRunner

    from flowtide.cli import app

    # Nothing listens on port 1: had the server tried the database or NATS first, the
    # error would be theirs.
    result = CliRunner().invoke(
        app,
        ["server", "--db", "postgresql://x@127.0.0.1:1/none", "--nats", "nats://127.0.0.1:1"],
        env={env: value},
    )
    assert result.exit_code == 2, result.output
    assert said in result.output, result.output
