"""A secret that is a substring of ordinary data changes nothing a later step reads.

NoETL's `test_pft_flow` with the default `demo`/`demo` login failed with HTTP 400
`unsupported PFT batch data_type: ***graphics`: the password was scrubbed out of
`demographics` in a claimed row before the next task built its URL from it. Here the
same shape runs embedded against a real loopback HTTP server whose credential token is
`demo`: the claimed value reaches the next request intact, is stored only sealed, and is
shown unmasked where `demo` is not a word of its own.

The execution's secret set is what seals: it survives a resume (it is in the log), and a
sub-playbook inherits its parent's.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from flowtide.credentials import MASTER_KEY_ENV, CredentialVault
from flowtide.documents.execution import intact as execution_document
from flowtide.playbook.loader import parse_playbook
from flowtide.redaction import mask_value
from flowtide.runtime.local import LocalRuntime
from flowtide.store.sqlite import SQLiteStore

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: substring_secret, path: tests/redaction/substring_secret}
workload: {api: "http://127.0.0.1:9"}
workflow:
  - step: start
    tool:
      - name: claim
        kind: http
        url: "{{ api }}/claim"
        auth: batch_api
        spec:
          policy:
            rules:
              - else:
                  then: {do: continue, set: {ctx.data_type: "{{ output.data.data.data_type }}"}}
      - name: fetch
        kind: http
        url: "{{ api }}/batch/{{ ctx.data_type }}"
    next: [check]
  - step: check
    tool:
      kind: python
      input:
        claimed: "{{ start.results.claim.data }}"
        fetched: "{{ start.data }}"
        kept: "{{ ctx.data_type }}"
      code: |
        result = {"claimed": claimed, "fetched": fetched, "kept": kept}
"""


class _Batches(BaseHTTPRequestHandler):
    requests: list[tuple[str, str]] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        type(self).requests.append((self.path, self.headers.get("Authorization", "")))
        if self.path == "/claim":
            status, body = 200, {"data_type": "demographics", "note": "claimed by user demo"}
        elif self.path == "/batch/demographics":
            status, body = 200, {"type": "demographics", "rows": 25}
        else:
            status, body = 400, {"detail": f"unsupported batch data_type: {self.path[7:]}"}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture
def batch_api() -> Iterator[str]:
    _Batches.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Batches)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _run(home: Path, api: str) -> tuple[dict[str, Any], frozenset[str]]:
    store = SQLiteStore(home / "flowtide.db")
    vault = CredentialVault(store, home)
    vault.set("batch_api", {"type": "bearer", "token": "demo"}, kind="http")

    async def main() -> tuple[dict[str, Any], frozenset[str]]:
        async with LocalRuntime(store, credentials=vault, data_dir=home / "data") as rt:
            state = await rt.run(parse_playbook(PLAYBOOK, None), workload={"api": api})
            return execution_document(state), state.secrets

    try:
        return asyncio.run(main())
    finally:
        store.close()


def test_a_short_password_inside_data_changes_nothing_a_later_step_reads(
    tmp_path: Path, batch_api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(MASTER_KEY_ENV, raising=False)
    home = tmp_path / "home"
    doc, secrets = _run(home, batch_api)

    assert doc["status"] == "completed", doc["error"]
    # The next task's request was built from the intact value ...
    assert _Batches.requests == [("/claim", "Bearer demo"), ("/batch/demographics", "")]
    # ... and every later reader got it unchanged: the task's `set`, the step's result,
    # the next step's input.
    claimed = {"data_type": "demographics", "note": "claimed by user demo"}
    assert doc["steps"]["check"]["result"] == {
        "claimed": claimed,
        "fetched": {"type": "demographics", "rows": 25},
        "kept": "demographics",
    }
    assert secrets == {"demo"}

    # At rest, whatever holds `demo` (even inside `demographics`) is sealed: the bytes
    # under the home never show it.
    stored = b"".join(
        p.read_bytes() for p in home.rglob("*") if p.is_file() and p.name != "master.key"
    )
    assert b"batch_api" in stored  # the credential's alias: the right files were read
    assert b"demo" not in stored

    # Shown, the password is masked where it stands alone, and `demographics` stays.
    shown = mask_value(doc, secrets)["steps"]["check"]["result"]["claimed"]
    assert shown == {"data_type": "demographics", "note": "claimed by user ***"}


RESUMED = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: resumed_secret, path: tests/redaction/resumed_secret}
workload: {api: "http://127.0.0.1:9", flag: "/nonexistent"}
workflow:
  - step: start
    tool: {kind: http, url: "{{ api }}/claim", auth: batch_api}
    next: [echo_back]
  - step: echo_back
    tool:
      kind: python
      input: {note: "{{ start.data.note }}", flag: "{{ flag }}"}
      code: |
        import os, time
        deadline = time.time() + 60
        while not os.path.exists(flag) and time.time() < deadline:
            time.sleep(0.05)
        result = {"echo": note}
"""


def test_a_resumed_execution_seals_with_the_secret_set_it_had(
    tmp_path: Path, batch_api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The set lives in the log (sealed `secrets.added`): a resumed run whose own tools
    touch nothing still seals what holds an earlier step's secret."""
    monkeypatch.delenv(MASTER_KEY_ENV, raising=False)
    home = tmp_path / "home"
    flag = tmp_path / "go"
    playbook = parse_playbook(RESUMED, None)
    store = SQLiteStore(home / "flowtide.db")
    vault = CredentialVault(store, home)
    vault.set("batch_api", {"type": "bearer", "token": "demo"}, kind="http")

    async def first() -> int:
        async with LocalRuntime(store, credentials=vault, data_dir=home / "data") as rt:
            eid = await rt.start(playbook, workload={"api": batch_api, "flag": str(flag)})
            for _ in range(600):
                if rt.state(eid).steps["echo_back"].status == "running":
                    return eid
                await asyncio.sleep(0.05)
            raise AssertionError("echo_back never started")

    async def resumed(eid: int) -> tuple[dict[str, Any], frozenset[str]]:
        async with LocalRuntime(store, credentials=vault, data_dir=home / "data") as rt:
            await rt.resume(eid)
            state = await rt.wait(eid, timeout=60)
            return execution_document(state), state.secrets

    try:
        eid = asyncio.run(first())  # stopped while echo_back runs, as by Ctrl-C
        flag.touch()
        doc, secrets = asyncio.run(resumed(eid))
    finally:
        store.close()
    assert doc["status"] == "completed", doc["error"]
    assert doc["steps"]["echo_back"]["result"] == {"echo": "claimed by user demo"}
    stored = b"".join(
        p.read_bytes() for p in home.rglob("*") if p.is_file() and p.name != "master.key"
    )
    assert b"batch_api" in stored and b"demo" not in stored
    assert secrets == {"demo"}


CHILD = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: child, path: tests/redaction/child}
workload: {note: ""}
workflow:
  - step: start
    tool: {kind: python, input: {note: "{{ note }}"}, code: "result = {'got': note}"}
"""

PARENT = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: parent, path: tests/redaction/parent}
workload: {api: "http://127.0.0.1:9/echo"}
workflow:
  - step: start
    tool: {kind: http, url: "{{ api }}", auth: api_token}
    next: [call_child]
  - step: call_child
    tool:
      kind: playbook
      path: tests/redaction/child
      input: {note: "{{ start.data.authorization }}"}
"""


def test_a_sub_playbook_inherits_its_parents_secret_set(
    tmp_path: Path, echo: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child's workload comes from the parent's data: it, and what the child makes of
    it, are sealed though the child's own tools touch nothing; the parent reads the
    child's result intact."""
    from flowtide.playbook.loader import load_playbook

    monkeypatch.delenv(MASTER_KEY_ENV, raising=False)
    token = "sub-tok-7c1e93ab55"
    (tmp_path / "child.yaml").write_text(CHILD)
    (tmp_path / "parent.yaml").write_text(PARENT)
    home = tmp_path / "home"
    store = SQLiteStore(home / "flowtide.db")
    vault = CredentialVault(store, home)
    vault.set("api_token", {"type": "bearer", "token": token}, kind="http")

    async def main() -> tuple[dict[str, Any], list[Any]]:
        async with LocalRuntime(store, credentials=vault, data_dir=home / "data") as rt:
            state = await rt.run(load_playbook(tmp_path / "parent.yaml"), workload={"api": echo})
            return execution_document(state), store.list_executions()

    try:
        doc, rows = asyncio.run(main())
    finally:
        store.close()
    assert doc["status"] == "completed", doc["error"]
    assert doc["steps"]["call_child"]["result"] == {"got": f"Bearer {token}"}
    child = next(r for r in rows if r.parent_execution_id is not None)
    assert child.workload == {"note": f"Bearer {token}"}  # read back intact
    stored = b"".join(
        p.read_bytes() for p in home.rglob("*") if p.is_file() and p.name != "master.key"
    )
    assert b"api_token" in stored and token.encode() not in stored
