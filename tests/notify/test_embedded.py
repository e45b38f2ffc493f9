"""Notifications of embedded runs (`flowtide run`): one delivery per transition, retried
while the target is down, recorded as events, never a secret, never to loopback unless
allowed, and loader errors with positions."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flowtide.errors import PlaybookErrors
from flowtide.playbook.loader import parse_playbook
from flowtide.store.sqlite import SQLiteStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stubs"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))

from notify_target import notify_target  # noqa: E402
from stack import flowtide_env  # noqa: E402

SECRET = "ntf-" + secrets.token_hex(12)

FAILING = """\
metadata: {{name: failing, path: tests/notify/failing}}
workload: {{echo: "http://127.0.0.1:9/"}}
notify:
  - on: [failed, completed]
    webhook:
      url: "{url}/hook?token=hidden-query"
      headers: {{X-Team: ops}}
workflow:
  - step: start
    tool: {{kind: http, method: GET, url: "{{{{ workload.echo }}}}", auth: api_secret}}
    next: [leak]
  - step: leak
    tool:
      kind: python
      input: {{seen: "{{{{ start.data.authorization }}}}"}}
      code: |
        raise ValueError("the token is " + seen)
"""


def _flowtide(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flowtide.cli", *args],
        capture_output=True,
        text=True,
        env={**flowtide_env(tmp_path / "home"), **env},
        cwd=tmp_path,
        timeout=120,
    )


def _events(tmp_path: Path) -> list[Any]:
    with SQLiteStore(tmp_path / "home" / "flowtide.db") as store:
        (row,) = store.list_executions()
        return store.events(row.execution_id)


FAST = {
    "FLOWTIDE_NOTIFY_ALLOW_HOSTS": "127.0.0.1",
    "FLOWTIDE_NOTIFY_BACKOFF": "0.05",
    "FLOWTIDE_NOTIFY_EXIT_WAIT": "20",
}


def test_a_failed_run_notifies_once_retried_while_down_and_never_with_the_secret(
    tmp_path: Path,
) -> None:
    body = {"type": "bearer", "token": SECRET}
    proc = _flowtide(
        tmp_path, "credential", "set", "api_secret", "--json", json.dumps(body), "--kind", "http"
    )
    assert proc.returncode == 0, proc.stderr
    with notify_target() as target:
        target.script = [503, 503]
        playbook = tmp_path / "failing.yaml"
        playbook.write_text(FAILING.format(url=target.url))
        run = _flowtide(tmp_path, "run", str(playbook), "--set", f"echo={target.url}/echo", **FAST)
    assert run.returncode != 0
    assert "sending 1 notification(s)" in run.stderr
    # Two refusals, then the one delivery: the transition was sent once.
    assert [p for p, _h, _b in target.posts] == ["/hook?token=hidden-query"] * 3
    assert target.posts[0][1]["X-Team"] == "ops"
    doc = target.bodies()[-1]
    assert doc["transition"] == "failed" and doc["status"] == "failed"
    assert doc["playbook"]["path"] == "tests/notify/failing"
    assert "ValueError" in doc["error"]["message"] and "***" in doc["error"]["message"]
    assert doc["duration"] >= 0 and doc["started"] <= doc["ended"]
    for _path, _headers, text in target.posts:
        assert SECRET not in text
    events = _events(tmp_path)
    notes = [e for e in events if e.type.startswith("notification.")]
    assert [(e.type, e.payload["attempt"]) for e in notes] == [
        ("notification.failed", 1),
        ("notification.failed", 2),
        ("notification.sent", 3),
    ]
    assert notes[0].payload["status_code"] == 503 and "retry_at" in notes[0].payload
    assert notes[-1].payload["to"] == f"{target.url}/hook"  # no query string
    # After the terminal event; the run's status is what the run made it.
    assert events.index(notes[0]) > [e.type for e in events].index("playbook.failed")
    with SQLiteStore(tmp_path / "home" / "flowtide.db") as store:
        assert store.list_executions()[0].status == "failed"
        assert store.pending_notifications() == 0
    shown = _flowtide(tmp_path, "events", str(events[0].execution_id))
    assert "notification.sent" in shown.stdout and SECRET not in shown.stdout


def test_loopback_is_refused_unless_allowed(tmp_path: Path) -> None:
    with notify_target() as target:
        playbook = tmp_path / "ok.yaml"
        playbook.write_text(
            "metadata: {name: ok}\n"
            f"notify: [{{on: [completed], slack: {{url: '{target.url}/slack'}}}}]\n"
            "workflow:\n  - step: start\n    tool: {kind: noop}\n"
        )
        run = _flowtide(tmp_path, "run", str(playbook), FLOWTIDE_NOTIFY_EXIT_WAIT="10")
        assert run.returncode == 0, run.stderr
        assert target.posts == []
        (note,) = [e for e in _events(tmp_path) if e.type.startswith("notification.")]
        assert note.type == "notification.failed" and "loopback" in note.payload["error"]
        assert "retry_at" not in note.payload  # a refusal is final


def test_the_server_default_and_slack(tmp_path: Path) -> None:
    with notify_target() as target:
        default = json.dumps([{"on": ["completed"], "slack": {"url": f"{target.url}/s"}}])
        playbook = tmp_path / "ok.yaml"
        playbook.write_text(
            "metadata: {name: ok}\nworkflow:\n  - step: start\n    tool: {kind: noop}\n"
        )
        run = _flowtide(
            tmp_path,
            "run",
            str(playbook),
            FLOWTIDE_NOTIFY_DEFAULT=default,
            FLOWTIDE_NOTIFY_PUBLIC_URL="https://flowtide.example",
            **FAST,
        )
        assert run.returncode == 0, run.stderr
        (body,) = target.bodies()
        assert set(body) == {"text"}
        assert (
            "completed" in body["text"]
            and "https://flowtide.example/ui/executions/" in body["text"]
        )


@pytest.mark.parametrize(
    ("notify", "message"),
    [
        ("[{on: [failed], webhook: {url: 'ftp://x'}}]", "notify[0].webhook.url"),
        ("[{on: [exploded], slack: {url: 'http://h/'}}]", "unknown transition 'exploded'"),
        ("[{slack: {url: 'http://h/'}, webhook: {url: 'http://h/'}}]", "exactly one target"),
        ("[{email: {to: a@b}}]", "needs 'smtp' with a 'host'"),
        ("[{webhook: {url: 'http://h/', body: '{{ x'}}]", "template syntax error"),
        ("{webhook: {url: 'http://h/'}}", "'notify' must be a list"),
    ],
)
def test_loader_errors_name_the_line(notify: str, message: str) -> None:
    text = f"metadata: {{name: t}}\nnotify: {notify}\nworkflow:\n  - step: start\n    tool: {{kind: noop}}\n"
    with pytest.raises(PlaybookErrors) as caught:
        parse_playbook(text, "t.yaml")
    shown = str(caught.value)
    assert message in shown and "t.yaml:2:" in shown, shown


def test_a_playbook_target_starts_that_playbook_with_the_document(tmp_path: Path) -> None:
    (tmp_path / "after.yaml").write_text(
        "metadata: {name: after, path: tests/notify/after}\n"
        "workflow:\n  - step: start\n    tool: {kind: python, input: {t: '{{ workload.transition }}'},"
        " code: \"result = {'saw': t}\"}\n"
    )
    reg = _flowtide(tmp_path, "catalog", "register", str(tmp_path / "after.yaml"))
    assert reg.returncode == 0, reg.stderr
    playbook = tmp_path / "ok.yaml"
    playbook.write_text(
        "metadata: {name: ok}\n"
        "notify: [{on: [completed], playbook: {path: tests/notify/after}}]\n"
        "workflow:\n  - step: start\n    tool: {kind: noop}\n"
    )
    run = _flowtide(tmp_path, "run", str(playbook), FLOWTIDE_NOTIFY_EXIT_WAIT="30")
    assert run.returncode == 0, run.stderr
    with SQLiteStore(tmp_path / "home" / "flowtide.db") as store:
        rows = {r.playbook_path: r for r in store.list_executions()}
        after = rows["tests/notify/after"]
        assert after.status == "completed" and after.result == {"saw": "completed"}
        notifier = next(r for r in rows.values() if r.playbook_path != "tests/notify/after")
        (sent,) = store.events(notifier.execution_id, types=["notification.sent"])
        assert sent.payload["started_execution_id"] == after.execution_id


@pytest.mark.parametrize(
    ("example", "expected"),
    [
        ("nightly/report.yaml", "nightly report for 2026-11-27: failed (RuntimeError"),
        ("notify_on_failure.yaml", "examples/notify_on_failure failed: RuntimeError"),
    ],
)
def test_the_examples_notifications_render(tmp_path: Path, example: str, expected: str) -> None:
    """The shipped examples' `notify:` templates render (their webhook pointed at a
    loopback stub): the failure is delivered with its text, not a template error."""
    source = Path(__file__).resolve().parents[2] / "examples" / example
    with notify_target() as target:
        playbook = tmp_path / "example.yaml"
        playbook.write_text(source.read_text().replace("https://hooks.example.org", target.url))
        run = _flowtide(
            tmp_path,
            "run",
            str(playbook),
            "--set",
            "fail=true",
            FLOWTIDE_NOTIFY_PUBLIC_URL="https://flowtide.example.org",
            **FAST,
        )
        assert run.returncode != 0
        notes = [e for e in _events(tmp_path) if e.type.startswith("notification.")]
        assert [e.type for e in notes] == ["notification.sent"], [e.payload for e in notes]
        (body,) = target.bodies()
    assert body["text"].startswith(expected), body
    run_page = f"https://flowtide.example.org/ui/executions/{notes[0].execution_id}"
    assert body["link"] == run_page
