"""examples/plugin, installed as a user installs it (pip, from its pyproject.toml), into a
scratch directory put on PYTHONPATH: `flowtide validate` and `flowtide run` find
`kind: upper` through its `flowtide.tools` entry point, and the plugin's own tests pass.

Without hatchling in this environment pip fetches it from the package index to build
the plugin; `make test` installs it with the dev extra, so nothing is fetched there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import flowtide

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "examples" / "plugin"
SOURCE = Path(flowtide.__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the plugin is installed."""
    target = tmp_path_factory.mktemp("plugin-site")
    isolation = [] if importlib.util.find_spec("hatchling") is None else ["--no-build-isolation"]
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", *isolation]
        + ["--target", str(target), str(PLUGIN)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return target


def environment(home: Path, *paths: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWTIDE_")}
    env |= {"FLOWTIDE_HOME": str(home), "FLOWTIDE_NO_PROGRESS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(map(str, [*paths, SOURCE]))
    return env


def flowtide_cli(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flowtide.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
    )


def test_validate_and_run_find_the_plugin_kind(site: Path, tmp_path: Path) -> None:
    env = environment(tmp_path / "home", site)
    checked = flowtide_cli(env, tmp_path, "validate", str(PLUGIN / "upper.yaml"))
    assert checked.returncode == 0, checked.stderr
    assert "ok (2 steps, entry 'start')" in checked.stdout
    ran = flowtide_cli(env, tmp_path, "run", str(PLUGIN / "upper.yaml"), "--json")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["result"] == {"text": "Hello World Hello World", "length": 23}


def test_validate_reports_plugin_fields_and_missing_plugins(site: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "workflow:\n"
        "  - step: start\n"
        "    tool: {kind: upper, text: hi, case: shout}\n"
        "    next: [{step: load}]\n"
        "  - step: load\n"
        "    tool: {kind: snowflake, command: select 1}\n",
        encoding="utf-8",
    )
    proc = flowtide_cli(environment(tmp_path / "home", site), tmp_path, "validate", str(bad))
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"{bad}:3:35: step 'start', field 'tool.case': unsupported case 'shout' "
        "(expected upper | lower | title)",
        f"{bad}:6:12: step 'load', field 'tool.kind': kind 'snowflake' needs a plugin (pip "
        "install a package that provides the flowtide.tools entry point 'snowflake') "
        "(expected python | http | postgres | duckdb | spark | playbook | workbook | noop | "
        "nats | shell | script | transfer | artifact | upper)",
    ]


def test_without_the_plugin_its_kind_is_unknown(tmp_path: Path) -> None:
    proc = flowtide_cli(
        environment(tmp_path / "home"), tmp_path, "validate", str(PLUGIN / "upper.yaml")
    )
    assert proc.returncode == 2
    assert "field 'tool.kind': unknown tool kind 'upper'" in proc.stderr


def test_the_plugin_s_own_tests_pass(site: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(PLUGIN / "tests")],
        capture_output=True,
        text=True,
        env=environment(tmp_path / "home", site),
        cwd=PLUGIN,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " passed" in proc.stdout


def test_a_subscription_with_the_plugin_source_starts_one_run_per_line(
    site: Path, tmp_path: Path
) -> None:
    import signal
    import sqlite3
    import time

    env = environment(tmp_path / "home", site)
    playbook = tmp_path / "line.yaml"
    playbook.write_text(
        "workload: {line: none}\nworkflow:\n  - step: start\n    tool: {kind: noop}\n"
    )
    lines = tmp_path / "in.txt"
    lines.write_text("one\ntwo\n")
    added = flowtide_cli(
        env, tmp_path, "subscription", "add", "lines", str(playbook), "--source", "lines",
        "--config", f"path={lines}", "--set", "line={{ message.data }}",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr

    def runs() -> list[str]:
        db = sqlite3.connect(tmp_path / "home" / "flowtide.db", timeout=30)
        try:
            rows = db.execute(
                "SELECT workload FROM execution WHERE trigger_name = 'lines'"
            ).fetchall()
        finally:
            db.close()
        return sorted(json.loads(w)["line"] for (w,) in rows)

    def until(count: int) -> None:
        deadline = time.monotonic() + 30
        while len(runs()) < count and time.monotonic() < deadline:
            time.sleep(0.1)

    for round_ in range(2):  # a second process reads the file from the top again
        proc = subprocess.Popen(
            [sys.executable, "-m", "flowtide.cli", "scheduler"],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            if round_ == 0:
                until(2)
                with lines.open("a") as f:
                    f.write("three\n")
            until(3)
            time.sleep(1.5)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
    assert runs() == ["one", "three", "two"]
