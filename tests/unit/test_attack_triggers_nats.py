"""Attacks through a subscription's `auth`: a definition that names a file on the
server that listens (`/dev/zero` was read until memory ran out, a FIFO waited on for
ever) or carries a secret; and the .creds check that every NATS connection makes."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from flowtide.errors import NatsError, TriggerError
from flowtide.natsauth import MAX_CREDS_BYTES, NatsAuth
from flowtide.triggers.subscription import subscription_from_document


def _doc(auth: Any) -> dict[str, Any]:
    return {
        "kind": "Subscription",
        "metadata": {"name": "s"},
        "spec": {"playbook": "p", "url": "nats://127.0.0.1:9", "subject": "a", "auth": auth},
    }


@pytest.mark.parametrize(
    "auth",
    [
        {"creds": "/dev/zero"},
        {"credential": "nats", "creds": "/etc/passwd"},
        {"credentials_file": "/etc/passwd"},
        {"credential": "nats", "tls_ca": "/etc/hostname"},
        {"ca": "/etc/hostname"},
        {"credential": "nats", "password": "p4ss"},
        {"nats_password": "p4ss"},
        {"token": "t0k"},
        {"nats_token": "t0k"},
        {"credential": "nats", "url": "nats://u:p4ss@127.0.0.1:9"},
        {"credential": "nats", "servers": "u:p4ss@127.0.0.1:9"},
        {"credential": ["a", "b"]},
    ],
)
def test_an_auth_mapping_with_a_file_or_a_secret_is_refused(auth: dict[str, Any]) -> None:
    with pytest.raises(TriggerError) as refused:
        subscription_from_document(_doc(auth))
    assert refused.value.field == "auth"


def test_an_auth_mapping_may_name_a_credential_and_override_server_and_user() -> None:
    auth = {"credential": "nats", "url": "nats://127.0.0.1:9", "user": "orders"}
    assert subscription_from_document(_doc(auth)).auth == auth


def _quickly(work: Any, seconds: float = 5.0) -> BaseException | None:
    out: list[BaseException | None] = []

    def run() -> None:
        try:
            work()
            out.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    began = time.monotonic()
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {time.monotonic() - began:.1f} s"
    return out[0]


def test_a_creds_path_that_is_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "creds.fifo"
    os.mkfifo(fifo)
    error = _quickly(NatsAuth(creds=str(fifo)).check)
    assert isinstance(error, NatsError) and "regular file" in str(error)


def test_a_creds_file_larger_than_one_is_refused_unread(tmp_path: Path) -> None:
    big = tmp_path / "big.creds"
    body = b"-----BEGIN NATS USER JWT-----\nx\n-----BEGIN USER NKEY SEED-----\ny\n"
    big.write_bytes(body + b"#" * (MAX_CREDS_BYTES + 1))
    error = _quickly(NatsAuth(creds=str(big)).check)
    assert isinstance(error, NatsError) and "KiB" in str(error)


def test_a_character_device_is_refused_unread() -> None:
    if not Path("/dev/null").exists():
        pytest.skip("no /dev/null")
    error = _quickly(NatsAuth(creds="/dev/null").check)
    assert isinstance(error, NatsError) and "regular file" in str(error)
