"""Where NATS credentials come from and what each NATS user may do (pure logic; the
real nats-server checks are in tests/distributed/test_nats_permissions.py)."""

from __future__ import annotations

import json
import os
import ssl
from pathlib import Path

import pytest

from flowtide.dev.nats import flowtide_users, new_passwords, write_nats_config
from flowtide.errors import NatsError
from flowtide.natsauth import NatsAuth, url_has_credentials
from flowtide.subjects import pool_consumer, server_permissions, worker_inbox, worker_permissions

CREDS = """-----BEGIN NATS USER JWT-----
eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.e30.c2ln
------END NATS USER JWT------

-----BEGIN USER NKEY SEED-----
SUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC4
------END USER NKEY SEED------
"""


def test_env_credentials_and_the_flag() -> None:
    env = {"FLOWTIDE_NATS_USER": "server", "FLOWTIDE_NATS_PASSWORD": "pw-1"}
    auth = NatsAuth.from_env(env)
    assert auth.options("nats://127.0.0.1:4222") == {"user": "server", "password": "pw-1"}
    assert "pw-1" not in repr(auth)
    assert NatsAuth.from_env(auth.env()) == auth
    assert NatsAuth.from_env({"FLOWTIDE_NATS_CREDS": "/a"}, creds="/b").creds == "/b"
    assert not NatsAuth.from_env({})


def test_url_credentials_win() -> None:
    auth = NatsAuth(user="server", password="pw-1")
    assert auth.options("nats://other:pw-2@127.0.0.1:4222") == {}
    assert auth.options("nats://tok3n@h:4222") == {}
    assert url_has_credentials("nats://h1:4222,nats://u:p@h2:4222")
    assert not url_has_credentials("nats://h1:4222,nats://h2:4222")


def test_creds_file_is_passed_to_nats_py(tmp_path: Path) -> None:
    creds = tmp_path / "worker.creds"
    creds.write_text(CREDS)
    assert NatsAuth(creds=str(creds)).options("nats://h:4222") == {"user_credentials": str(creds)}


@pytest.mark.parametrize(
    ("auth", "message"),
    [
        (NatsAuth(user="u"), "FLOWTIDE_NATS_USER is set but FLOWTIDE_NATS_PASSWORD is not"),
        (NatsAuth(password="p"), "FLOWTIDE_NATS_PASSWORD is set but FLOWTIDE_NATS_USER is not"),
        (NatsAuth(user="u", password="p", creds="/x"), "not both"),
        (NatsAuth(creds="/no/such.creds"), "cannot read the NATS credentials file /no/such.creds"),
    ],
)
def test_incomplete_credentials_say_what_is_missing(auth: NatsAuth, message: str) -> None:
    with pytest.raises(NatsError, match=message):
        auth.options("nats://h:4222")


def test_a_file_that_is_not_a_creds_file(tmp_path: Path) -> None:
    other = tmp_path / "password.txt"
    other.write_text("hunter2\n")
    with pytest.raises(NatsError, match="is not a NATS .creds file") as info:
        NatsAuth(creds=str(other)).check()
    assert "hunter2" not in str(info.value)


def test_worker_permissions_name_only_its_pool() -> None:
    perms = worker_permissions("gpu")
    assert perms.publish == (
        "$JS.API.CONSUMER.MSG.NEXT.FLOWTIDE_COMMANDS.flowtide-gpu",
        "$JS.API.CONSUMER.INFO.FLOWTIDE_COMMANDS.flowtide-gpu",
        "$JS.ACK.FLOWTIDE_COMMANDS.flowtide-gpu.>",
        "flowtide.logs.gpu.>",
    )
    assert perms.subscribe == ("_WORKER_INBOX.gpu.>",)
    assert worker_inbox("gpu") + ".>" in perms.subscribe
    joined = " ".join(perms.publish + perms.subscribe)
    assert "$KV" not in joined and "flowtide.commands" not in joined
    assert not any(s.startswith("_INBOX.") for s in perms.subscribe)
    assert "flowtide.commands.>" in server_permissions("flowtide_state").publish


@pytest.mark.parametrize("pool", ["a.b", "a>", "*", "", "a b"])
def test_a_pool_name_cannot_widen_a_permission(pool: str) -> None:
    with pytest.raises(ValueError, match="invalid pool name"):
        worker_permissions(pool)
    with pytest.raises(ValueError, match="invalid pool name"):
        pool_consumer(pool)


def test_config_file_is_private_and_quotes_subjects(tmp_path: Path) -> None:
    passwords = new_passwords(["default"])
    assert set(passwords) == {"server", "worker-default"}
    assert new_passwords(["default", "gpu"], passwords)["server"] == passwords["server"]
    path = tmp_path / "nats.conf"
    write_nats_config(path, flowtide_users(passwords, ["default"], "flowtide_state"))
    assert os.stat(path).st_mode & 0o777 == 0o600
    users = {u["user"]: u for u in json.loads(path.read_text())["authorization"]["users"]}
    assert users["worker-default"]["password"] == passwords["worker-default"]
    assert users["worker-default"]["permissions"]["subscribe"] == {
        "allow": ["_WORKER_INBOX.default.>"]
    }


def test_a_ca_file_makes_a_verifying_tls_context(tmp_path: Path) -> None:
    from flowtide.dev.tls import LocalCA

    ca = LocalCA(tmp_path / "tls")
    ca.ensure()
    auth = NatsAuth.from_env(
        {"FLOWTIDE_NATS_CA": str(ca.ca), "FLOWTIDE_NATS_USER": "u"}
        | {"FLOWTIDE_NATS_PASSWORD": "p"}
    )
    assert NatsAuth.from_env(auth.env()) == auth
    options = auth.options("tls://127.0.0.1:4222")
    context = options.pop("tls")
    assert options == {"user": "u", "password": "p"}
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    # A URL with credentials keeps them, and still verifies the server.
    assert set(auth.options("nats://a:b@127.0.0.1:4222")) == {"tls"}
    with pytest.raises(NatsError, match="FLOWTIDE_NATS_CA: no such file"):
        NatsAuth(ca=str(tmp_path / "missing.pem")).options("tls://127.0.0.1:4222")
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(NatsError, match="cannot load"):
        NatsAuth(ca=str(tmp_path / "junk.pem")).options("tls://127.0.0.1:4222")


def test_the_nats_config_requires_tls_when_given_a_certificate(tmp_path: Path) -> None:
    users = flowtide_users(new_passwords(["default"]), ["default"], "flowtide_state")
    path = tmp_path / "nats.conf"
    write_nats_config(path, users, tls=(tmp_path / "c.pem", tmp_path / "k.pem"))
    doc = json.loads(path.read_text())
    assert doc["tls"]["cert_file"] == str(tmp_path / "c.pem")
    write_nats_config(path, users)
    assert "tls" not in json.loads(path.read_text())
