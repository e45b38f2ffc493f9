"""`flowtide logs ID [STEP] [-f]` of an embedded run: what a python step prints is followed
live from another process (its first lines arrive while the step still runs: the step
waits until the test has seen them), whole and in order, a secret of the execution
masked; a shell step's output too; and once the run has ended the same output comes from
its events."""

from __future__ import annotations

import io
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from .helpers import Flowtide, describe, error_line, local_ui, wait_until

TOKEN = "tok-logs-7d1e9a-never-print-me"
LINES = 3000

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: talkative, path: tests/cli/talkative}
workload: {url: "http://127.0.0.1:9/echo", marker: "MARKER", go: "GO"}
workflow:
  - step: start
    tool: {kind: http, method: GET, url: "{{ url }}", auth: echo_api}
    next: [talk]
  - step: talk
    tool:
      kind: python
      input: {seen: "{{ start.data.authorization }}", marker: "{{ marker }}", go: "{{ go }}"}
      code: |
        import os, time
        open(marker, "w").write(str(execution_id))
        print("the token is", seen)
        for i in range(LINES):
            print(f"line {i}")
            if i == 99:  # the test goes on once it has seen output of the running step
                deadline = time.monotonic() + 60
                while not os.path.exists(go) and time.monotonic() < deadline:
                    time.sleep(0.01)
            if i % 100 == 99:
                time.sleep(0.05)
        result = "done"
    next: [sh]
  - step: sh
    tool: {kind: shell, command: "echo from-shell; echo to-stderr >&2"}
""".replace("LINES", str(LINES))


class _Echo(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server API
        body = json.dumps({"authorization": self.headers.get("Authorization", "")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture
def echo_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/echo"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _expected_talk() -> str:
    return "the token is Bearer ***\n" + "".join(f"line {i}\n" for i in range(LINES))


def test_logs_follow_a_running_python_step(ft: Flowtide, echo_server: str, tmp_path: Path) -> None:
    ft.ok("credential", "set", "echo_api", "--json", json.dumps({"type": "bearer", "token": TOKEN}))
    playbook = tmp_path / "talkative.yaml"
    playbook.write_text(PLAYBOOK, encoding="utf-8")
    marker, go = tmp_path / "execution-id", tmp_path / "go"
    run_out = (tmp_path / "run.out").open("wb")
    run = ft.popen(
        "run", playbook, "--set", f"url={echo_server}", "--set", f"marker={marker}", "--set", f"go={go}",
        stdout=run_out, stderr=subprocess.STDOUT,
    )  # fmt: skip
    follower: subprocess.Popen[str] | None = None
    try:
        wait_until(lambda: marker.exists() and marker.read_text() != "", timeout=60,
                   what="the python step to start", proc=run)  # fmt: skip
        execution_id = marker.read_text()
        follower = subprocess.Popen(
            ft.command("logs", execution_id, "-f", "--json"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ft.cwd, env=ft.env,
        )  # fmt: skip
        assert follower.stdout is not None
        pieces: list[dict[str, Any]] = []
        for line in follower.stdout:
            piece = json.loads(line)
            if piece["step"] == "talk" and not go.exists():
                # Seen while the step waits for it: it is still running.
                assert piece["running"] is True and run.poll() is None
                go.touch()
            pieces.append(piece)
        assert follower.wait(timeout=60) == 0, follower.stderr.read() if follower.stderr else ""
        assert run.wait(timeout=60) == 0, (tmp_path / "run.out").read_text()
    finally:
        for proc in (follower, run):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        run_out.close()
        if follower is not None:
            for pipe in (follower.stdout, follower.stderr):
                if pipe is not None:
                    pipe.close()

    talk = [p for p in pieces if p["step"] == "talk"]
    # Followed live: the first of the step's output came from the running command's
    # ring (checked above), and the rest in more pieces.
    assert go.exists() and talk[0]["running"] is True and len(talk) > 2
    # Whole, in order, once: each piece starts where the last ended, nothing dropped.
    assert "".join(p["text"] for p in talk) == _expected_talk()
    assert [p["offset"] for p in talk][0] == 0 and all(p["dropped"] == 0 for p in talk)
    for before, after in zip(talk, talk[1:], strict=False):
        assert after["offset"] == before["offset"] + len(before["text"].encode())
    # The shell step's stdout and stderr.
    shell = "".join(p["text"] for p in pieces if p["step"] == "sh")
    assert "from-shell\n" in shell and "to-stderr\n" in shell
    everything = "".join(json.dumps(p) for p in pieces)
    assert TOKEN not in everything

    # The run has ended: its output is still there (the rings stay until `prune`).
    after_end = ft("logs", execution_id, "talk")
    assert after_end.returncode == 0, describe(after_end)
    assert after_end.stdout == _expected_talk()
    assert TOKEN not in after_end.stdout
    assert (ft.home / "data" / "logs" / execution_id).is_dir()


def test_logs_of_an_unknown_execution(ft: Flowtide) -> None:
    proc = ft("logs", "12345")
    assert proc.returncode == 2, describe(proc)
    assert "12345" in proc.stderr


def test_logs_follow_ends_with_the_run(ft: Flowtide, tmp_path: Path) -> None:
    playbook = tmp_path / "quick.yaml"
    playbook.write_text(
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: quick, path: quick}\n"
        "workflow:\n  - step: start\n    tool: {kind: python, code: 'print(\"hi\")'}\n",
        encoding="utf-8",
    )
    doc = ft.run(playbook)
    started = time.monotonic()
    proc = ft("logs", doc["execution_id"], "-f")
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout == "hi\n"
    assert time.monotonic() - started < 30
    # a misspelt step is an error naming the steps there are, not an empty log
    typo = ft("logs", doc["execution_id"], "strat")
    assert typo.returncode == 2 and typo.stdout == "", describe(typo)
    assert "no step 'strat'; did you mean 'start'? (steps: start)" in typo.stderr, typo.stderr
    assert ft.ok("logs", doc["execution_id"], "start").stdout == "hi\n"


FAILING = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: failing_python, path: tests/cli/failing_python}
workflow:
  - step: start
    tool:
      kind: python
      code: |
        def helper(x):
            return 1 / x  # ERROR-HERE

        def main():
            print("about to fail")
            return helper(0)  # CALLER
"""


def test_a_failed_python_step_shows_its_traceback_in_the_playbook(
    ft: Flowtide, tmp_path: Path
) -> None:
    playbook = tmp_path / "failing_python.yaml"
    playbook.write_text(FAILING, encoding="utf-8")
    proc = ft("run", playbook)
    assert proc.returncode == 1, describe(proc)
    inner, caller = error_line(playbook), error_line(playbook, "# CALLER")
    assert f"(failing_python.yaml:{inner}: return 1 / x  # ERROR-HERE)" in proc.stderr
    trace = proc.stderr[proc.stderr.index("Traceback (most recent call last):") :].splitlines()
    assert trace[1:6] == [
        f'  File "failing_python.yaml", line {caller}, in main',
        "    return helper(0)  # CALLER",
        f'  File "failing_python.yaml", line {inner}, in helper',
        "    return 1 / x  # ERROR-HERE",
        "ZeroDivisionError: division by zero",
    ]
    # flowtide's own frames are not shown.
    assert "flowtide/" not in proc.stderr
    # What it printed before failing is in its logs.
    eid = ft.json("list")[0]["execution_id"]
    assert ft.ok("logs", eid).stdout == "about to fail\n"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


PRINTED = "a\ud800b \x1b]52;c;cm0gLXJmIH4=\x07 \x1b[2J \x9b31m \u202egnp.exe\r\nx\ry\n\tend\n"


def test_logs_on_a_terminal_shows_what_would_command_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # A step printing ESC sequences (OSC 52 writes the reader's clipboard, CSI 2J clears
    # the screen), a C1 CSI, a bidi override or a bare CR reached the terminal raw.
    from flowtide.cli.logs import _show

    out = _Terminal()
    monkeypatch.setattr("sys.stdout", out)
    _show({"step": "s\x1b[1m", "dropped": 3, "text": PRINTED}, as_json=False)
    shown = out.getvalue()
    assert not any(c in shown for c in "\x1b\x07\x9b\u202e\ud800")
    assert shown == (
        "[s\\x1b[1m: 3 bytes not kept]\n"
        "a\ufffdb \\x1b]52;c;cm0gLXJmIH4=\\x07 \\x1b[2J \\x9b31m \\u202egnp.exe\r\nx\\x0dy\n\tend\n"
    )


def test_logs_to_a_file_writes_what_was_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    from flowtide.cli.logs import _show

    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    _show({"step": "s", "dropped": 0, "text": PRINTED}, as_json=False)
    # As printed but for the lone surrogate, which no encoding writes (a crash before).
    assert out.getvalue() == PRINTED.replace("\ud800", "\ufffd")


STUCK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: stuck, path: tests/cli/stuck}
workload: {marker: M}
workflow:
  - step: start
    tool:
      kind: python
      input: {marker: "{{ marker }}"}
      code: |
        import time
        print("before the kill")
        open(marker, "w").write(str(execution_id))
        time.sleep(120)
"""


def test_logs_follow_ends_when_the_runs_process_died(ft: Flowtide, tmp_path: Path) -> None:
    """A run whose process was killed (interrupted) writes nothing more: `logs -f`
    prints what it wrote and ends, as `events --follow` does, rather than wait forever."""
    playbook = tmp_path / "stuck.yaml"
    playbook.write_text(STUCK, encoding="utf-8")
    marker = tmp_path / "execution-id"
    with (tmp_path / "run.out").open("wb") as out:
        run = ft.popen("run", playbook, "--set", f"marker={marker}", stdout=out, stderr=out)
        try:
            wait_until(lambda: marker.exists() and marker.read_text() != "", timeout=60,
                       what="the python step to start", proc=run)  # fmt: skip
            # The line is in the ring once the log's writer flushed it.
            execution_id = marker.read_text()
            wait_until(lambda: "before the kill" in ft("logs", execution_id).stdout,
                       timeout=30, what="the printed line")  # fmt: skip
        finally:
            run.kill()
            run.wait()
    assert ft.executions()[0]["status"] == "interrupted"
    followed = ft("logs", execution_id, "start", "-f", timeout=20)
    assert followed.returncode == 0, describe(followed)
    assert followed.stdout == "before the kill\n"
    # The UI's log stream (`flowtide ui` over the same home) ends too.
    with local_ui(ft, tmp_path / "ui.log") as ui:
        reply = ui.api.get(
            f"/api/executions/{execution_id}/logs",
            params={"step": "start", "follow": "true"},
            timeout=20,
        )
    assert reply.status_code == 200, reply.text
    pieces = [json.loads(line) for line in reply.text.splitlines() if line.strip()]
    assert "".join(p["text"] for p in pieces) == "before the kill\n"
