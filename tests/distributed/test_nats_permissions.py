"""NATS least privilege on a real nats-server configured as `flowtide dev up` configures it
(flowtide.dev.nats, flowtide.subjects).

A worker's NATS user may pull from and ack on its own pool's consumer and nothing else:
publishing a command, reading or writing the KV, managing the stream or touching another
pool's consumer are refused by the server (a `-ERR 'Permissions Violation ...'`, asserted
here as the client receives it). The server's user does what the server needs. Refused
credentials are a clear error that names the URL without its password, from the library,
`flowtide worker` and `flowtide kv`.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest

from flowtide.errors import NatsError
from flowtide.kv import KVError, connect
from flowtide.natsauth import NatsAuth, connect_nats
from flowtide.server.logs import ensure_log_stream
from flowtide.server.outbox import STREAM, ensure_consumer
from flowtide.subjects import pool_consumer, worker_inbox, worker_permissions

from .conftest import NatsServer
from .stack import flowtide_env

pytestmark = [pytest.mark.anyio, pytest.mark.nats, pytest.mark.timeout(120)]

BUCKET = "flowtide_state"
KEY = "exec.1.loop.fetch.0.meta"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    server = NatsServer.start_secured(tmp_path_factory.mktemp("nats"), pools=("default", "other"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _As:
    """A plain nats-py connection as one of flowtide's NATS users, keeping the errors the
    server sends it (a refused publish or subscribe is an asynchronous -ERR, never a
    reply)."""

    def __init__(self, server: NatsServer, user: str, inbox_prefix: str = "_INBOX") -> None:
        self.server = server
        self.user = server.users[user]
        self.inbox_prefix = inbox_prefix
        self.errors: list[str] = []
        self.nc: Any = None

    async def __aenter__(self) -> _As:
        async def on_error(exc: Exception) -> None:
            self.errors.append(str(exc).lower())

        self.nc = await nats.connect(
            self.server.url,
            user=self.user.name,
            password=self.user.password,
            inbox_prefix=self.inbox_prefix,
            error_cb=on_error,
            allow_reconnect=False,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.nc.close()

    async def refused(self, verb: str, subject: str) -> None:
        """Wait for the server's refusal to `verb` ("publish" or "subscription") on
        `subject` (nats-py reports the server's text lowercased)."""
        wanted = f'permissions violation for {verb} to "{subject.lower()}"'
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if any(wanted in e for e in self.errors):
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"no refusal {wanted!r}; errors: {self.errors}")

    async def request_refused(self, subject: str, body: bytes = b"") -> None:
        """A request to `subject` gets no answer and the server says it refused it."""
        with pytest.raises(nats.errors.TimeoutError):
            await self.nc.request(subject, body, timeout=1)
        await self.refused("publish", subject)


def _worker(server: NatsServer, pool: str = "default") -> _As:
    return _As(server, f"worker-{pool}", worker_inbox(pool))


async def _messages(server: NatsServer) -> int:
    async with _As(server, "server") as srv:
        for pool in ("default", "other"):
            await ensure_consumer(srv.nc.jetstream(), pool)
        info = await srv.nc.jetstream().stream_info(STREAM)
        return int(info.state.messages)


async def test_server_user_publishes_commands_and_uses_the_kv(secured: NatsServer) -> None:
    async with _As(secured, "server") as srv:
        js = srv.nc.jetstream()
        assert await ensure_consumer(js, "default") == pool_consumer("default")
        # (To a pool without workers: the notification waits in the stream, out of the
        # way of the other tests' pulls.)
        ack = await js.publish("flowtide.commands.idle.10", b'{"event_id": "1"}')
        assert ack.stream == STREAM
        assert srv.errors == []
    kv = await connect(secured.url, BUCKET, ttl=60, nats_auth=secured.users["server"].auth())
    try:
        revision = await kv.put(KEY, b"server-wrote-this")
        assert (await kv.get(KEY)).value == b"server-wrote-this"
        assert KEY in await kv.keys("exec.>")
        assert revision > 0
    finally:
        await kv.close()


async def test_worker_user_pulls_and_acks_on_its_pool_only(secured: NatsServer) -> None:
    await _messages(secured)  # the consumers exist, as after a worker's registration
    async with _As(secured, "server") as srv:
        await srv.nc.jetstream().publish("flowtide.commands.default.11", b'{"n": 11}')
    async with _worker(secured) as worker:
        js = worker.nc.jetstream()
        info = await js.consumer_info(STREAM, pool_consumer("default"))
        assert info.config.filter_subject == "flowtide.commands.default.>"
        inbox = worker.nc.new_inbox()
        got: asyncio.Queue[Any] = asyncio.Queue()

        async def deliver(msg: Any) -> None:
            got.put_nowait(msg)

        await worker.nc.subscribe(inbox, cb=deliver)
        pull = json.dumps({"batch": 1, "expires": 3_000_000_000}).encode()
        await worker.nc.publish(
            f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.{pool_consumer('default')}", pull, reply=inbox
        )
        msg = await asyncio.wait_for(got.get(), 5)
        assert msg.subject == "flowtide.commands.default.11" and msg.data == b'{"n": 11}'
        await msg.ack()
        await worker.nc.flush()
        assert worker.errors == []

        # Another pool's consumer is out of reach, and so are the others' replies.
        with pytest.raises(nats.errors.TimeoutError):
            await js.consumer_info(STREAM, pool_consumer("other"), timeout=1)
        await worker.refused("publish", f"$JS.API.CONSUMER.INFO.{STREAM}.{pool_consumer('other')}")
        await worker.nc.publish(
            f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.{pool_consumer('other')}", pull, reply=inbox
        )
        await worker.refused(
            "publish", f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.{pool_consumer('other')}"
        )
        await worker.nc.subscribe("_INBOX.>")
        await worker.refused("subscription", "_INBOX.>")
    async with _As(secured, "server") as srv:
        info = await srv.nc.jetstream().consumer_info(STREAM, pool_consumer("default"))
        assert info.num_ack_pending == 0 and info.num_pending == 0, (info, worker.errors)


async def test_worker_user_cannot_publish_a_command_or_manage_the_stream(
    secured: NatsServer,
) -> None:
    before = await _messages(secured)
    async with _worker(secured) as worker:
        js = worker.nc.jetstream()
        for subject in ("flowtide.commands.default.12", "flowtide.commands.other.12"):
            with pytest.raises(nats.errors.TimeoutError):
                await js.publish(subject, b'{"event_id": "666"}', timeout=1)
            await worker.refused("publish", subject)
        for subject in (
            f"$JS.API.STREAM.DELETE.{STREAM}",
            f"$JS.API.STREAM.PURGE.{STREAM}",
            f"$JS.API.CONSUMER.DELETE.{STREAM}.{pool_consumer('default')}",
            f"$JS.API.CONSUMER.CREATE.{STREAM}.forged.flowtide.commands.>",
        ):
            await worker.request_refused(subject)
    assert await _messages(secured) == before
    async with _As(secured, "server") as srv:
        assert (await srv.nc.jetstream().stream_info(STREAM)).config.name == STREAM
        names = await srv.nc.jetstream().consumers_info(STREAM)
        assert sorted(c.name for c in names) == [pool_consumer("default"), pool_consumer("other")]


async def test_worker_user_publishes_logs_under_its_pool_only(secured: NatsServer) -> None:
    async with _As(secured, "server") as srv:
        await ensure_log_stream(srv.nc.jetstream())
    async with _worker(secured) as worker:
        await worker.nc.publish("flowtide.logs.default.1.2", b"printed\n")
        await worker.nc.flush()
        assert worker.errors == []
        for subject in ("flowtide.logs.other.1.2", "flowtide.logs.>"):
            await worker.nc.publish(subject, b"forged\n")
            await worker.refused("publish", subject)
        # It cannot read the stream back (another pool's output included).
        await worker.request_refused("$JS.API.STREAM.INFO.FLOWTIDE_LOGS")
    async with _As(secured, "server") as srv:
        info = await srv.nc.jetstream().stream_info("FLOWTIDE_LOGS", subjects_filter=">")
        assert info.state.subjects == {"flowtide.logs.default.1.2": 1}


async def test_a_worker_of_another_pool_cannot_write_an_executions_logs(
    secured: NatsServer,
) -> None:
    # A worker of pool `other` may publish under flowtide.logs.other.<any execution>: the
    # server read every pool's subjects of an execution, so such a worker could put
    # output of its choosing into the log of another pool's execution.
    from flowtide.server.logs import read_rings

    async with _As(secured, "server") as srv:
        await ensure_log_stream(srv.nc.jetstream())
    headers = {"Flowtide-Start": "0", "Flowtide-Step": "talk"}
    async with _worker(secured) as own, _worker(secured, "other") as intruder:
        await own.nc.publish("flowtide.logs.default.41.5", b"mine\n", headers=headers)
        await intruder.nc.publish("flowtide.logs.other.41.6", b"forged\n", headers=headers)
        await own.nc.flush()
        await intruder.nc.flush()
        assert own.errors == intruder.errors == []
    async with _As(secured, "server") as srv:
        rings = await read_rings(srv.nc.jetstream(), 41, set(), pool="default")
    assert {k: v.data for k, v in rings.items()} == {5: b"mine\n"}


async def test_a_read_of_the_live_logs_keeps_a_bounded_number_of_bytes(
    secured: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A follower reads every 0.2 s: each read held every message of the execution (up to
    # the stream's 256 MiB), the commands it skips included.
    from flowtide.server import logs

    async with _As(secured, "server") as srv:
        await ensure_log_stream(srv.nc.jetstream())
    async with _worker(secured) as worker:
        for command, start in ((1, 0), (1, 1000), (1, 2000), (2, 0)):
            headers = {"Flowtide-Start": str(start), "Flowtide-Step": "talk"}
            await worker.nc.publish(
                f"flowtide.logs.default.43.{command}", b"x" * 1000, headers=headers
            )
        await worker.nc.flush()
    monkeypatch.setattr(logs, "MAX_READ_BYTES", 2500)
    async with _As(secured, "server") as srv:
        js = srv.nc.jetstream()
        bounded = await logs.read_rings(js, 43, set(), pool="default")
        assert sum(len(r.data) for r in bounded.values()) <= 2500
        assert bounded[1].data == b"x" * 2000  # the rest waits for the next read
        skipped = await logs.read_rings(js, 43, {1}, pool="default")
    assert {k: len(v.data) for k, v in skipped.items()} == {2: 1000}


async def test_worker_user_cannot_read_or_write_the_kv(secured: NatsServer) -> None:
    server_auth = secured.users["server"].auth()
    kv = await connect(secured.url, BUCKET, ttl=60, nats_auth=server_auth)
    try:
        revision = await kv.put(KEY, b"server-wrote-this")
        async with _worker(secured) as worker:
            # put: a publish to the key's subject
            await worker.nc.publish(f"$KV.{BUCKET}.{KEY}", b"forged")
            await worker.refused("publish", f"$KV.{BUCKET}.{KEY}")
            # get: Direct Get, or a message get through the stream
            await worker.request_refused(f"$JS.API.DIRECT.GET.KV_{BUCKET}.$KV.{BUCKET}.{KEY}")
            await worker.request_refused(
                f"$JS.API.STREAM.MSG.GET.KV_{BUCKET}",
                json.dumps({"last_by_subj": f"$KV.{BUCKET}.{KEY}"}).encode(),
            )
        # Through flowtide's adapter, with the worker's credentials: the refusal, named.
        with pytest.raises(KVError) as info:
            await connect(secured.url, BUCKET, nats_auth=secured.users["worker-default"].auth())
        message = str(info.value)
        assert "permissions violation" in message and f"KV_{BUCKET}" in message
        assert secured.users["worker-default"].password not in message
        entry = await kv.get(KEY)
        assert (entry.value, entry.revision) == (b"server-wrote-this", revision)
    finally:
        await kv.close()


async def test_wrong_password_names_the_redacted_url(secured: NatsServer) -> None:
    password = "Wr0ng-passw0rd-given"
    host = f"127.0.0.1:{secured.port}"
    with pytest.raises(NatsError) as in_url:
        await connect_nats(
            f"nats://worker-default:{password}@{host}", NatsAuth(), name="t", wait=False
        )
    with pytest.raises(NatsError) as in_env:
        await connect_nats(
            secured.url, NatsAuth(user="worker-default", password=password), name="t", wait=False
        )
    for exc, shown in ((in_url, f"nats://worker-default:***@{host}"), (in_env, secured.url)):
        text = f"{exc.value} {exc.value!r}"
        assert f"cannot connect to NATS at {shown}: authorization violation" in text
        assert password not in text
        assert exc.value.url == shown
    # No credentials at all: refused too (the dev stack's NATS has no anonymous user).
    with pytest.raises(NatsError, match="authorization violation"):
        await connect_nats(secured.url, NatsAuth(), name="t", wait=False)


def _flowtide(tmp: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flowtide.cli", *args],
        capture_output=True,
        text=True,
        env={**flowtide_env(tmp), **env},
        cwd=tmp,
        timeout=60,
    )


def test_cli_refusals_are_clear_and_keep_the_password_out(
    secured: NatsServer, tmp_path: Path
) -> None:
    password = "Wr0ng-passw0rd-given"
    host = f"127.0.0.1:{secured.port}"
    wrong = {"FLOWTIDE_NATS_USER": "worker-default", "FLOWTIDE_NATS_PASSWORD": password}
    # The worker connects to NATS before it registers: no flowtide server is needed to
    # see it refuse, and it stops instead of retrying a password that stays wrong.
    worker = _flowtide(
        tmp_path, "worker", "--server", "http://127.0.0.1:9", "--nats", secured.url, env=wrong
    )
    assert worker.returncode == 1
    assert f"error: cannot connect to NATS at {secured.url}: authorization violation" in (
        worker.stderr
    )
    assert password not in worker.stderr and "Traceback" not in worker.stderr
    # The server, likewise, before it touches its database.
    server_wrong = {"FLOWTIDE_NATS_USER": "server", "FLOWTIDE_NATS_PASSWORD": password}
    server_run = _flowtide(
        tmp_path,
        "server",
        "--db",
        "postgresql://flowtide@127.0.0.1:9/flowtide",
        "--nats",
        secured.url,
        "--port",
        "9",
        env=server_wrong,
    )
    assert server_run.returncode == 1
    assert f"error: cannot connect to NATS at {secured.url}: authorization violation" in (
        server_run.stderr
    )
    assert password not in server_run.stderr and "Traceback" not in server_run.stderr

    in_url = _flowtide(tmp_path, "kv", "ls", "--url", f"nats://server:{password}@{host}", env={})
    assert in_url.returncode == 2
    assert f"nats://server:***@{host}" in in_url.stderr
    assert "authorization violation" in in_url.stderr and password not in in_url.stderr

    server = secured.users["server"]
    right = {"FLOWTIDE_NATS_USER": server.name, "FLOWTIDE_NATS_PASSWORD": server.password}
    listed = _flowtide(tmp_path, "kv", "ls", "--url", secured.url, "--json", env=right)
    assert listed.returncode == 0, listed.stderr
    assert isinstance(json.loads(listed.stdout), list)

    half = _flowtide(
        tmp_path, "kv", "ls", "--url", secured.url, env={"FLOWTIDE_NATS_USER": "server"}
    )
    assert half.returncode == 2
    assert "FLOWTIDE_NATS_USER is set but FLOWTIDE_NATS_PASSWORD is not" in half.stderr
    missing = tmp_path / "no.creds"
    creds = _flowtide(
        tmp_path, "kv", "ls", "--url", secured.url, "--nats-creds", str(missing), env={}
    )
    assert creds.returncode == 2
    assert f"cannot read the NATS credentials file {missing}" in creds.stderr


def test_creds_file_for_jwt_accounts(tmp_path: Path) -> None:
    """--nats-creds / FLOWTIDE_NATS_CREDS: a user JWT and nkey seed, on a nats-server in
    operator mode. The same subject permissions, written into a worker's JWT, refuse it
    the KV just as the dev stack's users do."""
    from natsjwt import JwtAccount

    jwt = JwtAccount.create()
    with NatsServer.start(
        tmp_path / "nats", "-c", str(jwt.server_config(tmp_path / "op.conf"))
    ) as srv:
        server_creds = jwt.creds(tmp_path / "server.creds", "server")
        listed = _flowtide(
            tmp_path, "kv", "ls", "--url", srv.url, "--nats-creds", str(server_creds), env={}
        )
        assert listed.returncode == 0, listed.stderr
        perms = worker_permissions("default")
        worker_creds = jwt.creds(
            tmp_path / "worker.creds",
            "worker-default",
            {"pub": {"allow": list(perms.publish)}, "sub": {"allow": list(perms.subscribe)}},
        )
        as_worker = _flowtide(
            tmp_path,
            "kv",
            "ls",
            "--url",
            srv.url,
            env={"FLOWTIDE_NATS_CREDS": str(worker_creds)},
        )
        assert as_worker.returncode == 2 and "permissions violation" in as_worker.stderr
        # A user of another operator's account: refused, and the file's seed never shown.
        stranger = JwtAccount.create().creds(tmp_path / "stranger.creds", "stranger")
        refused = _flowtide(
            tmp_path, "kv", "ls", "--url", srv.url, "--nats-creds", str(stranger), env={}
        )
        assert refused.returncode == 2 and "authorization violation" in refused.stderr
        seed = stranger.read_text().split("BEGIN USER NKEY SEED-----\n")[1].split("\n")[0]
        assert seed not in refused.stderr


async def test_worker_user_cannot_reach_republished_mirrored_or_locked_state(
    secured: NatsServer,
) -> None:
    # The KV settings added for clusters (republish, mirrors, apply=True) and the
    # retention lease (KVLock on duty.retention.<shard> in the loop-state bucket) open no
    # way in for a worker: its user still may publish only to its consumer and its logs,
    # and subscribe only to its own inbox.
    from flowtide.kv import KVLock, Republish

    server_auth = secured.users["server"].auth()
    kv = await connect(
        secured.url, BUCKET, republish=Republish("kvout.>"), apply=True, nats_auth=server_auth
    )
    mirror_name = f"{BUCKET}_mirror"
    mirror = await connect(secured.url, mirror_name, mirror=BUCKET, nats_auth=server_auth)
    lock = KVLock(kv, "duty.retention.0", ttl=30, holder="server-0")
    try:
        lease = await lock.acquire(timeout=5)
        async with _worker(secured) as worker:
            # Live values: the republish subject, the bucket's own subjects.
            for subject in ("kvout.>", f"$KV.{BUCKET}.>", f"$KV.{mirror_name}.>"):
                await worker.nc.subscribe(subject)
                await worker.refused("subscription", subject)
            # Take or renew the lease, or write through the republish subject.
            for subject in (f"$KV.{BUCKET}.duty.retention.0", "kvout.duty.retention.0"):
                await worker.nc.publish(subject, b'{"holder": "worker"}')
                await worker.refused("publish", subject)
            # Read the mirror; change or create streams.
            for subject in (
                f"$JS.API.DIRECT.GET.KV_{mirror_name}.$KV.{BUCKET}.duty.retention.0",
                f"$JS.API.STREAM.MSG.GET.KV_{mirror_name}",
                f"$JS.API.STREAM.UPDATE.KV_{BUCKET}",
                f"$JS.API.STREAM.UPDATE.{STREAM}",
                "$JS.API.STREAM.CREATE.KV_forged",
            ):
                # (A request without waiting out its timeout: the refusal is what counts.)
                await worker.nc.publish(subject, b"{}", reply=worker.nc.new_inbox())
                await worker.refused("publish", subject)
        assert lease.held and await lease.check()
        info = await lock.current()
        assert info is not None and info.holder == "server-0" and info.token == lease.token
        await lease.release()
    finally:
        await mirror.destroy()
        await mirror.close()
        await kv.close()
        plain = await connect(
            secured.url, BUCKET, republish=None, apply=True, nats_auth=server_auth
        )
        await plain.close()
