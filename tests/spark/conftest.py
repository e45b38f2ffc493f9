"""Spark tests: real Spark from the pip pyspark distribution (Java from the project's
setup, scripts/ensure-spark.sh). In-process tests share the one local session the
process holds, as a worker would; tests of other masters run `flowtide` in a subprocess.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from textwrap import dedent
from typing import Any

import pytest

from flowtide.credentials import CredentialVault
from flowtide.documents.execution import intact as execution_document
from flowtide.playbook.loader import parse_playbook
from flowtide.runtime.local import LocalRuntime
from flowtide.store.sqlite import SQLiteStore

HEADER = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: spark_test, path: tests/spark_test}
"""


#: A spark loop of 600 items, one of which kills its python worker (os._exit) the first
#: time it runs: Spark must run its task again. `workload.marks` is a folder where each
#: item leaves a dot each time it runs (and `died` once it killed its worker).
KILLED_LOOP = HEADER + (
    "workload: {marks: ''}\n"
    "workflow:\n"
    "  - step: work\n"
    '    loop: {in: "{{ range(600) | list }}", iterator: x, spec: {mode: spark, partitions: 3}}\n'
    "    tool:\n"
    "      kind: python\n"
    "      input: {x: '{{ iter.x }}', marks: '{{ workload.marks }}'}\n"
    "      code: |\n"
    "        import os\n"
    "        open(os.path.join(marks, str(x)), 'a').write('.')\n"
    "        if x == 300 and not os.path.exists(os.path.join(marks, 'died')):\n"
    "            open(os.path.join(marks, 'died'), 'w').close()\n"
    "            os._exit(1)\n"
    "        result = x * x\n"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if shutil.which("java") is None:
        # Not a skip: CI must run these. scripts/ensure-spark.sh (make test) installs Java.
        raise pytest.UsageError("Spark tests need Java: run scripts/ensure-spark.sh")


@dataclass
class Result:
    doc: dict[str, Any]
    events: list[dict[str, Any]]
    home: Path

    def step(self, name: str) -> dict[str, Any]:
        return dict(self.doc["steps"][name])

    def calls(self, step: str) -> list[dict[str, Any]]:
        return [
            e for e in self.events if e["type"] in ("call.done", "call.error") and e["step"] == step
        ]

    def dumped(self) -> str:
        return json.dumps(self.events) + json.dumps(self.doc)


Runner = Callable[..., Result]


@pytest.fixture
def run_playbook(tmp_path: Path) -> Runner:
    """Run a playbook (YAML body after the header) in this process, embedded."""

    def run(
        body: str,
        *,
        workload: Mapping[str, Any] | None = None,
        credentials: Mapping[str, Mapping[str, Any]] | None = None,
        cancel_when: Callable[[], bool] | None = None,
        timeout: float = 300,
    ) -> Result:
        home = tmp_path / ".flowtide"
        file = tmp_path / "pb.yaml"
        text = HEADER + dedent(body)
        file.write_text(text)
        playbook = parse_playbook(text, str(file))
        store = SQLiteStore(home / "flowtide.db")
        vault = CredentialVault(store, home)
        for name, cred in (credentials or {}).items():
            vault.set(name, dict(cred), kind="postgres")

        async def main() -> dict[str, Any]:
            async with LocalRuntime(store, credentials=vault, data_dir=home / "data") as rt:
                eid = await rt.start(playbook, workload=dict(workload or {}))
                if cancel_when is not None:
                    while not cancel_when():
                        await asyncio.sleep(0.1)
                    await rt.cancel(eid)
                state = await rt.wait(eid, timeout=timeout)
                return execution_document(state)

        try:
            doc = asyncio.run(main())
            events = [e.to_dict() for e in store.events(int(doc["execution_id"]))]
        finally:
            store.close()
        return Result(doc, events, home)

    return run


def flowtide_cli(
    *args: str, home: Path, env: Mapping[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, FLOWTIDE_HOME=str(home), FLOWTIDE_NO_PROGRESS="1", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "flowtide.cli", *args],
        capture_output=True,
        text=True,
        env=full,
        timeout=timeout,
    )


def cli_json(*args: str, home: Path, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    proc = flowtide_cli(*args, "--json", home=home, env=env)
    assert proc.returncode in (0, 1), f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return dict(json.loads(proc.stdout))


def cli_events(execution_id: str, home: Path) -> list[dict[str, Any]]:
    proc = flowtide_cli("events", execution_id, "--json", home=home)
    assert proc.returncode == 0, proc.stderr
    return list(json.loads(proc.stdout))
