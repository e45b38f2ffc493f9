"""`flowtide schedule ...` and `flowtide scheduler` on the local store, as a user runs
them: schedules added from flags or `kind: Schedule` documents, listed with their next
fire times, fired by a long-running process (runs that say which slot started them),
paused, triggered by hand, backfilled once."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

from .helpers import Flowtide, describe, local_ui, wait_until

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: tick, path: tests/tick}
workload: {slot: none}
workflow:
  - step: start
    tool: {kind: python, input: {slot: "{{ slot }}"}, code: "result = {'slot': slot}"}
"""

SCHEDULE = """\
apiVersion: noetl.io/v2
kind: Schedule
metadata: {name: hourly, description: the hourly tick}
spec:
  playbook: tests/tick
  cron: "0 * * * *"
  timezone: Europe/Berlin
  workload: {slot: "{{ schedule.time }}"}
"""


def _register(ft: Flowtide, tmp_path: Path) -> Path:
    playbook = tmp_path / "tick.yaml"
    playbook.write_text(PLAYBOOK)
    ft.ok("catalog", "register", playbook)
    return playbook


def test_add_list_show_pause_resume_delete(ft: Flowtide, tmp_path: Path) -> None:
    _register(ft, tmp_path)
    added = ft.json(
        "schedule",
        "add",
        "tick",
        "tests/tick",
        "--every",
        "15m",
        "--set",
        "slot={{ schedule.slot }}",
    )
    assert added["when"] == "every 15m" or added["when"].startswith("every 15m")
    assert len(added["next"]) == 5 and all(t % 900 == 0 for t in added["next"])
    (item,) = ft.json("schedule", "list")
    assert (item["name"], item["playbook"], item["overlap"], item["paused"]) == (
        "tick",
        "tests/tick",
        "skip",
        False,
    )
    listed = ft.ok("schedule", "list").stdout
    assert "tick" in listed and "every 15m" in listed
    shown = ft.ok("schedule", "show", "tick").stdout
    assert "every 15m" in shown and "next" in shown
    # The same name twice is refused unless replaced.
    again = ft("schedule", "add", "tick", "tests/tick", "--every", "1h")
    assert again.returncode == 2 and "exists" in again.stderr, describe(again)
    ft.ok("schedule", "add", "tick", "tests/tick", "--every", "1h", "--replace")
    ft.ok("schedule", "pause", "tick")
    assert ft.json("schedule", "show", "tick")["paused"] is True
    assert ft.json("schedule", "show", "tick")["next"] == []
    ft.ok("schedule", "resume", "tick")
    assert ft.json("schedule", "show", "tick")["paused"] is False
    ft.ok("schedule", "delete", "tick")
    assert ft.json("schedule", "list") == []
    gone = ft("schedule", "show", "tick")
    assert gone.returncode == 2 and "no schedule named 'tick'" in gone.stderr


def test_bad_input_is_refused_with_the_field(ft: Flowtide, tmp_path: Path) -> None:
    _register(ft, tmp_path)
    cases = {
        ("--cron", "61 * * * *"): "cron",
        ("--cron", "0 * * * *", "--timezone", "Europe/Berln"): "Europe/Berln",
        ("--every", "soon"): "every",
        ("--every", "1m", "--overlap", "sometimes"): "overlap",
        (): "cron",
    }
    for flags, named in cases.items():
        proc = ft("schedule", "add", "bad", "tests/tick", *flags)
        assert proc.returncode == 2, describe(proc)
        assert named in proc.stderr, describe(proc)
    missing = ft("schedule", "add", "bad", "tests/nowhere", "--every", "1m")
    assert missing.returncode == 2 and "tests/nowhere" in missing.stderr
    assert ft.json("schedule", "list") == []


def test_schedule_documents_register_beside_playbooks(ft: Flowtide, tmp_path: Path) -> None:
    folder = tmp_path / "defs"
    folder.mkdir()
    (folder / "tick.yaml").write_text(PLAYBOOK)
    (folder / "hourly.yaml").write_text(SCHEDULE)
    out = ft.ok("catalog", "register", folder).stdout
    assert "tests/tick v1" in out and "schedule hourly" in out
    doc = ft.json("schedule", "show", "hourly")
    assert (doc["cron"], doc["timezone"], doc["description"]) == (
        "0 * * * *",
        "Europe/Berlin",
        "the hourly tick",
    )
    # A typo is an error naming the file, line and field.
    (folder / "hourly.yaml").write_text(SCHEDULE.replace("timezone:", "timezon:"))
    bad = ft("catalog", "register", folder / "hourly.yaml")
    assert bad.returncode == 2, describe(bad)
    assert "hourly.yaml:7" in bad.stderr and "timezon" in bad.stderr, describe(bad)


def test_trigger_runs_now_and_the_run_says_so(ft: Flowtide, tmp_path: Path) -> None:
    _register(ft, tmp_path)
    ft.ok(
        "schedule",
        "add",
        "tick",
        "tests/tick",
        "--every",
        "1h",
        "--set",
        "slot={{ schedule.slot }}",
    )
    doc = ft.json("schedule", "trigger", "tick")
    assert doc["status"] == "completed"
    assert doc["result"]["slot"].startswith("manual-"), doc
    (item,) = ft.json("list", "--trigger", "schedule:tick")
    assert item["trigger"]["kind"] == "schedule" and item["trigger"]["name"] == "tick"
    assert ft.json("list", "--trigger", "hook") == []
    assert "(schedule tick manual-" in ft.ok("list").stdout


def test_backfill_runs_every_slot_once(ft: Flowtide, tmp_path: Path) -> None:
    _register(ft, tmp_path)
    ft.ok(
        "schedule",
        "add",
        "tick",
        "tests/tick",
        "--every",
        "1h",
        "--overlap",
        "allow",
        "--set",
        "slot={{ schedule.slot }}",
    )
    window = ("--from", "2026-01-01T00:00:00Z", "--to", "2026-01-01T05:00:00Z")
    first = ft.json("schedule", "backfill", "tick", *window)
    assert sorted(first["started"]) == [f"2026-01-01T0{h}:00:00Z" for h in range(6)]
    second = ft.json("schedule", "backfill", "tick", *window)
    assert second["started"] == {} and len(second["already"]) == 6
    runs = ft.json("list", "--trigger", "schedule:tick")
    assert len(runs) == 6 and {r["status"] for r in runs} == {"completed"}


def test_the_scheduler_fires_every_slot_and_pause_stops_it(ft: Flowtide, tmp_path: Path) -> None:
    _register(ft, tmp_path)
    ft.ok(
        "schedule",
        "add",
        "tick",
        "tests/tick",
        "--every",
        "2s",
        "--set",
        "slot={{ schedule.slot }}",
    )
    log = tmp_path / "scheduler.out"
    with open(log, "wb") as sink:
        proc = ft.popen("scheduler", stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_until(
            lambda: "firing due slots" in log.read_text(), timeout=30, what="start", proc=proc
        )
        began = time.time()
        time.sleep(10)
        ft.ok("schedule", "pause", "tick")
        paused_at = time.time()
        time.sleep(3)
        runs = ft.json("list", "--trigger", "schedule:tick")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    stamps = sorted(_stamp(r["trigger"]["slot"]) for r in runs)
    # One run per 2 s slot, none missing, none twice, none after the pause.
    assert stamps == [stamps[0] + 2 * i for i in range(len(stamps))], stamps
    assert len(stamps) >= (paused_at - began) // 2 - 1, (stamps, log.read_text())
    assert stamps[-1] <= paused_at + 2.0
    assert all(r["created"] <= paused_at + 2.0 for r in runs)
    assert "stopped" in log.read_text()


def _stamp(slot: str) -> float:
    import datetime

    return datetime.datetime.fromisoformat(slot.replace("Z", "+00:00")).timestamp()


def test_flowtide_ui_fires_schedules_too(ft: Flowtide, tmp_path: Path) -> None:
    _register(ft, tmp_path)
    ft.ok("schedule", "add", "tick", "tests/tick", "--every", "1s")
    with local_ui(ft, tmp_path / "ui.out") as ui:
        assert "firing its 1 schedule" in (tmp_path / "ui.out").read_text()
        wait_until(
            lambda: len(ui.get("/api/executions", params={"trigger": "schedule"})["items"]) >= 2,
            timeout=20,
            what="two scheduled runs",
        )
        doc = ui.get("/api/schedules/tick")
        assert doc["firings"] and doc["firings"][0]["status"] == "started"
    assert json.loads(ft.ok("schedule", "list", "--json").stdout)[0]["name"] == "tick"


def test_the_scheduler_with_a_port_takes_signed_webhook_deliveries(
    ft: Flowtide, tmp_path: Path
) -> None:
    import re

    import httpx

    from flowtide.triggers.hooks import sign

    _register(ft, tmp_path)
    secret = tmp_path / "hook.secret"
    secret.write_text("scheduler-hook-secret-1234\n")
    secret.chmod(0o600)
    ft.ok("hook", "add", "ping", "tests/tick", "--secret-file", secret)
    log = tmp_path / "scheduler.out"
    with open(log, "wb") as sink:
        proc = ft.popen("scheduler", "--port", "0", stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "open http" in log.read_text(), timeout=30, what="listening", proc=proc)
        assert log.read_text().startswith("flowtide scheduler:")
        base = re.search(r"open (http://\S+)/ui#", log.read_text())[1]  # type: ignore[index]
        body = b'{"slot": "from-a-hook"}'
        headers = {
            "content-type": "application/json",
            "x-flowtide-signature": sign(b"scheduler-hook-secret-1234", body),
        }
        bad = httpx.post(
            f"{base}/api/hooks/ping", content=body, headers={"x-flowtide-signature": "sha256=00"}
        )
        assert bad.status_code == 401
        good = httpx.post(f"{base}/api/hooks/ping", content=body, headers=headers)
        assert good.status_code == 202, good.text
        execution_id = good.json()["execution_id"]
        wait_until(
            lambda: ft.json("status", execution_id)["status"] != "running",
            timeout=30,
            what="the hook's run",
        )
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    (run,) = ft.json("list", "--trigger", "hook:ping")
    assert run["status"] == "completed"


def test_the_nightly_example_registers_and_runs(ft: Flowtide) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "nightly"
    out = ft.ok("catalog", "register", example).stdout
    assert "examples/nightly v1" in out and "schedule nightly" in out
    doc = ft.json("schedule", "show", "nightly")
    assert (doc["cron"], doc["timezone"], doc["catchup"], doc["jitter"]) == (
        "0 2 * * *",
        "Europe/Berlin",
        21600.0,
        30.0,
    )
    run = ft.json("schedule", "trigger", "nightly")
    assert run["status"] == "completed", run
    day = run["steps"]["start"]["result"]["day"]
    assert len(day) == 10 and day[4] == "-"  # the slot's date in Berlin
