"""The NoETL e2e fixtures (../shared/noetl-e2e), run unchanged through `flowtide run --json`.

Each test asserts the success criterion that the fixture table in noetl-e2e/README.md
gives, against real PostgreSQL and real stub servers on loopback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import NOETL_E2E
from payloads import check_payloads

PLAYBOOKS = NOETL_E2E / "playbooks"

pytestmark = pytest.mark.skipif(not PLAYBOOKS.is_dir(), reason="noetl-e2e fixtures not found")


def flowtide(
    *args: str, home: Path, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, FLOWTIDE_HOME=str(home), FLOWTIDE_NO_PROGRESS="1")
    return subprocess.run(
        [sys.executable, "-m", "flowtide.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
    )


def run_json(
    path: Path,
    home: Path,
    *extra: str,
    cwd: Path | None = None,
    expect: int = 0,
    timeout: float = 120,
) -> dict[str, Any]:
    proc = flowtide("run", str(path), "--json", *extra, home=home, cwd=cwd, timeout=timeout)
    assert proc.returncode == expect, (
        f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )
    doc = json.loads(proc.stdout)
    # Every payload the run wrote is what its event type's TypedDict says.
    check_payloads(events_of(doc["execution_id"], home))
    return doc


def events_of(execution_id: str, home: Path) -> list[dict[str, Any]]:
    proc = flowtide("events", execution_id, "--json", home=home)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module", params=["memory", "nats", "server", "shards"])
def mode(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """Every fixture runs four times, with the same assertions: embedded with loop state
    in this process; embedded with loop state in a real NATS JetStream bucket; on the
    distributed stack (PostgreSQL, nats-server, `flowtide server`, two `flowtide worker`
    processes) through `--server`; and on a cluster of two shards, started through shard
    1's server while the workers talk to shard 0's, so that every claim, report,
    credential and sub-playbook of theirs is forwarded. The variables returned are set
    for every command."""
    if request.param == "memory":
        yield {"FLOWTIDE_KV": "memory://"}
        return
    from kv.natsserver import NatsServer

    root = tmp_path_factory.mktemp(request.param)
    with NatsServer.start(root / "nats") as nats:
        if request.param == "nats":
            yield {"FLOWTIDE_KV": nats.url}
            return
        yield from _server_mode(request, root, nats.url, shards=request.param == "shards")


def _server_mode(
    request: pytest.FixtureRequest, root: Path, nats_url: str, *, shards: bool
) -> Iterator[dict[str, str]]:
    from cryptography.fernet import Fernet

    from distributed.stack import Stack, sharded
    from flowtide.dev.postgres import find_pg_bin

    if find_pg_bin() is None:
        pytest.skip("PostgreSQL server not installed")
    pg_server = request.getfixturevalue("pg_server")
    names = ["noetl_e2e", "noetl_e2e_s0", "noetl_e2e_s1"] if shards else ["noetl_e2e"]
    db, *shard_dbs = [pg_server.create_database(name) for name in names]
    key = Fernet.generate_key().decode()
    if shards:
        # `db` is the cluster database: credentials and the catalog go there.
        stacks = sharded(db, shard_dbs, nats=nats_url, root=root, kv=nats_url, master_key=key)
    else:
        stacks = [Stack(db=db, nats=nats_url, root=root, kv=nats_url, master_key=key)]
    stack = stacks[0]
    # The workers run in `root`, laid out like the e2e repository's root (fixtures/ in
    # it): a relative script path in a playbook resolves where the workers run, as in
    # NoETL, where the workers' image holds the scripts.
    (root / "fixtures").symlink_to(NOETL_E2E)
    # The link's target is outside `root`: the workers' file roots name it, or the script
    # files under it would be refused (flowtide.tools.files).
    roots = {"FLOWTIDE_FILE_ROOTS": os.pathsep.join([str(root), str(NOETL_E2E.resolve())])}
    try:
        for each in stacks:
            each.start_server()
        stack.start_worker(env=roots)
        stack.start_worker(env=roots)
        # Credentials and catalog entries go to the stack's database, sealed with the
        # server's key; runs, status and events go to its server (as its operator).
        yield {
            "FLOWTIDE_KV": nats_url,
            "FLOWTIDE_SERVER": stacks[-1].url,
            "FLOWTIDE_DB": db,
            "FLOWTIDE_MASTER_KEY": key,
            "FLOWTIDE_TOKEN": stack.tokens["operator"],
        }
    finally:
        for each in stacks:
            each.stop()
        for name in names:
            pg_server.drop_database(name)


@pytest.fixture(autouse=True)
def _mode_env(mode: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in mode.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / ".flowtide"


@pytest.fixture
def pg_home(home: Path, pg_server: Any) -> Path:
    body = json.dumps(pg_server.credential())
    for alias in ("pg_local", "pg_k8s"):
        proc = flowtide("credential", "set", alias, "--json", body, "--kind", "postgres", home=home)
        assert proc.returncode == 0, proc.stderr
    return home


def pg_rows(pg_server: Any, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(pg_server.dsn) as conn:
        return conn.execute(sql, params).fetchall()


def test_hello_world(home: Path) -> None:
    doc = run_json(PLAYBOOKS / "hello_world/hello_world.yaml", home)
    assert doc["status"] == "completed"
    assert doc["steps"]["test_step"]["result"] == {
        "status": "ok",
        "data": {"message": "Hello World"},
    }
    assert doc["error"] is None


def test_args_passing(home: Path) -> None:
    doc = run_json(PLAYBOOKS / "test_args_passing.yaml", home)
    assert doc["status"] == "completed"
    assert doc["steps"]["use_vars"]["result"] == {"status": "success", "result": 300}


def test_control_flow_workbook(home: Path) -> None:
    doc = run_json(PLAYBOOKS / "control_flow_workbook/control_flow_workbook.yaml", home)
    assert doc["status"] == "completed"
    steps = doc["steps"]
    assert steps["eval_flag"]["result"] == {"is_hot": True, "message": "hot"}
    for name in ("hot_path", "hot_task_a", "hot_task_b", "end"):
        assert steps[name]["status"] == "completed", name
    # the fan-in runs exactly once, after both parallel branches
    assert steps["end"]["runs"] == 1
    assert steps["cold_path"]["status"] == "skipped" and steps["cold_task"]["runs"] == 0


def test_control_flow_cold_path(home: Path) -> None:
    doc = run_json(
        PLAYBOOKS / "control_flow_workbook/control_flow_workbook.yaml",
        home,
        "--set",
        "temperature_c=10",
    )
    steps = doc["steps"]
    assert steps["eval_flag"]["result"]["is_hot"] is False
    assert steps["cold_task"]["result"] == {"who": "C"}
    assert steps["hot_path"]["runs"] == 0 and steps["end"]["runs"] == 1


def test_loop_instance_isolation(home: Path) -> None:
    doc = run_json(PLAYBOOKS / "test_loop_instance_isolation/playbook.yaml", home)
    assert doc["status"] == "completed"
    verify = doc["steps"]["verify_results"]["result"]
    assert verify["verification"] == "Both loops completed independently"
    users = doc["steps"]["process_items_users"]["result"]
    assert [r["name"] for r in users["results"]] == ["Alice", "Bob"]
    assert users["stats"] == {"total": 2, "success": 2, "failed": 0}
    assert [r["id"] for r in doc["steps"]["process_items_products"]["result"]["results"]] == [
        101,
        102,
    ]


def test_vars_transient(home: Path) -> None:
    doc = run_json(PLAYBOOKS / "vars_test/test_transient.yaml", home)
    assert doc["status"] == "completed"
    assert doc["steps"]["verify_updates"]["result"]["all_checks_passed"] is True


def test_duckdb(home: Path) -> None:
    doc = run_json(PLAYBOOKS / "duckdb_test.yaml", home)
    assert doc["status"] == "completed"
    assert doc["steps"]["start"]["result"] == [
        {"name": "Alice", "age": 30},
        {"name": "Charlie", "age": 35},
    ]
    assert doc["steps"]["verify"]["result"]["verified"] is True


def test_python_file_script(home: Path, tmp_path: Path) -> None:
    # The fixture's script path is relative to the e2e repository root, where the
    # playbooks live under fixtures/: recreate that layout and run from its root (on the
    # stack, the workers run in such a root too: `_server_mode`).
    root = tmp_path / "e2e-root"
    root.mkdir()
    (root / "fixtures").symlink_to(NOETL_E2E)
    doc = run_json(
        root / "fixtures/playbooks/script_execution/python_file_example.yaml", home, cwd=root
    )
    assert doc["status"] == "completed"
    result = doc["steps"]["verify_result"]["result"]
    assert result["status"] == "verified" and result["checks_passed"] == 4


def test_broken_playbook_is_rejected_before_anything_runs(home: Path) -> None:
    path = PLAYBOOKS / "broken_playbooks/should_error_tool_is_required.yaml"
    before = json.loads(flowtide("list", "--json", home=home).stdout or "[]")
    proc = flowtide("run", str(path), "--json", home=home)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "should_error_tool_is_required.yaml:" in proc.stderr
    assert "insert_report" in proc.stderr and "command" in proc.stderr
    listing = flowtide("list", "--json", home=home)
    assert json.loads(listing.stdout or "[]") == before
    val = flowtide("validate", str(path), home=home)
    assert val.returncode == 2 and "insert_report" in val.stderr


@pytest.mark.postgres
def test_playbook_composition(pg_home: Path, pg_server: Any) -> None:
    folder = PLAYBOOKS / "playbook_composition"
    reg = flowtide("catalog", "register", str(folder), home=pg_home)
    assert reg.returncode == 0, reg.stderr
    assert "fixtures/playbooks/playbook_composition/user_profile_scorer" in reg.stdout
    doc = run_json(folder / "playbook_composition.yaml", pg_home)
    assert doc["status"] == "completed", doc["error"]
    rows = pg_rows(
        pg_server,
        "SELECT user_name, profile_score, score_category FROM public.user_profile_results "
        "WHERE execution_id = %s ORDER BY user_name",
        doc["execution_id"],
    )
    assert rows == [
        ("Alice", 16.2, "Junior"),
        ("Bob", 16.7, "Junior"),
        ("Charlie", 15.6, "Junior"),
        ("Diana", 21.2, "Junior"),
    ]
    assert doc["steps"]["process_users"]["result"]["stats"] == {
        "total": 4,
        "success": 4,
        "failed": 0,
    }


@pytest.mark.postgres
def test_iterator_save(pg_home: Path, pg_server: Any) -> None:
    doc = run_json(PLAYBOOKS / "iterator_save_test/iterator_save_test.yaml", pg_home)
    assert doc["status"] == "completed", doc["error"]
    rows = pg_rows(
        pg_server,
        "SELECT item_name, item_value FROM public.iterator_save_test "
        "WHERE execution_id = %s ORDER BY item_name",
        doc["execution_id"],
    )
    assert rows == [("item1", 100), ("item2", 200), ("item3", 300)]


@pytest.mark.postgres
def test_postgres_jsonb(pg_home: Path, pg_server: Any) -> None:
    doc = run_json(
        PLAYBOOKS / "data_transfer/postgres_jsonb_test/postgres_jsonb_test.yaml", pg_home
    )
    assert doc["status"] == "completed", doc["error"]
    query = doc["steps"]["query_jsonb_data"]["result"]
    assert query["command_0"]["row_count"] == 3
    assert [r["name"] for r in query["command_0"]["rows"]] == [
        "Alice Johnson",
        "Bob Smith",
        "Carol Davis",
    ]
    assert query["command_0"]["rows"][0]["profile"]["preferences"]["theme"] == "dark"
    assert doc["steps"]["validate_and_cleanup"]["result"]["status"] == "completed"
    assert doc["steps"]["cleanup"]["runs"] == 0  # unreachable step tolerated, never run
    assert pg_rows(
        pg_server, "SELECT count(*) FROM public.postgres_jsonb_test WHERE user_id < 99"
    ) == [(3,)]


@pytest.mark.postgres
def test_http_to_postgres_iterator(pg_home: Path, pg_server: Any, posts_api: str) -> None:
    doc = run_json(
        PLAYBOOKS / "data_transfer/http_to_postgres_iterator/http_to_postgres_iterator.yaml",
        pg_home,
        "--set",
        f"api_url={posts_api}/posts",
    )
    assert doc["status"] == "completed", doc["error"]
    assert doc["steps"]["show_count"]["result"]["rows"] == [{"records": 100}]
    assert doc["steps"]["insert_posts"]["result"]["stats"] == {
        "total": 100,
        "success": 100,
        "failed": 0,
    }


@pytest.mark.postgres
def test_http_to_postgres_transfer(pg_home: Path, pg_server: Any, posts_api: str) -> None:
    doc = run_json(
        PLAYBOOKS / "data_transfer/http_to_postgres_transfer/http_to_postgres_transfer.yaml",
        pg_home,
        "--set",
        f"api_url={posts_api}/posts",
    )
    assert doc["status"] == "completed", doc["error"]
    transfer = doc["steps"]["transfer_http_to_pg"]["result"]
    assert transfer["direction"] == "http_to_postgres"
    assert transfer["rows_transferred"] == 100 and transfer["chunks_processed"] == 1
    assert doc["steps"]["show_count"]["result"]["rows"] == [{"records": 100}]
    rows = pg_rows(
        pg_server,
        "SELECT count(DISTINCT user_id), min(post_id), max(post_id) "
        "FROM public.http_to_postgres_transfer",
    )
    assert rows == [(10, 1, 100)]


def test_storage_tiers(home: Path) -> None:
    doc = run_json(PLAYBOOKS / "test_storage_tiers.yaml", home, timeout=300)
    assert doc["status"] == "completed", doc["error"]
    steps = doc["steps"]
    assert "_ref" not in steps["start"]["result"]
    for name, tier in (
        ("test_nats_kv", "kv"),
        ("test_disk", "disk"),
        ("test_large_storage", "disk"),
    ):
        result = steps[name]["result"]
        assert result["_store"] == tier and result["_ref"]["kind"] == "result_ref", name
        assert "items" not in result  # only the output_select fields stay in the event
    summary = steps["final_summary"]["result"]
    assert summary["test_result"] == "PASSED", summary
    assert summary["load_details"] == {
        "kv_loaded": True,
        "kv_count": 500,
        "disk_loaded": True,
        "disk_count": 2000,
        "large_loaded": True,
        "large_count": 5000,
    }


def test_output_select(home: Path) -> None:
    doc = run_json(PLAYBOOKS / "test_output_select.yaml", home)
    assert doc["status"] == "completed", doc["error"]
    start = doc["steps"]["start"]["result"]
    assert {k: start[k] for k in ("status", "count", "total_size")} == {
        "status": "success",
        "count": 1000,
        "total_size": 200000,
    }
    assert "items" not in start and start["_ref"]["store"] == "kv"
    assert doc["steps"]["process_full_data"]["result"]["total_items"] == 1000
    assert doc["steps"]["summary"]["result"]["test_result"] == "PASSED"


def test_pagination_max_iterations(home: Path, paginated_api: str) -> None:
    doc = run_json(
        PLAYBOOKS / "pagination/max_iterations/test_pagination_max_iterations.yaml",
        home,
        "--set",
        f"api_url={paginated_api}",
    )
    assert doc["status"] == "completed", doc["error"]
    assert doc["steps"]["validate_results"]["result"]["total_items"] == 20
    assert doc["steps"]["fetch_with_limit"]["runs"] == 2


def test_pagination_basic_overlaps(home: Path, paginated_api: str) -> None:
    # The fixture measures overlap by timing: one 4 s probe and four instant ones must be
    # in flight together. On a loaded machine the instant ones can all be claimed and done
    # before the slow one starts (max_active 1), so a serialized result gets one more try;
    # a runtime that really serializes fails both.
    for attempt in range(2):
        proc = flowtide(
            "run",
            str(PLAYBOOKS / "pagination/basic/test_pagination_basic.yaml"),
            "--json",
            "--set",
            f"api_url={paginated_api}",
            home=home,
        )
        serialized = "Detected serialized or blocking behavior" in proc.stdout
        if proc.returncode == 0 or not serialized or attempt == 1:
            break
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\n{proc.stderr}"
    doc = json.loads(proc.stdout)
    assert doc["status"] == "completed", doc["error"]
    result = doc["steps"]["validate_results"]["result"]
    assert result["max_active"] >= 2
    assert doc["steps"]["run_probes"]["result"]["stats"]["success"] == 5


def test_pipeline_error_handling(home: Path, paginated_api: str) -> None:
    doc = run_json(
        PLAYBOOKS / "pagination/pipeline/test_pipeline_error_handling.yaml",
        home,
        "--set",
        f"api_url={paginated_api}",
        expect=1,
    )
    assert doc["status"] == "failed"
    assert doc["error"]["step"] == "test_fail_auth"
    assert doc["error"]["kind"] == "auth"
    steps = doc["steps"]
    assert steps["test_retry_transient"]["result"]["status"] == "passed"
    assert steps["test_rate_limit"]["status"] == "completed"
    assert steps["test_skip_transform"]["result"]["status"] == "passed"
    assert steps["generate_report"]["runs"] == 0
    log = events_of(doc["execution_id"], home)
    calls = [
        (e["step"], e["payload"]["task"], e["type"], (e["error"] or {}))
        for e in log
        if e["type"] in ("call.done", "call.error")
    ]
    flaky = [
        (t, err.get("kind"), err.get("retryable"))
        for s, task, t, err in calls
        if task == "fetch_flaky"
    ]
    assert flaky[0] == ("call.error", "server_error", True) and flaky[-1][0] == "call.done"
    auth = [err for s, task, t, err in calls if task == "fetch_auth_error"]
    assert auth and auth[0]["kind"] == "auth" and auth[0]["http_status"] == 401
    assert not [c for c in calls if c[1] == "should_not_reach"]
    rate = [
        err.get("kind") for s, task, t, err in calls if s == "test_rate_limit" and t == "call.error"
    ]
    assert set(rate) <= {"rate_limit"}


@pytest.fixture
def demo_home(home: Path, pg_server: Any) -> Path:
    """`pg_k8s` (and `pg_local`) with NoETL's default login: user `demo`, password `demo`,
    on a database of its own."""
    import psycopg

    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = 'demo'").fetchone():
            conn.execute("CREATE ROLE demo LOGIN PASSWORD 'demo'")
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = 'demo_noetl'").fetchone():
            conn.execute("CREATE DATABASE demo_noetl OWNER demo TEMPLATE template0")
    body = json.dumps(
        {
            "host": pg_server.host,
            "port": pg_server.port,
            "user": "demo",
            "password": "demo",
            "database": "demo_noetl",
        }
    )
    for alias in ("pg_local", "pg_k8s"):
        proc = flowtide("credential", "set", alias, "--json", body, "--kind", "postgres", home=home)
        assert proc.returncode == 0, proc.stderr
        # `demo` is too short and too common to be masked inside other words: said once,
        # naming the credential, never the value.
        assert f"credential '{alias}'" in proc.stderr and "'password'" in proc.stderr
    return home


@pytest.mark.postgres
def test_pft_flow_with_the_default_demo_password(
    demo_home: Path, paginated_api: str, pg_server: Any
) -> None:
    # The README's smoke size of the fixture (1 facility, 100 patients, batches of 25).
    payload = {
        "api_url": paginated_api,
        "num_facilities": 1,
        "patients_per_facility": 100,
        "pft_batch_size": 25,
        "pft_batch_concurrency": 4,
    }
    doc = run_json(
        PLAYBOOKS / "pft_flow_test/test_pft_flow.yaml",
        demo_home,
        "--payload",
        json.dumps(payload),
    )
    # The password `demo` is in `demographics`, a data type the claim step returns and the
    # next HTTP request is built from: it must reach the request unchanged.
    assert doc["status"] == "completed", doc["error"]
    assert doc["steps"]["check_results"]["result"]["rows"][0]["status"] == "passed"
    assert doc["result"]["rows"] == [{"status": "completed", "check_status": "passed"}]
    batches = doc["steps"]["process_pft_action_batches"]["result"]
    assert batches["stats"]["failed"] == 0

    # The legacy MDS worker playbook of the same folder, on one slice of the work table
    # the flow above filled: its parallel loop fetches each assessment again and upserts
    # it (the slice's detail rows are deleted first, so the rows found are its own).
    import psycopg

    with psycopg.connect(pg_server.url("demo_noetl"), autocommit=True) as conn:
        ids = [
            i
            for (i,) in conn.execute(
                "SELECT assessment_id FROM public.pft_test_mds_assessment_ids_work "
                "WHERE facility_mapping_id = 1 ORDER BY assessment_id LIMIT 7"
            )
        ]
        assert len(ids) == 7
        conn.execute(
            "DELETE FROM public.pft_test_mds_assessment_details WHERE assessment_id = ANY(%s)",
            (ids,),
        )
    worker = run_json(
        PLAYBOOKS / "pft_flow_test/test_mds_batch_worker.yaml",
        demo_home,
        *("--set", f"api_url={paginated_api}", "--set", "facility_mapping_id=1"),
        *("--set", "batch_number=2", "--set", "offset=0", "--set", "batch_size=7"),
    )
    assert worker["status"] == "completed", worker["error"]
    assert worker["steps"]["normalize_batch"]["result"]["batch_count"] == 7
    assert worker["steps"]["fetch_mds_details"]["result"]["stats"] == {
        "total": 7,
        "success": 7,
        "failed": 0,
    }
    assert worker["result"] == {"status": "completed", "batch_number": 2, "offset": 0}
    with psycopg.connect(pg_server.url("demo_noetl")) as conn:
        saved = conn.execute(
            "SELECT count(*) FROM public.pft_test_mds_assessment_details "
            "WHERE assessment_id = ANY(%s) AND payload ? 'assessmentId'",
            (ids,),
        ).fetchall()
    assert saved == [(7,)]


@pytest.mark.postgres
def test_pft_page_continuation(pg_home: Path, paginated_api: str) -> None:
    # Its own size (10 patients x 4 data types): a cursor loop with `process: row` whose
    # tasks queue page n+1 while `paging.hasMore`; the fixture's last step checks that
    # every patient/data type reached its terminal page and no work is left open.
    doc = run_json(
        PLAYBOOKS / "pft_flow_test/test_pft_page_continuation.yaml",
        pg_home,
        "--set",
        f"api_url={paginated_api}",
    )
    assert doc["status"] == "completed", doc["error"]
    [verdict] = doc["steps"]["verify_pages"]["result"]["rows"]
    assert verdict["status"] == "passed" and verdict["complete_pairs"] == 40
    stats = doc["steps"]["fetch_pages"]["result"]["stats"]
    # One iteration per page fetched: more than the 40 first pages, none failed.
    assert stats["total"] == verdict["records_fetched"] > 40 and stats["failed"] == 0


@pytest.mark.postgres
def test_pft_flow_v2_then_queue_maintenance(
    pg_home: Path, paginated_api: str, pg_server: Any
) -> None:
    # v2's per-patient cursor frames at a small size (2 facilities x 5 patients; the
    # fixture's 10 x 1,000 is a load test), then the folder's operator playbook, which
    # connects with psycopg from python (`libs: {psycopg: psycopg}`) and tunes the queue
    # table v2 created.
    doc = run_json(
        PLAYBOOKS / "pft_flow_test/test_pft_flow_v2.yaml",
        pg_home,
        *("--set", f"api_url={paginated_api}"),
        *("--set", "num_facilities=2", "--set", "patients_per_facility=5"),
    )
    assert doc["status"] == "completed", doc["error"]
    [check] = doc["steps"]["check_results"]["result"]["rows"]
    assert check == {
        "status": "passed",
        "facilities_checked": 2,
        "patients_per_facility": 5,
        "all_data_types_complete": True,
        "mds_complete": True,
    }
    assert doc["steps"]["load_next_facility"]["runs"] == 3  # two facilities, then none
    cred = pg_server.credential()
    maintenance = run_json(
        PLAYBOOKS / "pft_flow_test/pft_queue_db_maintenance.yaml",
        pg_home,
        *("--set", f"pg_host={cred['host']}", "--set", f"pg_port={cred['port']}"),
        *("--set", f"pg_user={cred['user']}", "--set", f"pg_password={cred['password']}"),
        *("--set", f"pg_database={cred['database']}"),
    )
    assert maintenance["status"] == "completed", maintenance["error"]
    done = maintenance["result"]["maintenance"]
    assert done["index_present"] is True
    assert "fillfactor=80" in done["reloptions"]
    assert [op["name"] for op in done["operations"]] == [
        "create_reclaim_index",
        "set_table_storage",
        "vacuum_queue_table",
    ]


@pytest.fixture(scope="module")
def nats_for_tools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A nats-server (JetStream) the playbooks' `kind: nats` steps talk to, apart from
    the one the runtime may use for its own loop state."""
    from kv.natsserver import NatsServer

    with NatsServer.start(tmp_path_factory.mktemp("nats-tools")) as server:
        yield server.url


@pytest.mark.nats
def test_nats_kv(home: Path, nats_for_tools: str) -> None:
    body = json.dumps({"url": nats_for_tools})
    proc = flowtide(
        "credential", "set", "nats_credential", "--json", body, "--kind", "nats", home=home
    )
    assert proc.returncode == 0, proc.stderr
    doc = run_json(PLAYBOOKS / "test_nats_kv.yaml", home)
    assert doc["status"] == "completed", doc["error"]
    steps = doc["steps"]
    put = steps["kv_put"]["result"]
    assert put["status"] == "success" and put["revision"] >= 1
    assert (put["bucket"], put["key"]) == ("sessions", "test_session_123")
    got = steps["kv_get"]["result"]
    assert got["status"] == "success" and got["revision"] == put["revision"]
    assert got["value"] == {
        "session_token": "test_session_123",
        "user_id": 1,
        "email": "test@example.com",
        "display_name": "Test User",
        "expires_at": "2026-01-31T23:59:59Z",
        "is_active": True,
    }
    assert steps["kv_delete"]["result"] == {
        "status": "success",
        "bucket": "sessions",
        "key": "test_session_123",
    }
    assert steps["end"]["result"]["status"] == "complete"

    # The key is really gone from the server's bucket.
    async def read_back() -> bytes | None:
        import nats
        from nats.js.errors import KeyNotFoundError

        nc = await nats.connect(nats_for_tools)
        try:
            kv = await nc.jetstream().key_value("sessions")
            try:
                return (await kv.get("test_session_123")).value
            except KeyNotFoundError:
                return None
        finally:
            await nc.close()

    import asyncio

    assert asyncio.run(read_back()) is None


def test_pipeline_simple(home: Path, paginated_api: str) -> None:
    doc = run_json(
        PLAYBOOKS / "pagination/pipeline/test_pipeline_simple.yaml",
        home,
        "--set",
        f"api_url={paginated_api}",
    )
    assert doc["status"] == "completed", doc["error"]
    assert doc["steps"]["report_result"]["result"]["status"] == "passed"


@pytest.mark.postgres
def test_pagination_pipeline_execution_id_is_a_digit_string(
    pg_home: Path, pg_server: Any, paginated_api: str
) -> None:
    # The fixture's python tasks connect with psycopg2 themselves (`db_*` workload keys)
    # and its postgres steps use the alias `test_postgres`.
    body = json.dumps(pg_server.credential())
    proc = flowtide(
        "credential", "set", "test_postgres", "--json", body, "--kind", "postgres", home=pg_home
    )
    assert proc.returncode == 0, proc.stderr
    cred = pg_server.credential()
    doc = run_json(
        PLAYBOOKS / "pagination/pipeline/test_pagination_pipeline.yaml",
        pg_home,
        *("--set", f"api_url={paginated_api}", "--set", f"db_host={cred['host']}"),
        *("--set", f"db_port={cred['port']}", "--set", f"db_name={cred['database']}"),
        *("--set", f"db_user={cred['user']}", "--set", f"db_password={cred['password']}"),
    )
    assert doc["status"] == "completed", doc["error"]
    # `'batch_id': execution_id[:8]` in the transform task: the digit string's first 8.
    rows = pg_rows(
        pg_server,
        "SELECT count(*), count(DISTINCT page_number), min(batch_id), max(batch_id) "
        "FROM pagination_test_results",
    )
    assert rows == [(35, 4, doc["execution_id"][:8], doc["execution_id"][:8])]
    assert doc["steps"]["check_pagination"]["runs"] == 4
    # final_report's own check reads `validate_results` as a bare list of rows, the shape
    # NoETL's postgres `query:` no longer returns ({rows, row_count}: the comment in
    # pft_flow_test/test_mds_batch_worker.yaml); it ran, and counted from that shape.
    assert doc["steps"]["final_report"]["status"] == "completed"
    assert doc["steps"]["validate_results"]["result"]["rows"][0]["total_records"] == 35


def test_pipeline_heavy_payload_policy_set_reads_the_steps_own_result(
    home: Path, paginated_api: str
) -> None:
    doc = run_json(
        PLAYBOOKS / "pagination/pipeline/test_pipeline_heavy_payload.yaml",
        home,
        "--set",
        f"api_url={paginated_api}",
    )
    assert doc["status"] == "completed", doc["error"]
    summary = doc["steps"]["final_report"]["result"]["summary"]
    # update_progress's rule sets ctx.total_bytes_processed from update_progress's own
    # result on each of the 3 pages (5 items of 50 KB each).
    assert summary["pages_processed"] == 3
    assert summary["total_data_processed_kb"] == 3 * 5 * 50
    assert doc["steps"]["fetch_heavy_page"]["runs"] == 3


@pytest.mark.postgres
def test_frame_heartbeat_regression_task_sees_the_previous_output(
    pg_home: Path, pg_server: Any, paginated_api: str
) -> None:
    # Short delays: the HTTP call takes 2 s (not 150) and the fixture's own check wants
    # the delay above its frame lease, so the lease is 1 s; flowtide's command lease
    # (the worker's) is far longer, so nothing is abandoned.
    proc = flowtide(
        "run",
        str(
            PLAYBOOKS / "batch_execution/frame_heartbeat_regression/frame_heartbeat_regression.yaml"
        ),
        "--json",
        *("--set", f"api_url={paginated_api}", "--set", "response_delay_seconds=2"),
        *("--set", "frame_lease_seconds=1", "--set", "frame_heartbeat_seconds=1"),
        home=pg_home,
    )
    doc = json.loads(proc.stdout)
    steps = doc["steps"]
    assert steps["run_slow_frame_cursor"]["status"] == "completed", doc["error"]
    assert steps["run_slow_frame_cursor"]["result"]["stats"] == {
        "total": 1,
        "success": 1,
        "failed": 0,
    }
    # mark_done wrote `{{ output.data | tojson }}`: the slow HTTP task's result before it.
    [(status, response)] = pg_rows(
        pg_server,
        "SELECT status, response FROM public.frame_heartbeat_regression_work "
        "WHERE execution_id = %s",
        doc["execution_id"],
    )
    assert status == "done"
    assert response["status_code"] == 200
    assert response["data"]["label"] == "frame-heartbeat-regression"
    assert response["data"]["delay_seconds"] == 2.0
    # The fixture then reads NoETL's own runtime tables (noetl.frame, noetl.stage,
    # noetl.event) to count frame heartbeats: flowtide has no such tables, so the run
    # stops there, and only there.
    assert proc.returncode == 1 and doc["status"] == "failed"
    assert doc["error"]["step"] == "verify_frame_committed"
    assert 'relation "noetl.frame" does not exist' in doc["error"]["message"]


@pytest.mark.postgres
def test_postgres_file_script(pg_home: Path, tmp_path: Path) -> None:
    # `script: {uri, source: {type: file}}` instead of `command:`; the uri is relative to
    # the e2e repository root, as python_file_example's is (`test_python_file_script`).
    root = tmp_path / "e2e-root"
    root.mkdir()
    (root / "fixtures").symlink_to(NOETL_E2E)
    doc = run_json(
        root / "fixtures/playbooks/script_execution/postgres_file_example.yaml", pg_home, cwd=root
    )
    assert doc["status"] == "completed", doc["error"]
    rows = doc["steps"]["verify_records"]["result"]["rows"]
    assert [r["source"] for r in rows] == ["file", "file", "file"]
    assert doc["steps"]["run_postgres_from_file"]["result"]["rows"] == [
        {"total_records": 3, "script_source": "file"}
    ]


@pytest.mark.postgres
def test_postgres_missing_script_file_names_file_step_and_field(pg_home: Path) -> None:
    doc = run_json(
        PLAYBOOKS / "script_execution/postgres_file_example.yaml",
        pg_home,
        "--set",
        "script_path=scripts/no_such.sql",
        expect=1,
    )
    error = doc["error"]
    assert error["step"] == "run_postgres_from_file"
    assert "field 'script.uri'" in error["message"] and "scripts/no_such.sql" in error["message"]


OWN_PLAYBOOKS = Path(__file__).resolve().parent / "playbooks"


def test_vars_block_policy_set_reads_output_response(home: Path) -> None:
    # NoETL's regression config expects vars_test/test_vars_block to complete; the
    # fixture is not in ../shared, this is our own playbook for its rule.
    doc = run_json(OWN_PLAYBOOKS / "vars_block.yaml", home)
    assert doc["status"] == "completed", doc["error"]
    assert doc["steps"]["check"]["result"] == {
        "first_email": "ada@example.com",
        "all_checks_passed": True,
    }


def test_an_unused_workbook_playbook_without_path_is_not_an_error(home: Path) -> None:
    path = OWN_PLAYBOOKS / "unused_workbook_playbook.yaml"
    val = flowtide("validate", str(path), home=home)
    assert val.returncode == 0, val.stderr
    doc = run_json(path, home)
    assert doc["status"] == "completed", doc["error"]
    assert doc["steps"]["start"]["result"] == {"doubled": 42}
