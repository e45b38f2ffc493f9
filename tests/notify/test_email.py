"""Email notifications against a real SMTP server in-process (aiosmtpd): STARTTLS, the
login from a credential alias, the document in the body."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, Envelope, LoginPassword, Session

from flowtide.notify.ssrf import TargetPolicy
from flowtide.notify.targets import Sender

PASSWORD = "smtp-pass-" + "x" * 12


def _cert(tmp_path: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "smtp.pem", tmp_path / "smtp.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


class Inbox:
    def __init__(self) -> None:
        self.messages: list[Envelope] = []

    async def handle_DATA(self, server: Any, session: Session, envelope: Envelope) -> str:  # noqa: N802
        self.messages.append(envelope)
        return "250 OK"


def _auth(
    server: Any, session: Session, envelope: Envelope, mechanism: str, data: Any
) -> AuthResult:
    ok = (
        isinstance(data, LoginPassword)
        and data.login == b"ops"
        and data.password == PASSWORD.encode()
    )
    return AuthResult(success=ok)


@pytest.fixture
def smtp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, Inbox]]:
    import ssl

    cert, key = _cert(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    # The client trusts this server's certificate only (ssl's default verify paths).
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    inbox = Inbox()
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    controller = Controller(
        inbox,
        hostname="127.0.0.1",
        port=port,
        tls_context=context,
        require_starttls=True,
        authenticator=_auth,
        auth_require_tls=True,
    )
    controller.start()
    try:
        yield port, inbox
    finally:
        controller.stop()


class Vault:
    def resolve(self, name: str) -> dict[str, Any]:
        assert name == "smtp_login"
        return {"user": "ops", "password": PASSWORD}


DOC = {
    "execution_id": "42",
    "transition": "failed",
    "status": "failed",
    "playbook": {"path": "tests/x", "name": "x"},
    "error": {"kind": "python_error", "message": "boom"},
}


def test_email_over_starttls_with_a_credential_login(smtp: tuple[int, Inbox]) -> None:
    port, inbox = smtp
    sender = Sender(TargetPolicy.from_setting("127.0.0.1"), timeout=10, credentials=Vault())
    config = {
        "to": ["oncall@example.org"],
        "subject": "{{ playbook.path }} {{ transition }}",
        "smtp": {"host": "127.0.0.1", "port": port, "starttls": True, "credential": "smtp_login"},
    }
    got = sender.send("email", config, DOC)
    assert got.ok, got
    (envelope,) = inbox.messages
    assert envelope.rcpt_tos == ["oncall@example.org"]
    text = (
        envelope.content.decode() if isinstance(envelope.content, bytes) else str(envelope.content)
    )
    assert "Subject: tests/x failed" in text and "boom" in text
    assert PASSWORD not in text


def test_a_wrong_login_fails_without_showing_it(smtp: tuple[int, Inbox]) -> None:
    port, inbox = smtp

    class Wrong(Vault):
        def resolve(self, name: str) -> dict[str, Any]:
            return {"user": "ops", "password": "not-" + PASSWORD}

    sender = Sender(TargetPolicy.from_setting("127.0.0.1"), timeout=2, credentials=Wrong())
    config = {"to": "a@example.org", "smtp": {"host": "127.0.0.1", "port": port, "credential": "x"}}
    got = sender.send("email", config, DOC)
    # (aiosmtpd answers a refused login late: a 535 or a timeout, either way not sent.)
    assert not got.ok and PASSWORD not in (got.error or "")
    assert inbox.messages == []


def test_smtp_on_loopback_is_refused_without_the_allow_list(smtp: tuple[int, Inbox]) -> None:
    port, inbox = smtp
    sender = Sender(TargetPolicy.from_setting(None), credentials=Vault())
    got = sender.send("email", {"to": "a@b", "smtp": {"host": "127.0.0.1", "port": port}}, DOC)
    assert not got.ok and not got.retry and "loopback" in (got.error or "")


def test_a_multiline_subject_is_one_line_and_injects_no_header(smtp: tuple[int, Inbox]) -> None:
    # A subject from a template over the run's error: a traceback has newlines. Sent, on
    # one line, with no header of its own (it used to fail every attempt, retried).
    port, inbox = smtp
    sender = Sender(TargetPolicy.from_setting("127.0.0.1"), timeout=10, credentials=Vault())
    doc = {**DOC, "error": {"message": "boom\r\nBcc: attacker@example.org\nline 3"}}
    config = {
        "to": ["oncall@example.org"],
        "subject": "failed: {{ error.message }}",
        "smtp": {"host": "127.0.0.1", "port": port, "credential": "smtp_login"},
    }
    got = sender.send("email", config, doc)
    assert got.ok, got
    (envelope,) = inbox.messages
    assert envelope.rcpt_tos == ["oncall@example.org"]
    text = (
        envelope.content.decode() if isinstance(envelope.content, bytes) else str(envelope.content)
    )
    headers = text.replace("\r\n", "\n").split("\n\n", 1)[0]
    assert "\nBcc:" not in headers
    assert "Subject: failed: boom Bcc: attacker@example.org line 3" in headers


@pytest.mark.parametrize(
    "field",
    [
        {"to": "oncall@example.org\r\nRCPT TO:<attacker@example.org>"},
        {"to": ["oncall@example.org", "x@example.org\nBcc: attacker@example.org"]},
        {"from": "flowtide@example.org\r\nBcc: attacker@example.org"},
    ],
)
def test_a_recipient_or_sender_with_a_line_break_is_refused_for_good(
    smtp: tuple[int, Inbox], field: dict[str, Any]
) -> None:
    port, inbox = smtp
    sender = Sender(TargetPolicy.from_setting("127.0.0.1"), timeout=10, credentials=Vault())
    config = {
        "to": ["oncall@example.org"],
        **field,
        "smtp": {"host": "127.0.0.1", "port": port, "credential": "smtp_login"},
    }
    got = sender.send("email", config, DOC)
    assert not got.ok and not got.retry, got
    assert inbox.messages == []
