"""A schedule's own `notify:` adds to its runs' playbook targets: a run the schedule
starts notifies them, a run of the same playbook started by hand does not; a bad entry
is refused when the schedule is added, naming it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stubs"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))

from notify_target import notify_target  # noqa: E402
from stack import flowtide_env  # noqa: E402

PLAYBOOK = """\
metadata: {name: quiet, path: tests/notify/quiet}
workflow:
  - step: start
    tool: {kind: noop}
"""

ENV = {"FLOWTIDE_NOTIFY_ALLOW_HOSTS": "127.0.0.1", "FLOWTIDE_NOTIFY_EXIT_WAIT": "20"}


def _flowtide(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flowtide.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env={**flowtide_env(tmp_path / "home"), **ENV},
        cwd=tmp_path,
        timeout=120,
    )


def test_a_schedules_notify_reaches_its_runs_only(tmp_path: Path) -> None:
    (tmp_path / "quiet.yaml").write_text(PLAYBOOK)
    assert _flowtide(tmp_path, "catalog", "register", "quiet.yaml").returncode == 0
    with notify_target() as target:
        schedule = f"""\
kind: Schedule
metadata: {{name: told}}
spec:
  playbook: tests/notify/quiet
  every: 1h
  notify:
    - on: [completed]
      webhook: {{url: "{target.url}/done"}}
"""
        (tmp_path / "told.yaml").write_text(schedule)
        added = _flowtide(tmp_path, "catalog", "register", "told.yaml")
        assert added.returncode == 0, added.stderr
        by_schedule = _flowtide(tmp_path, "schedule", "trigger", "told")
        assert by_schedule.returncode == 0, by_schedule.stderr
        by_hand = _flowtide(tmp_path, "run", "tests/notify/quiet")
        assert by_hand.returncode == 0, by_hand.stderr
    (post,) = target.bodies()
    assert post["transition"] == "completed"
    assert post["playbook"]["path"] == "tests/notify/quiet"


def test_a_bad_notify_entry_is_refused_when_the_schedule_is_added(tmp_path: Path) -> None:
    (tmp_path / "quiet.yaml").write_text(PLAYBOOK)
    assert _flowtide(tmp_path, "catalog", "register", "quiet.yaml").returncode == 0
    (tmp_path / "bad.yaml").write_text(
        "kind: Schedule\nmetadata: {name: bad}\nspec:\n  playbook: tests/notify/quiet\n"
        "  every: 1h\n  notify: [{on: [exploded], webhook: {url: 'https://x.example'}}]\n"
    )
    proc = _flowtide(tmp_path, "catalog", "register", "bad.yaml")
    assert proc.returncode == 2, proc.stderr
    assert "notify" in proc.stderr and "exploded" in proc.stderr
    assert "bad" not in _flowtide(tmp_path, "schedule", "list").stdout
