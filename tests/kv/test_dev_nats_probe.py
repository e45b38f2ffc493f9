"""What a newcomer met with `flowtide dev up --nats-cluster 3` (flowtide.dev.natsnodes,
flowtide.dev.status):

- `dev status` probed each nats-server with a bare TCP connect, which a TLS-only
  nats-server logs as `[ERR] ... TLS handshake error: EOF`: every `dev status` (and
  `dev up`) added an error line to each node's log. The probe now reads the INFO line
  and completes the handshake with the stack's CA.

(The route ports: tests/unit/test_dev_nats_ports.py.)
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from flowtide.dev.nats import flowtide_users, new_passwords, write_nats_config
from flowtide.dev.processes import nats_ok

from .natsserver import NatsServer

pytestmark = [pytest.mark.nats]


def test_probing_a_tls_nats_server_logs_no_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flowtide.dev.tls import LocalCA

    ca = LocalCA(tmp_path / "tls")
    ca.ensure()
    config = tmp_path / "nats.conf"
    users = flowtide_users(new_passwords(["default"]), ["default"], "flowtide_state")
    write_nats_config(config, users, tls=ca.cert("server"))
    # The probes' own client ports, to find what the server logged of each.
    ports: list[int] = []
    connect = socket.create_connection

    def spy(*args: Any, **kwargs: Any) -> socket.socket:
        sock = connect(*args, **kwargs)
        ports.append(sock.getsockname()[1])
        return sock

    with NatsServer.start(tmp_path / "nats", "-c", str(config)) as server:
        monkeypatch.setattr(socket, "create_connection", spy)
        for _ in range(3):
            assert nats_ok(server.port, ca.ca)
        good = list(ports)
        # A probe trusting another CA fails the handshake: not "running".
        other = LocalCA(tmp_path / "other")
        other.ensure()
        assert not nats_ok(server.port, other.ca)
        assert len(ports) == 4
        deadline = time.monotonic() + 5
        while f"127.0.0.1:{ports[-1]} " not in server.log_text() and time.monotonic() < deadline:
            time.sleep(0.02)
        log = server.log_text()
    assert f"127.0.0.1:{ports[-1]} " in log  # the refused one is logged...
    for port in good:  # ...the good ones are not
        assert f"127.0.0.1:{port} " not in log, log


def test_a_port_that_is_not_nats_is_not_running(tmp_path: Path) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        assert not nats_ok(port, None)
    finally:
        thread.join(5)
        listener.close()
