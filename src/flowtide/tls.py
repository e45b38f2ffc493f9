"""TLS for the API: what a client trusts and shows, and the server's certificate settings.

A client (the CLI, the worker, the Python client) verifies an `https://` server against
the system's CAs, or against the CA file in `FLOWTIDE_CA` (`flowtide --ca FILE ...`,
`flowtide worker --ca FILE`); for mutual TLS it shows the certificate and key in
`FLOWTIDE_CLIENT_CERT` / `FLOWTIDE_CLIENT_KEY`. Talking to the dev stack's own URL, the
stack's CA and client certificate are used without any setting (`<home>/dev/tls/`), as
its admin token is (flowtide.auth.login).
"""

from __future__ import annotations

import json
import ssl
from dataclasses import dataclass
from pathlib import Path

from flowtide.errors import FlowtideError

__all__ = ["ClientTls", "client_tls"]

CA_ENV = "FLOWTIDE_CA"
CERT_ENV = "FLOWTIDE_CLIENT_CERT"
KEY_ENV = "FLOWTIDE_CLIENT_KEY"


@dataclass(frozen=True)
class ClientTls:
    """Where a client's trust and identity come from (None: the defaults)."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    def context(self) -> ssl.SSLContext:
        """An SSL context verifying the server (hostname included) against `ca` (or the
        system's CAs), showing `cert` when given.

        Raises:
            FlowtideError: a file is missing or is not a certificate / key.
        """
        try:
            ctx = ssl.create_default_context(cafile=self.ca)
            if self.cert:
                ctx.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            which = self.ca if self.cert is None else f"{self.ca or 'system CAs'}, {self.cert}"
            raise FlowtideError(f"TLS files {which}: {exc}") from None
        return ctx


def _dev_tls(server: str, home: Path | None) -> ClientTls | None:
    if home is None:
        from flowtide.home import find_home
        from flowtide.settings import HomeSection, read

        home = find_home(read(HomeSection).home)
    tls = home / "dev" / "tls"
    try:
        doc = json.loads((home / "dev" / "tokens.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    from flowtide.auth.login import dev_urls

    if not isinstance(doc, dict) or server not in dev_urls(doc):
        return None
    if not (tls / "ca.pem").is_file():
        return None
    cert, key = tls / "admin.pem", tls / "admin-key.pem"
    if cert.is_file() and key.is_file():
        return ClientTls(str(tls / "ca.pem"), str(cert), str(key))
    return ClientTls(str(tls / "ca.pem"))


def client_tls(server: str, *, ca: str | None = None, home: Path | None = None) -> ClientTls:
    """The TLS settings of a client of `server` (see the module's docstring)."""
    server = server.rstrip("/")
    from flowtide.settings import ClientSection, read

    client = read(ClientSection)
    env_ca = ca or client.ca or None
    cert = client.client_cert or None
    key = client.client_key or None
    if env_ca or cert:
        return ClientTls(env_ca, cert, key)
    if server.startswith("https://"):
        found = _dev_tls(server, home)
        if found is not None:
            return found
    return ClientTls()
