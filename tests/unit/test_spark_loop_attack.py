"""A spark loop's items against a hostile playbook, worker or local user: what an item's
code sees of its python worker's environment, the files the driver shares with its
python workers, and the `command.progress` a worker reports."""

from __future__ import annotations

import json
import os
import stat
import tempfile
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from flowtide.errors import ToolError
from flowtide.playbook.loader import parse_playbook
from flowtide.spark import loop, loopmarks
from flowtide.spark.partition import executor_environment
from jsonstub import JsonHandler

_WORKER_ENV = {
    "PATH": "/usr/bin",
    "HOME": "/home/flowtide",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TMPDIR": "/tmp",
    "HTTPS_PROXY": "http://proxy:3128",
    "SSL_CERT_FILE": "/etc/ssl/cert.pem",
    # The worker's own secrets: none reaches an item.
    "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "AWS_ACCESS_KEY_ID": "aws-id",
    "PGPASSWORD": "pg-secret",
    "DATABASE_URL": "postgresql://u:p@db/x",
    "FLOWTIDE_TOKEN": "worker-token",
    "FLOWTIDE_PG_DSN": "postgresql://u:p@db/flowtide",
    # Spark's own, of the python worker: kept, but not its secrets.
    "SPARK_HOME": "/opt/spark",
    "SPARK_REUSE_WORKER": "1",
    "PYSPARK_PYTHON": "python3",
    "PYTHONPATH": "/opt/spark/python",
    "PYTHONHASHSEED": "0",
    "PYTHON_WORKER_FACTORY_SECRET": "factory-secret",
    "PYSPARK_GATEWAY_SECRET": "gateway-secret",
    "SPARK_REMOTE": "sc://host:15002/;token=connect-secret",
    "_PYSPARK_DRIVER_CONN_INFO_PATH": "/tmp/conn",
    # flowtide limits and roots stay: the items' tools read them.
    "FLOWTIDE_MAX_RESULT_BYTES": "1000",
    "FLOWTIDE_FILE_ROOTS": "/data",
    # ... but not a setting of theirs that would hold a secret.
    "FLOWTIDE_HTTP_PROXY_PASSWORD": "proxy-secret",
}


def test_an_item_on_a_worker_sees_no_secret_of_the_worker_environment() -> None:
    env = executor_environment(_WORKER_ENV, embedded=False)
    secrets = {"aws-secret", "aws-id", "pg-secret", "postgresql://u:p@db/x", "worker-token"}
    secrets.add("proxy-secret")
    secrets |= {"factory-secret", "gateway-secret", "sc://host:15002/;token=connect-secret"}
    assert not secrets & set(env.values()), env
    assert "_PYSPARK_DRIVER_CONN_INFO_PATH" not in env
    for kept in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "HTTPS_PROXY", "SSL_CERT_FILE"):
        assert env[kept] == _WORKER_ENV[kept]
    for kept in ("SPARK_HOME", "SPARK_REUSE_WORKER", "PYSPARK_PYTHON", "PYTHONPATH"):
        assert env[kept] == _WORKER_ENV[kept]
    assert env["FLOWTIDE_MAX_RESULT_BYTES"] == "1000"
    assert env["FLOWTIDE_FILE_ROOTS"] == "/data"


def test_an_item_on_a_worker_sees_the_variables_templates_may_see() -> None:
    environ = {**_WORKER_ENV, "FLOWTIDE_TEMPLATE_ENV": "AWS_ACCESS_KEY_ID,FLOWTIDE_TOKEN"}
    env = executor_environment(environ, embedded=False)
    assert env["AWS_ACCESS_KEY_ID"] == "aws-id"  # listed: a python step sees it too
    assert "FLOWTIDE_TOKEN" not in env  # never, listed or not
    assert "AWS_SECRET_ACCESS_KEY" not in env


def test_an_embedded_item_sees_the_users_environment_but_not_flowtides_secrets() -> None:
    env = executor_environment(_WORKER_ENV, embedded=True)
    assert env["AWS_SECRET_ACCESS_KEY"] == "aws-secret"  # the user's own, as a python step
    assert "FLOWTIDE_TOKEN" not in env and "FLOWTIDE_PG_DSN" not in env
    # Spark's secrets are not the user's: gone here too.
    assert "PYTHON_WORKER_FACTORY_SECRET" not in env
    assert "PYSPARK_GATEWAY_SECRET" not in env


@pytest.fixture
def tmp_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_a_loops_files_are_in_a_folder_of_its_own_no_other_user_may_enter(
    tmp_folder: Path,
) -> None:
    base = loopmarks.make("k")
    info = os.lstat(base)
    assert stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()
    assert stat.S_IMODE(info.st_mode) == 0o700
    assert os.path.dirname(base) == str(tmp_folder)
    # The loop's key does not name it alone: a folder made before under that key is
    # never the loop's.
    assert loopmarks.make("k") != base


def test_files_a_local_user_leaves_under_a_loops_key_do_not_stop_it_nor_count(
    tmp_folder: Path,
) -> None:
    # Another user sees the loop's key (the temporary folder lists names) and leaves
    # what a driver would: a stop marker, a forged count.
    key = "0123abcd"
    base = loopmarks.make(key)
    for name in (f"flowtide-spark-loop-{key}.stop", f"flowtide-spark-loop-{key}-x.stop"):
        (tmp_folder / name).write_text("")
    (tmp_folder / f"flowtide-spark-loop-{key}.p0").write_text("999999")
    assert not loopmarks.stopped(base)
    assert loopmarks.read_done(base) is None
    loopmarks.write_done(base, 0, 3)
    assert loopmarks.read_done(base) == 3
    loopmarks.stop(base)
    assert loopmarks.stopped(base)
    loopmarks.stop(base)  # again: still stopped, no error


def test_counts_that_are_not_a_partitions_are_not_read(tmp_folder: Path) -> None:
    base = loopmarks.make("k")
    loopmarks.write_done(base, 0, 5)
    loopmarks.write_done(base, 1, -7)  # never below 0
    for name, text in {"p2": "-100", "p3": "9" * 5000, "p4": "1e309", "p5": "nan"}.items():
        Path(base, name).write_text(text)
    assert loopmarks.read_done(base) == 5


def test_a_count_is_never_written_through_a_link(tmp_folder: Path) -> None:
    base = loopmarks.make("k")
    victim = tmp_folder / "victim"
    victim.write_text("keep")
    aside = Path(base, f"p0.{os.getpid()}.{threading.get_ident()}")
    aside.symlink_to(victim)
    loopmarks.write_done(base, 0, 4)
    assert victim.read_text() == "keep"


def test_old_folders_go_but_only_this_users_and_never_through_a_link(tmp_folder: Path) -> None:
    old, fresh = loopmarks.make("old"), loopmarks.make("fresh")
    loopmarks.write_done(old, 0, 1)
    hour_ago = time.time() - 7200
    os.utime(old, (hour_ago, hour_ago))
    # A link named as a loop's folder, to a folder that is old too: it is not followed.
    target = tmp_folder / "elsewhere"
    target.mkdir()
    (target / "data").write_text("keep")
    os.utime(target, (hour_ago, hour_ago))
    link = tmp_folder / "flowtide-spark-loop-link"
    link.symlink_to(target)
    loopmarks.forget(loopmarks.make("ended"))
    assert not os.path.exists(old)
    assert os.path.isdir(fresh)
    assert (target / "data").read_text() == "keep"


class _Echo(JsonHandler):
    """Answers each request with the Authorization header it got."""

    def do_GET(self) -> None:
        self.reply({"auth": self.headers.get("Authorization")})


def test_secrets_an_items_tool_touched_are_not_written_with_its_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The dataset a spark loop writes cannot seal a value as the event log does: what
    # an item's tool treated as a secret (an http auth token) is masked in it.
    import pyarrow as pa

    from flowtide.spark import partition

    monkeypatch.setattr(partition, "_executor_environment", lambda embedded: None)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = "tok-" + "9f3a" * 8
    text = f"""\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: masked, path: tests/masked}}
workflow:
  - step: call
    loop: {{in: [0, 1], iterator: x, spec: {{mode: spark}}}}
    tool:
      kind: http
      url: "http://127.0.0.1:{server.server_port}/{{{{ iter.x }}}}"
      auth: {{type: bearer, token: "{{{{ workload.token }}}}"}}
"""
    plan = {
        **{"key": "masked", "marks": None, "text": text, "file": None, "step": "call"},
        **{"iterator": "x", "size": 2, "unwrap": None, "items": [0, 1]},
        **{"base": {"workload": {"token": token}}, "ctx": {}, "execution_id": 1},
        **{"max_in_flight": 1, "data_dir": None},
    }
    batch = pa.RecordBatch.from_arrays([pa.array([0, 1])], names=["index"])
    try:
        (rows,) = partition.run_partition(plan, iter([batch]))
    finally:
        server.shutdown()
        server.server_close()
    assert rows.column(1).to_pylist() == ["ok", "ok"]
    results = [json.loads(r) for r in rows.column(2).to_pylist()]
    assert [r["data"]["auth"] for r in results] == ["Bearer ***", "Bearer ***"]
    assert token not in json.dumps(rows.to_pydict())


def _loop_step(spec: str) -> Any:
    text = f"""\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: hostile, path: tests/hostile}}
workflow:
  - step: work
    loop: {{in: [1], iterator: x, spec: {{mode: spark, {spec}}}}}
    tool: {{kind: python, code: "result = 1"}}
"""
    return parse_playbook(text).steps["work"]


@pytest.mark.parametrize(
    "value", ["x", "nan", "inf", "-1", 0, -5, 1e-9, "1e400", [1], {"a": 1}, True, None, ""]
)
def test_a_rate_that_renders_to_no_rate_is_a_clear_error(value: Any) -> None:
    step = _loop_step('rate: "{{ workload.r }}"')
    with pytest.raises(ToolError, match=r"loop 'spec.rate' rendered to .*expected a positive"):
        loop._rate(step, {"workload": {"r": value}})


def test_a_rate_within_bounds_is_taken() -> None:
    step = _loop_step('rate: "{{ workload.r }}"')
    assert loop._rate(step, {"workload": {"r": "2.5"}}) == 2.5
    assert loop._rate(step, {"workload": {"r": 1e-6}}) == 1e-6


@pytest.mark.parametrize("value", ["x", "-1", "1.5", "1e9", [2], True, None])
def test_max_in_flight_that_renders_to_no_count_is_a_clear_error(value: Any) -> None:
    step = _loop_step('max_in_flight: "{{ workload.m }}"')
    with pytest.raises(ToolError, match="spec.max_in_flight' rendered to"):
        loop._in_flight(step, {"workload": {"m": value}})


def test_max_in_flight_is_capped() -> None:
    step = _loop_step('max_in_flight: "{{ workload.m }}"')
    assert loop._in_flight(step, {"workload": {"m": "99999999999"}}) == loop._MAX_IN_FLIGHT
    assert loop._in_flight(step, {"workload": {"m": 0}}) == 1


def test_results_too_large_to_keep_are_never_collected_to_the_driver(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `results_max: 1000000000` with millions of items: the driver (a worker's, shared
    # by every execution) must not hold them all to find they do not fit.
    monkeypatch.setenv("FLOWTIDE_MAX_RESULT_BYTES", "1000")
    reads: list[int] = []

    def read() -> list[tuple[int, str]]:
        reads.append(1)
        return [(0, '"a"'), (1, '"b"')]

    assert loop._results(read, 501) is None
    assert reads == []
    assert loop._results(read, 500) == ["a", "b"]
    assert reads == [1]
