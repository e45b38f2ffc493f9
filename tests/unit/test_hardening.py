"""A worker is not dumpable (issue 31: a python step read the worker's token, NATS
password and client key from /proc/<parent pid>/environ). Shown as a user other than
root (root reads everything): the parent runs as `nobody`, its child too."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flowtide.tools.python_interpreter import reachable_by_others

SRC = str(Path(__file__).resolve().parents[2] / "src")

PARENT = """\
import json, os, subprocess, sys
sys.path[:0] = json.loads(sys.argv[1])
if sys.argv[2] == "protect":
    from flowtide.hardening import keep_to_ourselves
    assert keep_to_ourselves()
probe = (
    "import os\\n"
    "for name in ('environ', 'mem'):\\n"
    "    try:\\n"
    "        with open(f'/proc/{os.getppid()}/{name}', 'rb') as f:\\n"
    "            data = f.read(4096)\\n"
    "        print(name, 'read', b'FT_WORKER_SECRET' in data)\\n"
    "    except OSError as exc:\\n"
    "        print(name, 'refused', type(exc).__name__)\\n"
)
out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
print(out.stdout, end="")
"""


def _interpreter() -> str | None:
    """A python that `nobody` can run (this one, or the system's of the same version)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        if os.path.exists(candidate) and reachable_by_others(candidate, execute=True):
            return candidate
    return None


def _run(mode: str) -> str:
    python = _interpreter()
    if python is None or shutil.which("setpriv") is None:
        pytest.skip("needs setpriv and a python that nobody can run")
    command = [python, "-I", "-c", PARENT, json.dumps([SRC]), mode]
    if os.geteuid() == 0:
        command = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *command]
    env = {"PATH": "/usr/bin:/bin", "FT_WORKER_SECRET": "s3cret"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_child_of_the_same_user_reads_an_unprotected_parent() -> None:
    # The attack as the probe ran it: the parent's environment is there to read.
    assert "environ read True" in _run("open")


def test_a_child_cannot_read_a_protected_parent() -> None:
    out = _run("protect")
    assert "environ refused PermissionError" in out, out
    assert "mem refused" in out, out
