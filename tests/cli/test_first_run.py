"""What a newcomer's first commands print: the shipped examples validate with no warning
(--strict), a run's result off a terminal is JSON on stdout, and --version answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import flowtide

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOKS = sorted(
    p
    for p in (ROOT / "examples").rglob("*.yaml")
    if "kind: Schedule" not in p.read_text() and "plugin" not in p.parts
)


def _flowtide(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flowtide.cli", *args],
        cwd=cwd,
        env={**os.environ, "FLOWTIDE_HOME": str(cwd / "home"), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("playbook", PLAYBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_validates_strict(playbook: Path, tmp_path: Path) -> None:
    done = _flowtide("validate", str(playbook), "--strict", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr


def test_quickstart_piped_prints_its_result_as_json(tmp_path: Path) -> None:
    done = _flowtide("run", str(ROOT / "examples" / "quickstart.yaml"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)  # stdout holds the result alone
    assert result["orders"] == 100 and result["priced"] == 100
    assert {r["region"] for r in result["by_region"]} == {"north", "south", "east", "west"}
    assert "completed" in done.stderr and "warning" not in done.stderr


def test_version(tmp_path: Path) -> None:
    done = _flowtide("--version", cwd=tmp_path)
    assert done.returncode == 0
    assert done.stdout.startswith(f"flowtide {flowtide.__version__} (Python ")
