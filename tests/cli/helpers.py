"""Helpers for the end-to-end CLI tests: every test runs the real `flowtide` CLI
in a subprocess (`python -m flowtide.cli`) against its own FLOWTIDE_HOME."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

PLAYBOOKS = Path(__file__).resolve().parent / "playbooks"


def error_line(path: Path, marker: str = "ERROR-HERE") -> int:
    """1-based line of `path` holding `marker` (where the playbook's mistake is)."""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if marker in line:
            return number
    raise AssertionError(f"{path} has no line with {marker!r}")


class Flowtide:
    """Runs `flowtide` subcommands with FLOWTIDE_HOME=home, from a scratch cwd."""

    def __init__(self, home: Path, cwd: Path) -> None:
        self.home = home
        self.cwd = cwd

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWTIDE_")}
        env["FLOWTIDE_HOME"] = str(self.home)
        env["FLOWTIDE_NO_PROGRESS"] = "1"
        return env

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "flowtide.cli", *map(str, args)]

    def __call__(self, *args: Any, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(*args),
            capture_output=True,
            text=True,
            cwd=self.cwd,
            env=self.env,
            timeout=timeout,
        )

    def popen(self, *args: Any, stdout: IO[Any], stderr: IO[Any]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self.command(*args), stdout=stdout, stderr=stderr, cwd=self.cwd, env=self.env
        )

    def ok(self, *args: Any, expect: int = 0) -> subprocess.CompletedProcess[str]:
        proc = self(*args)
        assert proc.returncode == expect, describe(proc)
        return proc

    def json(self, *args: Any, expect: int = 0) -> Any:
        """Run `flowtide ARGS --json` and parse stdout, which must be one JSON document."""
        proc = self.ok(*args, "--json", expect=expect)
        try:
            return json.loads(proc.stdout)
        except ValueError as exc:  # pragma: no cover - reported as a failure
            raise AssertionError(
                f"stdout is not one JSON document: {exc}\n{describe(proc)}"
            ) from None

    def run(self, target: Any, *extra: Any, expect: int = 0) -> dict[str, Any]:
        doc = self.json("run", str(target), *extra, expect=expect)
        assert isinstance(doc, dict)
        return doc

    def executions(self) -> list[dict[str, Any]]:
        return list(self.json("list"))

    def events(self, execution_id: str) -> list[dict[str, Any]]:
        return list(self.json("events", execution_id))

    def status(self, execution_id: str) -> dict[str, Any]:
        return dict(self.json("status", execution_id))


def describe(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"


def wait_until(predicate: Any, *, timeout: float, what: str, proc: Any = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) before {what}")
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def position(events: list[dict[str, Any]], type_: str, step: str) -> int:
    """Index in `events` of the first event of `type_` for `step`."""
    return next(i for i, e in enumerate(events) if e["type"] == type_ and e["step"] == step)


class LocalUi:
    """A running `flowtide ui`: its page URL (…/ui), its token, and an API client."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str, token: str) -> None:
        import httpx

        self.proc = proc
        self.url = url
        self.token = token
        self.base = url.removesuffix("/ui")
        # The CSRF header is what the page sends; a bearer token does not need it.
        self.api = httpx.Client(
            base_url=self.base,
            headers={"authorization": f"Bearer {token}", "x-flowtide-csrf": "1"},
            timeout=30,
        )

    def get(self, path: str, **kwargs: Any) -> Any:
        reply = self.api.get(path, **kwargs)
        assert reply.status_code == 200, reply.text
        return reply.json()

    def sign_in(self, page: Any) -> None:
        """Open the page with the token in its fragment and wait until the sign-in is done.

        The page posts the fragment's token in the background; navigating away before
        that answers aborts it and the next page shows the login form."""
        page.goto(f"{self.url}#token={self.token}")
        page.get_by_test_id("user-name").filter(has_text=re.compile(".")).wait_for()

    def start(self, playbook: str, **payload: Any) -> str:
        """Start an inline playbook in the UI's process; its execution id."""
        reply = self.api.post("/api/execute", json={"playbook": playbook, "payload": payload})
        assert reply.status_code == 201, reply.text
        return str(reply.json()["execution_id"])

    def status(self, execution_id: str) -> str:
        return str(self.get(f"/api/executions/{execution_id}/summary")["status"])


@contextlib.contextmanager
def local_ui(ft: Flowtide, log: Path) -> Iterator[LocalUi]:
    """`flowtide ui` on a free port over `ft`'s home (its output in `log`), stopped after."""
    with open(log, "wb") as sink:
        proc = ft.popen("ui", "--port", "0", stdout=sink, stderr=subprocess.STDOUT)
    ui = None
    try:
        deadline = time.monotonic() + 30
        found = None
        while found is None:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            found = re.search(r"open (http://\S+/ui)#token=(\S+)", log.read_text())
            time.sleep(0.05)
        ui = LocalUi(proc, found[1], found[2])
        yield ui
    finally:
        if ui is not None:
            ui.api.close()
        proc.terminate()
        proc.wait(timeout=30)
