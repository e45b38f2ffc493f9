"""`kind: nats` against real nats-servers with JetStream: KV round trips, keys, delete and
purge through flowtide's KV port; object store; JetStream publish and reads; core
publish and request against a subscriber and a responder started here; credentials by
alias (user/password and token servers), errors a policy can tell apart, pooling, and
no password in results, errors or logs."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

import flowtide
from flowtide.credentials import CredentialVault
from flowtide.errors import PlaybookError, ToolError
from flowtide.playbook.loader import load_playbook
from flowtide.store.sqlite import SQLiteStore
from flowtide.tools.base import ToolContext
from flowtide.tools.nats import NatsTool
from flowtide.tools.nats_conn import close_connections, link_count
from kv.natsserver import NatsServer

pytestmark = pytest.mark.nats

PASSWORD = "alice-" + secrets.token_hex(8)
TOKEN = "tok@/:%-" + secrets.token_hex(8)  # characters a URL could not carry


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    with NatsServer.start(tmp_path_factory.mktemp("nats-open")) as srv:
        yield srv
        close_connections()


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    root = tmp_path_factory.mktemp("nats-user")
    with NatsServer.start(root, "--user", "alice", "--pass", PASSWORD) as srv:
        yield srv
        close_connections()


@pytest.fixture(scope="module")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    with NatsServer.start(tmp_path_factory.mktemp("nats-token"), "--auth", TOKEN) as srv:
        yield srv
        close_connections()


@pytest.fixture
def nats_ctx(vault: CredentialVault, make_ctx: Any, server: NatsServer) -> Any:
    """A ToolContext factory whose vault has `nats_credential` -> the open server."""
    vault.set("nats_credential", {"url": server.url}, kind="nats")
    return make_ctx


def call(ctx: ToolContext, **config: Any) -> dict[str, Any]:
    result = NatsTool().run({"kind": "nats", "auth": "nats_credential", **config}, ctx)
    assert isinstance(result, dict)
    return result


def refused(ctx: ToolContext, **config: Any) -> ToolError:
    with pytest.raises(ToolError) as info:
        NatsTool().run({"kind": "nats", "auth": "nats_credential", **config}, ctx)
    return info.value


def bucket_name() -> str:
    return "b" + uuid.uuid4().hex[:10]


class Peer:
    """A nats-py client on a thread of its own: records what it receives on `subject`,
    and (`answer`) answers requests with `{"echo": <data>, "subject": ...}`."""

    def __init__(self, url: str, subject: str, *, answer: bool = True) -> None:
        self.url, self.subject, self.answer = url, subject, answer
        self.received: list[tuple[str, Any, dict[str, str] | None]] = []
        self.got = threading.Event()
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        nc = await nats.connect(self.url)

        async def on_msg(msg: Any) -> None:
            data = json.loads(msg.data) if msg.data else None
            self.received.append((msg.subject, data, msg.headers))
            self.got.set()
            if msg.reply and self.answer:
                await msg.respond(json.dumps({"echo": data, "subject": msg.subject}).encode())

        await nc.subscribe(self.subject, cb=on_msg)
        await nc.flush()
        self._ready.set()
        await self._stop.wait()
        await nc.close()

    def __enter__(self) -> Peer:
        self._thread.start()
        assert self._ready.wait(10), "the peer did not connect"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


# ---------------------------------------------------------------------------------------
# KV through flowtide's KV port
# ---------------------------------------------------------------------------------------


def test_kv_round_trip_of_a_mapping(nats_ctx: Any) -> None:
    ctx, bucket = nats_ctx(), bucket_name()
    value = {"session_token": "abc", "user_id": 1, "is_active": True, "tags": ["a", "b"]}
    put = call(ctx, operation="kv_put", bucket=bucket, key="s.1", value=value)
    assert put == {"status": "success", "bucket": bucket, "key": "s.1", "revision": 1}
    got = call(ctx, operation="kv_get", bucket=bucket, key="s.1")
    assert got["status"] == "success" and got["value"] == value
    assert got["revision"] == 1 and got["created"].startswith("20")


@pytest.mark.parametrize(
    "value, read_back",
    [("plain text", "plain text"), ("123", 123), (7, 7), (True, True), ([1, "x"], [1, "x"])],
)
def test_kv_values_are_json_when_they_are_json(nats_ctx: Any, value: Any, read_back: Any) -> None:
    ctx, bucket = nats_ctx(), bucket_name()
    call(ctx, operation="kv_put", bucket=bucket, key="k", value=value)
    assert call(ctx, operation="kv_get", bucket=bucket, key="k")["value"] == read_back


def test_kv_keys_delete_and_purge(nats_ctx: Any) -> None:
    ctx, bucket = nats_ctx(), bucket_name()
    for key in ("user.1", "user.2", "order.1"):
        call(ctx, operation="kv_put", bucket=bucket, key=key, value={"k": key})
    keys = call(ctx, operation="kv_keys", bucket=bucket)
    assert keys == {
        "status": "success",
        "bucket": bucket,
        "keys": ["order.1", "user.1", "user.2"],
        "count": 3,
    }
    assert call(ctx, operation="kv_keys", bucket=bucket, pattern="user.*")["keys"] == [
        "user.1",
        "user.2",
    ]
    deleted = call(ctx, operation="kv_delete", bucket=bucket, key="user.1")
    assert deleted == {"status": "success", "bucket": bucket, "key": "user.1"}
    missing = call(ctx, operation="kv_get", bucket=bucket, key="user.1")
    assert missing == {"status": "not_found", "bucket": bucket, "key": "user.1", "value": None}
    assert call(ctx, operation="kv_purge", bucket=bucket, key="user.2")["status"] == "success"
    assert call(ctx, operation="kv_keys", bucket=bucket)["keys"] == ["order.1"]


def test_a_missing_bucket_is_not_found(nats_ctx: Any) -> None:
    error = refused(nats_ctx(), operation="kv_get", bucket=bucket_name(), key="k")
    assert error.kind == "not_found"


def test_kv_put_creates_the_bucket_with_history(nats_ctx: Any, server: NatsServer) -> None:
    ctx, bucket = nats_ctx(), bucket_name()
    call(ctx, operation="kv_put", bucket=bucket, key="k", value="v1", history=5, ttl=3600)

    async def config() -> Any:
        nc = await nats.connect(server.url)
        try:
            return (await nc.jetstream().stream_info(f"KV_{bucket}")).config
        finally:
            await nc.close()

    stream = asyncio.run(config())
    assert stream.max_msgs_per_subject == 5 and stream.max_age == 3600


def test_an_invalid_key_is_a_config_error(nats_ctx: Any) -> None:
    error = refused(nats_ctx(), operation="kv_put", bucket=bucket_name(), key="a b", value=1)
    assert error.kind == "config_error" and "a b" in error.message


# ---------------------------------------------------------------------------------------
# Core NATS, JetStream, object store
# ---------------------------------------------------------------------------------------


def test_publish_reaches_a_subscriber(nats_ctx: Any, server: NatsServer) -> None:
    with Peer(server.url, "events.>") as peer:
        result = call(
            nats_ctx(),
            operation="publish",
            subject="events.created",
            data={"id": 5},
            headers={"X-Trace": "t1"},
        )
        assert result == {"status": "success", "subject": "events.created"}
        assert peer.got.wait(5)
    subject, data, headers = peer.received[0]
    assert subject == "events.created" and data == {"id": 5}
    assert headers is not None and headers["X-Trace"] == "t1"


def test_request_gets_the_responders_reply(nats_ctx: Any, server: NatsServer) -> None:
    with Peer(server.url, "svc.echo"):
        result = call(nats_ctx(), operation="request", subject="svc.echo", data=["ping", 1])
    assert result["status"] == "success" and result["subject"] == "svc.echo"
    assert result["data"] == {"echo": ["ping", 1], "subject": "svc.echo"}


def test_a_request_nobody_answers(nats_ctx: Any) -> None:
    error = refused(nats_ctx(), operation="request", subject="svc.nobody", timeout=1)
    assert error.kind == "not_found" and error.code == "no_responders" and error.retryable


def test_a_request_without_a_reply_times_out(nats_ctx: Any, server: NatsServer) -> None:
    with Peer(server.url, "svc.silent", answer=False):
        started = time.monotonic()
        error = refused(nats_ctx(), operation="request", subject="svc.silent", timeout=0.5)
    assert error.kind == "timeout" and error.retryable
    assert time.monotonic() - started < 5


def test_a_cancelled_execution_stops_a_waiting_request(nats_ctx: Any, server: NatsServer) -> None:
    flag = threading.Event()
    threading.Timer(0.3, flag.set).start()
    with Peer(server.url, "svc.silent", answer=False):
        started = time.monotonic()
        error = refused(
            nats_ctx(cancelled=flag.is_set), operation="request", subject="svc.silent", timeout=30
        )
    assert error.kind == "cancelled"
    assert time.monotonic() - started < 5


def test_object_store_round_trip(nats_ctx: Any) -> None:
    ctx, bucket = nats_ctx(), bucket_name()
    put = call(ctx, operation="object_put", bucket=bucket, name="report.txt", data="hello objects")
    assert put["status"] == "success" and put["size"] == len("hello objects")
    got = call(ctx, operation="object_get", bucket=bucket, name="report.txt")
    assert got == {
        "status": "success",
        "bucket": bucket,
        "name": "report.txt",
        "data": "hello objects",
        "size": 13,
    }
    raw = call(
        ctx, operation="object_put", bucket=bucket, name="bin", data="AAEC", encoding="base64"
    )
    assert raw["size"] == 3
    back = call(ctx, operation="object_get", bucket=bucket, name="bin", encoding="base64")
    assert back["data"] == "AAEC"
    info = call(ctx, operation="object_info", bucket=bucket, name="report.txt")
    assert info["size"] == 13 and info["digest"]
    listed = call(ctx, operation="object_list", bucket=bucket)
    assert sorted(o["name"] for o in listed["objects"]) == ["bin", "report.txt"]
    call(ctx, operation="object_delete", bucket=bucket, name="bin")
    missing = refused(ctx, operation="object_get", bucket=bucket, name="bin")
    assert missing.kind == "not_found"


def test_jetstream_publish_and_read(nats_ctx: Any, server: NatsServer) -> None:
    stream = "S" + uuid.uuid4().hex[:8]

    async def make_stream() -> None:
        nc = await nats.connect(server.url)
        await nc.jetstream().add_stream(name=stream, subjects=[f"{stream}.>"])
        await nc.close()

    asyncio.run(make_stream())
    ctx = nats_ctx()
    ack = call(ctx, operation="js_publish", subject=f"{stream}.a", data={"n": 1}, stream=stream)
    assert ack == {"status": "success", "stream": stream, "seq": 1, "duplicate": False}
    call(ctx, operation="js_publish", subject=f"{stream}.b", data="two")
    last = call(ctx, operation="js_get_msg", stream=stream, last=True)
    assert last["seq"] == 2 and last["data"] == "two" and last["subject"] == f"{stream}.b"
    first = call(ctx, operation="js_get_msg", stream=stream, seq=1)
    assert first["data"] == {"n": 1}
    info = call(ctx, operation="js_stream_info", stream=stream)
    assert info["state"]["messages"] == 2 and info["config"]["subjects"] == [f"{stream}.>"]
    nowhere = refused(ctx, operation="js_publish", subject="no.stream.here", data=1)
    assert nowhere.kind == "not_found"


# ---------------------------------------------------------------------------------------
# Credentials, pooling, secrets
# ---------------------------------------------------------------------------------------


def test_user_and_password_from_the_alias(
    vault: CredentialVault, make_ctx: Any, secured: NatsServer
) -> None:
    vault.set("nats_credential", {"url": secured.url, "user": "alice", "password": PASSWORD})
    ctx, bucket = make_ctx(), bucket_name()
    put = call(ctx, operation="kv_put", bucket=bucket, key="k", value={"ok": 1})
    assert call(ctx, operation="kv_get", bucket=bucket, key="k")["value"] == {"ok": 1}
    assert PASSWORD not in json.dumps(put)
    assert PASSWORD in ctx.secrets


def test_a_wrong_password_is_auth_and_never_shown(
    vault: CredentialVault, make_ctx: Any, secured: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "wrong-" + secrets.token_hex(8)
    vault.set("nats_credential", {"url": secured.url, "user": "alice", "password": wrong})
    caplog.set_level(logging.DEBUG)
    for operation in ("kv_get", "publish"):
        error = refused(make_ctx(), operation=operation, bucket="b", key="k", subject="s")
        assert error.kind == "auth", error
        assert wrong not in error.message and wrong not in repr(error.to_dict())
    assert wrong not in caplog.text


def test_a_password_in_the_url_is_hidden_too(
    vault: CredentialVault, make_ctx: Any, secured: NatsServer
) -> None:
    url = secured.url.replace("nats://", "nats://alice:bad-url-pass@")
    vault.set("nats_credential", {"url": url})
    ctx = make_ctx()
    error = refused(ctx, operation="kv_get", bucket="b", key="k")
    assert error.kind == "auth" and "bad-url-pass" not in error.message
    assert url in ctx.secrets


def test_a_token_credential(
    vault: CredentialVault, make_ctx: Any, token_server: NatsServer
) -> None:
    vault.set("nats_credential", {"nats_url": token_server.url, "nats_token": TOKEN})
    ctx, bucket = make_ctx(), bucket_name()
    call(ctx, operation="kv_put", bucket=bucket, key="k", value="v")
    assert call(ctx, operation="kv_get", bucket=bucket, key="k")["value"] == "v"
    assert TOKEN in ctx.secrets
    vault.set("nats_credential", {"url": token_server.url, "token": "not-the-token"})
    error = refused(make_ctx(), operation="kv_get", bucket=bucket, key="k")
    assert error.kind == "auth" and "not-the-token" not in error.message


def test_connections_are_pooled_per_url_and_credentials(
    vault: CredentialVault, make_ctx: Any, server: NatsServer, secured: NatsServer
) -> None:
    close_connections()
    vault.set("open", {"url": server.url})
    vault.set("alice", {"url": secured.url, "user": "alice", "password": PASSWORD})
    bucket = bucket_name()
    for _ in range(3):
        NatsTool().run(
            {"operation": "kv_put", "auth": "open", "bucket": bucket, "key": "k", "value": 1},
            make_ctx(),
        )
        NatsTool().run({"operation": "publish", "auth": "open", "subject": "x"}, make_ctx())
    assert link_count() == 1
    NatsTool().run({"operation": "publish", "auth": "alice", "subject": "x"}, make_ctx())
    assert link_count() == 2
    close_connections()
    assert link_count() == 0
    # and the next call connects again
    NatsTool().run({"operation": "publish", "auth": "open", "subject": "x"}, make_ctx())
    assert link_count() == 1


def test_the_server_is_required(make_ctx: Any) -> None:
    with pytest.raises(ToolError) as info:
        NatsTool().run({"operation": "publish", "subject": "x"}, make_ctx())
    assert info.value.kind == "config_error" and "NATS URL is not configured" in info.value.message
    with pytest.raises(ToolError) as info:
        NatsTool().run({"operation": "publish", "subject": "x", "auth": "nope"}, make_ctx())
    assert info.value.kind == "credential"


def test_an_unreachable_server_is_a_retryable_connection_error(
    vault: CredentialVault, make_ctx: Any
) -> None:
    from conftest import free_port

    vault.set("nats_credential", {"url": f"nats://127.0.0.1:{free_port()}"})
    error = refused(make_ctx(), operation="publish", subject="x")
    assert error.kind == "connection" and error.retryable


# ---------------------------------------------------------------------------------------
# Playbooks
# ---------------------------------------------------------------------------------------


def test_a_playbook_with_a_policy_on_not_found(tmp_path: Path, server: NatsServer) -> None:
    home = tmp_path / "home"
    store = SQLiteStore(home / "flowtide.db")
    try:
        CredentialVault(store, home).set("nats_local", {"url": server.url}, kind="nats")
    finally:
        store.close()
    book = tmp_path / "pb.yaml"
    book.write_text(
        textwrap.dedent(
            """\
            apiVersion: noetl.io/v2
            kind: Playbook
            metadata: {name: nats_policy, path: nats_policy}
            workload: {bucket: nope_bucket}
            workflow:
            - step: start
              tool:
                kind: nats
                auth: nats_local
                operation: kv_get
                bucket: "{{ bucket }}"
                key: k
                spec:
                  policy:
                    rules:
                      - when: "{{ output.error.kind == 'not_found' }}"
                        then: {do: continue}
            """
        )
    )
    doc = flowtide.run(book, home=home)
    assert doc["status"] == "completed", doc


def test_validation_names_the_operation_and_its_fields(tmp_path: Path) -> None:
    book = tmp_path / "bad.yaml"
    book.write_text(
        textwrap.dedent(
            """\
            apiVersion: noetl.io/v2
            kind: Playbook
            metadata: {name: bad, path: bad}
            workflow:
            - step: start
              tool:
                kind: nats
                auth: nats_credential
                operation: kv_gett
            - step: put
              tool:
                kind: nats
                operation: kv_put
                bucket: b
            """
        )
    )
    with pytest.raises(PlaybookError) as info:
        load_playbook(book)
    text = str(info.value)
    assert "bad.yaml:9:" in text and "unknown nats operation 'kv_gett'" in text
    assert "did you mean 'kv_get'" in text
    assert "step 'put', field 'tool.key'" in text and "step 'put', field 'tool.value'" in text
    assert "step 'put', field 'tool.auth'" in text
