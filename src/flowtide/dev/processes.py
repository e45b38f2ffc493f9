"""The programs a dev stack runs: each started in its own session (closing the terminal
keeps it running), its output appended to logs/<name>.log, its pid kept in the stack's
state so that a later `flowtide dev` finds it, and stopped by process group (SIGTERM, then
SIGKILL). A pid reused by another program, or a zombie, does not count as running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from flowtide.errors import FlowtideError

__all__ = ["DevStackError", "Processes", "nats_ok", "need_port", "port_free"]


class DevStackError(FlowtideError, RuntimeError):
    """A part of the stack could not be started or stopped; the message says which and why."""


class Processes:
    """The processes of one dev stack, by name (`nats`, `server`, `worker-0`, ...).

    `pids` is the stack's saved name -> pid map (changed in place; `save` writes it),
    `env` what every process gets on top of this one's environment, `probes` how to tell
    whether a part that is not started here runs (PostgreSQL is run by pg_ctl).
    """

    def __init__(
        self,
        *,
        pids: dict[str, int],
        logs: Path,
        cwd: Path,
        env: Mapping[str, str],
        save: Callable[[], None],
        probes: Mapping[str, Callable[[], bool]],
    ) -> None:
        self.pids = pids
        self.logs = logs
        self.cwd = cwd
        self.env = dict(env)
        self.save = save
        self.probes = probes
        # Processes started by this object: their exit status is ours to read.
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def spawn(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        child_env = {**os.environ, **self.env}
        # NATS credentials of this shell are not the part's: each gets its own below.
        for variable in ("FLOWTIDE_NATS_USER", "FLOWTIDE_NATS_PASSWORD", "FLOWTIDE_NATS_CREDS"):
            child_env.pop(variable, None)
        child_env.update(env or {})
        with open(self.log(name), "ab") as handle:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=child_env,
                cwd=cwd or self.cwd,
                start_new_session=True,
            )
        self._children[name] = proc
        self.pids[name] = proc.pid
        self.save()

    def pid(self, name: str) -> int | None:
        return self.pids.get(name) if self.alive(name) else None

    def alive(self, name: str) -> bool:
        """Whether the process we started as `name` still runs (and is still ours: a pid
        reused by another program does not count)."""
        probe = self.probes.get(name)
        if probe is not None:
            return probe()
        child = self._children.get(name)
        if child is not None and child.pid == self.pids.get(name):
            return child.poll() is None
        pid = self.pids.get(name)
        if not pid:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return False
        marker = "nats-server" if name == "nats" or name.startswith("nats-") else "flowtide.cli"
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if marker.encode() not in cmdline:
                return False
            stat = Path(f"/proc/{pid}/stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":  # a zombie is not running
                return False
        return True

    def stop(self, name: str, timeout: float = 15.0, *, force_after: float | None = None) -> bool:
        """SIGTERM the process group, SIGKILL after `timeout`; True when it was running.

        `force_after`: seconds after which the process gets a SIGINT too, if it still runs
        (a uvicorn server then stops waiting for its connections to close).
        """
        if not self.alive(name):
            self.pids.pop(name, None)
            return False
        pid = self.pids[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        start = time.monotonic()
        deadline = start + timeout
        while time.monotonic() < deadline and self.alive(name):
            if force_after is not None and time.monotonic() - start >= force_after:
                force_after = None
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGINT)
            _reap(pid)
            time.sleep(0.05)
        if self.alive(name):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            _reap(pid)
        self.pids.pop(name, None)
        self.save()
        return True

    def wait(self, name: str, ready: Callable[[], bool], timeout: float) -> None:
        """Until `ready()`; DevStackError with the end of the log when the process exits
        or `timeout` passes first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive(name):
                child = self._children.get(name)
                code = f" with exit code {child.returncode}" if child is not None else ""
                raise DevStackError(
                    f"{name} exited{code} while starting; the end of {self.log(name)}:\n"
                    + _tail(self.log(name))
                )
            with contextlib.suppress(OSError):
                if ready():
                    return
            time.sleep(0.1)
        raise DevStackError(
            f"{name} not ready after {timeout:.0f} s; the end of {self.log(name)}:\n"
            + _tail(self.log(name))
        )


def port_free(port: int) -> bool:
    """Whether something could listen on `port` of 127.0.0.1 now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As servers do: a port whose last connections linger in TIME_WAIT is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def need_port(port: int, what: str, flag: str) -> None:
    """DevStackError when `port` on 127.0.0.1 is taken."""
    if not port_free(port):
        raise DevStackError(
            f"port {port} on 127.0.0.1 is taken, so {what} cannot listen there; "
            f"stop what uses it or choose another port with {flag}"
        )


def nats_ok(port: int, ca: Path | None) -> bool:
    """Whether the nats-server on `port` answers: it sends its INFO line and, with `ca`
    (a server taking TLS only), completes a TLS handshake with a certificate of that CA.
    A bare TCP connect closed at once is logged by nats-server as a TLS handshake
    error, one [ERR] line per `dev status` in each node's log."""
    import ssl

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.settimeout(1)
            head = b""
            while not head.endswith(b"\r\n") and len(head) < 65536:
                chunk = sock.recv(4096)
                if not chunk:
                    return False
                head += chunk
            if not head.startswith(b"INFO "):
                return False
            if ca is None:
                return True
            context = ssl.create_default_context(cafile=str(ca))
            with context.wrap_socket(sock, server_hostname="127.0.0.1"):
                return True
    except (OSError, ssl.SSLError):
        return False


def _reap(pid: int | None) -> None:
    """Collect `pid` if it is our own exited child (so it does not linger as a zombie)."""
    if pid:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
