"""A local certificate authority for the dev stack (the `cryptography` library).

`flowtide dev up` makes, once, in `<home>/dev/tls/` (keys mode 0600):

* `ca.pem` / `ca-key.pem`: a CA that signs the rest and that clients trust;
* `server.pem` / `server-key.pem`: the API server's certificate (127.0.0.1, localhost);
* `admin.pem` / `admin-key.pem` and `worker.pem` / `worker-key.pem`: client certificates
  for mutual TLS (the server requires one when the stack runs with it);
* `peer.pem` / `peer-key.pem`: the client certificate a server shows another shard's
  server when it forwards a request to it (`flowtide dev up --shards N`).

Keys are ECDSA P-256; certificates last a year and are made again when they are about to
expire or the CA changed.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from pathlib import Path
from typing import Any

__all__ = ["LocalCA"]

_LIFETIME = dt.timedelta(days=365)
_RENEW_BEFORE = dt.timedelta(days=7)


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


class LocalCA:
    """The dev stack's CA and the certificates it signed, under `folder`."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    @property
    def ca(self) -> Path:
        return self.folder / "ca.pem"

    def cert(self, name: str) -> tuple[Path, Path]:
        """(certificate, key) of `name` (server, admin, worker, peer, route: the
        certificate nats-server cluster nodes show each other, as server and as client)."""
        return self.folder / f"{name}.pem", self.folder / f"{name}-key.pem"

    def ensure(self) -> None:
        """Make what is missing or about to expire."""
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization

        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        ca_key_path = self.folder / "ca-key.pem"
        renewed = False
        if not self._fresh(self.ca) or not ca_key_path.is_file():
            ca_key, ca_cert = self._new_ca()
            _write(ca_key_path, _pem_key(ca_key), 0o600)
            _write(self.ca, ca_cert.public_bytes(serialization.Encoding.PEM), 0o644)
            renewed = True
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), None)
        ca_cert = x509.load_pem_x509_certificate(self.ca.read_bytes())
        for name, server in (
            ("server", True),
            ("admin", False),
            ("worker", False),
            ("peer", False),
            ("route", True),
        ):
            cert_path, key_path = self.cert(name)
            if renewed or not self._fresh(cert_path) or not key_path.is_file():
                key, cert = self._issue(ca_key, ca_cert, name, server=server)
                _write(key_path, _pem_key(key), 0o600)
                _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)

    @staticmethod
    def _fresh(path: Path) -> bool:
        from cryptography import x509

        try:
            cert = x509.load_pem_x509_certificate(path.read_bytes())
        except (OSError, ValueError):
            return False
        return cert.not_valid_after_utc - _RENEW_BEFORE > dt.datetime.now(dt.UTC)

    @staticmethod
    def _new_ca() -> tuple[Any, Any]:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "flowtide dev CA")])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        return key, cert

    @staticmethod
    def _issue(ca_key: Any, ca_cert: Any, name: str, *, server: bool) -> tuple[Any, Any]:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        usage = [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
        if name == "route":  # a node dials the others with it: a client too
            usage.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"flowtide {name}")]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _LIFETIME)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.DNSName("localhost"),
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    ]
                ),
                critical=False,
            )
        return key, builder.sign(ca_key, hashes.SHA256())


def _pem_key(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
