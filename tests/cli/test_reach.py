"""Reaching a server over TLS from the command line: --home finds a dev stack's token and
certificates, and a TLS failure says what is missing (a real mutual-TLS server on
loopback, with the dev stack's own CA)."""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flowtide.cli import app
from flowtide.dev.tls import LocalCA


class _Api(BaseHTTPRequestHandler):
    seen: list[str | None] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.seen.append(self.headers.get("authorization"))
        body = json.dumps({"items": [], "next_before": None, "unavailable_shards": []}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, str]]:
    """A home whose dev/ holds a CA, certificates and tokens.json naming a mutual-TLS
    server that answers /api/executions."""
    for var in ("FLOWTIDE_HOME", "FLOWTIDE_CA", "FLOWTIDE_CLIENT_CERT", "FLOWTIDE_TOKEN"):
        monkeypatch.setenv(var, "")  # restored at the end: --ca sets FLOWTIDE_CA
        monkeypatch.delenv(var)
    home = tmp_path / "stackhome"
    ca = LocalCA(home / "dev" / "tls")
    ca.ensure()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*map(str, ca.cert("server")))
    context.load_verify_locations(str(ca.ca))
    context.verify_mode = ssl.CERT_REQUIRED
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    url = f"https://127.0.0.1:{server.server_address[1]}"
    (home / "dev" / "tokens.json").write_text(json.dumps({"server_url": url, "admin": "tok-1"}))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # no .flowtide above: only --home can find the stack
    _Api.seen = []
    try:
        yield home, url
    finally:
        server.shutdown()
        server.server_close()


def test_home_finds_the_stacks_token_and_certificates(stack: tuple[Path, str]) -> None:
    home, url = stack
    done = CliRunner().invoke(app, ["list", "--server", url, "--home", str(home), "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output) == []
    assert _Api.seen == ["Bearer tok-1"]


def test_a_ca_without_a_client_certificate_says_mutual_tls(stack: tuple[Path, str]) -> None:
    home, url = stack
    ca = str(home / "dev" / "tls" / "ca.pem")
    done = CliRunner().invoke(app, ["--ca", ca, "list", "--server", url])
    assert done.exit_code != 0
    assert "mutual TLS" in done.output and "FLOWTIDE_CLIENT_CERT" in done.output, done.output
    assert _Api.seen == []


def test_an_unknown_ca_says_which_file_to_give(stack: tuple[Path, str]) -> None:
    _, url = stack
    done = CliRunner().invoke(app, ["list", "--server", url])
    assert done.exit_code != 0
    assert "--ca FILE" in done.output and "dev/tls/ca.pem" in done.output, done.output
