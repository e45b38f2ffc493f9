"""Starting a real gateway (Debian's HAProxy or nginx) with the configuration
`flowtide shards gateway-config` writes, for the tests that route through one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

__all__ = ["start"]


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    return f"/usr/sbin/{name}" if os.access(f"/usr/sbin/{name}", os.X_OK) else None


NJS_MODULE = "/usr/lib/nginx/modules/ngx_http_js_module.so"


def start(kind: str, folder: Path, port: int, backends: list[str]) -> subprocess.Popen[bytes]:
    """Write the gateway's configuration with flowtide, check it, start the gateway."""
    binary = _binary(kind)
    if binary is None or (kind == "nginx" and not os.path.exists(NJS_MODULE)):
        pytest.skip(f"{kind} is not installed (scripts/ensure-{kind}.sh installs it)")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "flowtide.cli",
            "shards",
            "gateway-config",
            "--format",
            kind,
            "--out",
            str(folder),
            "--listen",
            f"127.0.0.1:{port}",
            *backends,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    if kind == "haproxy":
        config = folder / "haproxy.cfg"
        check = [binary, "-c", "-f", str(config)]
        run = [binary, "-db", "-f", str(config)]
    else:
        config = folder / "nginx.conf"
        main = f"pid {folder}/nginx.pid; error_log {folder}/error.log;"
        check = [binary, "-t", "-p", str(folder), "-c", str(config), "-g", main]
        run = [binary, "-p", str(folder), "-c", str(config), "-g", f"daemon off; {main}"]
    checked = subprocess.run(check, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    log = open(folder / f"{kind}.log", "wb")  # noqa: SIM115 - closed with the process
    try:
        return subprocess.Popen(run, stdout=log, stderr=log)
    finally:
        log.close()
