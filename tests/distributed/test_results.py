"""Playbooks on the distributed stack give the same documents as embedded runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .stack import Stack, flowtide_env

PLAYBOOKS = Path(__file__).resolve().parents[1] / "cli" / "playbooks"
REPO = Path(__file__).resolve().parents[2]


def _embedded(root: Path, *args: object) -> dict:  # type: ignore[type-arg]
    proc = subprocess.run(
        [sys.executable, "-m", "flowtide.cli", "run", *map(str, args), "--json"],
        capture_output=True,
        text=True,
        env=flowtide_env(root / "embedded"),
        cwd=root,
        timeout=120,
    )
    assert proc.stdout, proc.stderr
    return dict(json.loads(proc.stdout))


def _distributed(stack: Stack, *args: object) -> dict:  # type: ignore[type-arg]
    proc = stack.run("run", *args, "--json")
    assert proc.stdout, proc.stderr + stack.log("server") + stack.log("worker0")
    return dict(json.loads(proc.stdout))


@pytest.mark.parametrize(
    ("playbook", "extra"),
    [
        (PLAYBOOKS / "basic.yaml", ()),
        (PLAYBOOKS / "fan_in.yaml", ()),
        (PLAYBOOKS / "failing.yaml", ()),
        # A worker's iteration sees the loop's size (`loop.length`, `iter._last`).
        (PLAYBOOKS / "runtime_names.yaml", ()),
        (PLAYBOOKS / "parallel_big.yaml", ("--set", "count=300")),
        (REPO / "examples" / "quickstart.yaml", ()),
    ],
    ids=lambda p: getattr(p, "stem", "-"),
)
def test_same_document_as_embedded(stack: Stack, playbook: Path, extra: tuple[str, ...]) -> None:
    remote = _distributed(stack, playbook, *extra)
    local = _embedded(stack.root, playbook, *extra)
    remote.pop("execution_id")
    local.pop("execution_id")
    # A python error's traceback names the playbook's file where the runner knows it:
    # embedded the file, on a server (an inline playbook) "playbook"; the lines agree.
    text = json.dumps(local)
    for shown in (f"({playbook.name}:", f'File \\"{playbook.name}\\"'):
        text = text.replace(shown, shown.replace(playbook.name, "playbook"))
    assert remote == json.loads(text)
