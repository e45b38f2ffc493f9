"""`flowtide hook add|list|show|delete` on the local store, and a delivery to the hook
through a real `flowtide ui` process: the secret file is checked, the secret never
printed nor stored in the clear, and the delivery starts one run."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from flowtide.triggers.hooks import sign

from .helpers import Flowtide, describe, local_ui

SECRET = "cli-hook-secret-9f8e7d6c"

ECHO = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: cli_hook_echo, path: tests/hooks/cli_echo}
workload: {body: null}
workflow:
  - step: start
    tool: {kind: python, code: "result = {'got': body}", input: {body: "{{ body }}"}}
"""


def _secret(tmp_path: Path, text: str = SECRET, mode: int = 0o600) -> Path:
    path = tmp_path / "hook.secret"
    path.write_text(text + "\n", encoding="utf-8")
    path.chmod(mode)
    return path


def test_add_list_show_delete_locally(ft: Flowtide, tmp_path: Path) -> None:
    playbook = tmp_path / "echo.yaml"
    playbook.write_text(ECHO, encoding="utf-8")
    ft.ok("catalog", "register", playbook)
    secret = _secret(tmp_path)
    added = ft.ok(
        "hook", "add", "gh", "tests/hooks/cli_echo", "--secret-file", secret, "--rate", "5/s"
    )
    assert "POST /api/hooks/gh" in added.stdout
    assert "warning" not in added.stderr
    # A file playbook on the local store, with a workload template.
    ft.ok(
        "hook",
        "add",
        "filed",
        playbook,
        "--secret-file",
        secret,
        "--workload",
        '{body: "{{ hook.body.x }}"}',
    )
    items = ft.json("hook", "list")
    assert [h["name"] for h in items] == ["filed", "gh"]
    assert items[1]["rate"] == 5.0 and items[1]["playbook"]["path"] == "tests/hooks/cli_echo"
    assert items[0]["playbook"]["file"] == str(playbook.resolve())
    assert items[0]["workload"] == {"body": "{{ hook.body.x }}"}
    listed = ft.ok("hook", "list")
    assert "gh  tests/hooks/cli_echo  rate 5/s  /api/hooks/gh" in listed.stdout
    shown = ft.ok("hook", "show", "gh")
    assert "POST /api/hooks/gh" in shown.stdout and "never shown" in shown.stdout
    for proc in (added, listed, shown, ft.ok("hook", "list", "--json")):
        assert SECRET not in proc.stdout + proc.stderr
    # Replacing keeps the id.
    before = ft.json("hook", "show", "gh")["trigger_id"]
    ft.ok("hook", "add", "gh", "tests/hooks/cli_echo", "--secret-file", secret)
    after = ft.json("hook", "show", "gh")
    assert after["trigger_id"] == before and after["rate"] is None
    # At rest, sealed.
    db = sqlite3.connect(ft.home / "flowtide.db")
    try:
        for (sealed,) in db.execute("SELECT secret FROM trigger_def"):
            assert SECRET.encode() not in bytes(sealed)
    finally:
        db.close()
    ft.ok("hook", "delete", "gh")
    assert [h["name"] for h in ft.json("hook", "list")] == ["filed"]
    gone = ft.ok("hook", "delete", "gh", expect=2)
    assert "no hook named 'gh'" in gone.stderr


def test_the_secret_file_is_checked(ft: Flowtide, tmp_path: Path) -> None:
    playbook = tmp_path / "echo.yaml"
    playbook.write_text(ECHO, encoding="utf-8")
    missing = ft.ok("hook", "add", "h", playbook, "--secret-file", tmp_path / "nope", expect=2)
    assert "cannot read it" in missing.stderr
    empty = ft.ok("hook", "add", "h", playbook, "--secret-file", _secret(tmp_path, " "), expect=2)
    assert "empty" in empty.stderr
    big = ft.ok(
        "hook", "add", "h", playbook, "--secret-file", _secret(tmp_path, "k" * 5000), expect=2
    )
    assert "larger than 4096 bytes" in big.stderr
    neither = ft.ok("hook", "add", "h", playbook, expect=2)
    assert "--secret-file" in neither.stderr
    bad_name = ft.ok("hook", "add", "a/b", playbook, "--secret-file", _secret(tmp_path), expect=2)
    assert "name" in bad_name.stderr
    bad_rate = ft.ok(
        "hook",
        "add",
        "h",
        playbook,
        "--secret-file",
        _secret(tmp_path),
        "--rate",
        "fast",
        expect=2,
    )
    assert "rate" in bad_rate.stderr
    unknown = ft.ok("hook", "add", "h", "no/such", "--secret-file", _secret(tmp_path), expect=2)
    assert "no/such" in unknown.stderr
    assert ft.json("hook", "list") == []
    # Readable by others: added, with a warning (and the secret still never printed).
    loose = ft.ok("hook", "add", "h", playbook, "--secret-file", _secret(tmp_path, mode=0o644))
    assert "readable by other users" in loose.stderr
    assert SECRET not in loose.stdout + loose.stderr


def test_a_credential_as_the_secret_and_a_delivery_to_flowtide_ui(
    ft: Flowtide, tmp_path: Path
) -> None:
    playbook = tmp_path / "echo.yaml"
    playbook.write_text(ECHO, encoding="utf-8")
    ft.ok("credential", "set", "gh_hook", "--json", json.dumps({"secret": SECRET}))
    ft.ok("hook", "add", "gh", playbook, "--secret-credential", "gh_hook")
    missing = ft.ok("hook", "add", "x", playbook, "--secret-credential", "nope", expect=1)
    assert "nope" in missing.stderr
    body = b'{"ref": "refs/heads/main"}'
    with local_ui(ft, tmp_path / "ui.out") as ui:
        send = {"content-type": "application/json", "X-GitHub-Delivery": "abc-1"}
        bad = httpx.post(
            f"{ui.base}/api/hooks/gh",
            content=body,
            headers={**send, "X-Hub-Signature-256": sign(b"wrong", body)},
            timeout=30,
        )
        assert bad.status_code == 401, bad.text
        good = {**send, "X-Hub-Signature-256": sign(SECRET.encode(), body)}
        first = httpx.post(f"{ui.base}/api/hooks/gh", content=body, headers=good, timeout=30)
        again = httpx.post(f"{ui.base}/api/hooks/gh", content=body, headers=good, timeout=30)
        assert first.status_code == 202, first.text
        assert (
            again.status_code == 200
            and again.json()["execution_id"] == first.json()["execution_id"]
        )
        eid = first.json()["execution_id"]
        deadline = time.monotonic() + 30
        while ui.status(eid) != "completed":
            assert time.monotonic() < deadline, ui.status(eid)
            time.sleep(0.1)
        doc = ui.get(f"/api/executions/{eid}")
        assert doc["result"] == {"got": {"ref": "refs/heads/main"}}
        assert doc["trigger"] == {"kind": "hook", "name": "gh", "delivery": "abc-1"}
        page = ui.get("/api/hooks/gh")
        assert [d["delivery"] for d in page["deliveries"]] == ["abc-1"]
        assert page["refused"][0]["why"] == "delivery refused: bad signature"
    shown = ft.ok("hook", "show", "gh")
    assert "abc-1" in shown.stdout, describe(shown)
    assert [e["execution_id"] for e in ft.executions()] == [eid]


def test_rotate_key_reseals_a_hooks_secret(ft: Flowtide, tmp_path: Path) -> None:
    from cryptography.fernet import Fernet, InvalidToken

    from flowtide.sealing import Sealer
    from flowtide.store.sqlite import SQLiteStore
    from flowtide.triggers.hooks import hook_secret

    playbook = tmp_path / "echo.yaml"
    playbook.write_text(ECHO, encoding="utf-8")
    ft.ok("hook", "add", "gh", playbook, "--secret-file", _secret(tmp_path))
    old = (ft.home / "master.key").read_bytes().strip()
    assert "1 sealed values re-encrypted" in ft.ok("credential", "rotate-key").stdout
    ft.ok("credential", "rotate-key", "--retire")
    new = (ft.home / "master.key").read_bytes().strip()
    assert new != old
    store = SQLiteStore(ft.home / "flowtide.db", sealer=Sealer(ft.home))
    try:
        assert hook_secret(store, "gh") == SECRET.encode()
        sealed = store.trigger_secret("hook", "gh")
        assert sealed is not None
        with pytest.raises(InvalidToken):
            Fernet(old).decrypt(sealed)
    finally:
        store.close()
