"""CredentialVault over a dict-backed stand-in for the SQLite store."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet

from flowtide.credentials import MASTER_KEY_ENV, CredentialVault, MasterKey
from flowtide.errors import CredentialError

BODY = {"host": "127.0.0.1", "port": 5432, "user": "u", "password": "s3cret-pw"}


def test_round_trip(vault: CredentialVault, store: Any) -> None:
    vault.set("pg_local", BODY, kind="postgres")
    assert vault.resolve("pg_local") == BODY
    kind, ciphertext = store.get_credential("pg_local")
    assert kind == "postgres"
    assert b"s3cret-pw" not in ciphertext
    assert b"127.0.0.1" not in ciphertext


def test_resolve_returns_a_fresh_copy(vault: CredentialVault) -> None:
    vault.set("a", {"x": [1]})
    vault.resolve("a")["x"].append(2)
    assert vault.resolve("a") == {"x": [1]}


def test_set_replaces(vault: CredentialVault) -> None:
    vault.set("a", {"v": 1})
    vault.set("a", {"v": 2}, kind="http")
    assert vault.resolve("a") == {"v": 2}
    assert [(c["name"], c["kind"]) for c in vault.list()] == [("a", "http")]


def test_missing_alias_message(vault: CredentialVault) -> None:
    with pytest.raises(CredentialError) as info:
        vault.resolve("pg_local")
    message = str(info.value)
    assert "pg_local" in message
    assert "flowtide credential set pg_local --json '{...}'" in message


def test_list_has_metadata_only(vault: CredentialVault) -> None:
    vault.set("b", BODY, kind="postgres")
    vault.set("a", {"token": "t0ken-value"}, kind="http")
    listed = vault.list()
    assert [c["name"] for c in listed] == ["a", "b"]
    assert all(set(c) == {"name", "kind", "updated"} for c in listed)
    assert "s3cret-pw" not in repr(listed) and "t0ken-value" not in repr(listed)


def test_delete(vault: CredentialVault) -> None:
    vault.set("a", {"v": 1})
    vault.delete("a")
    assert vault.list() == []
    with pytest.raises(CredentialError, match="'a'"):
        vault.delete("a")
    with pytest.raises(CredentialError):
        vault.resolve("a")


def test_key_file_created_private_and_reused(
    store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(MASTER_KEY_ENV, raising=False)
    home = tmp_path / "fresh" / ".flowtide"
    CredentialVault(store, home).set("a", {"v": 1})
    key_file = home / "master.key"
    assert key_file.is_file()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    Fernet(key_file.read_bytes().strip())  # a valid key
    # A second vault (another process, in effect) decrypts with the same file.
    assert CredentialVault(store, home).resolve("a") == {"v": 1}
    assert [p.name for p in home.iterdir()] == ["master.key"]


def test_default_home_is_the_nearest_dot_flowtide_else_the_users(
    store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(MASTER_KEY_ENV, raising=False)
    monkeypatch.delenv("FLOWTIDE_HOME", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    (tmp_path / "project" / "sub").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "project" / "sub")
    CredentialVault(store).set("a", {"v": 1})
    assert (tmp_path / "xdg" / "flowtide" / "master.key").is_file()
    (tmp_path / "project" / ".flowtide").mkdir(mode=0o700)
    CredentialVault(store).set("b", {"v": 2})
    assert (tmp_path / "project" / ".flowtide" / "master.key").is_file()


def test_concurrent_first_use_agrees_on_one_key(
    store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(MASTER_KEY_ENV, raising=False)
    home = tmp_path / "home"
    keys: list[bytes] = []
    barrier = threading.Barrier(8)

    def first_use() -> None:
        key = MasterKey(home)
        barrier.wait()
        keys.append(key._read_or_create_key_file())

    threads = [threading.Thread(target=first_use) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(keys)) == 1
    assert [p.name for p in home.iterdir()] == ["master.key"]


def test_env_key_wins_and_creates_no_file(
    store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = Fernet.generate_key()
    monkeypatch.setenv(MASTER_KEY_ENV, key.decode())
    home = tmp_path / "home"
    CredentialVault(store, home).set("a", {"v": 1})
    assert not home.exists()
    _, ciphertext = store.get_credential("a")
    assert Fernet(key).decrypt(ciphertext) == b'{"v":1}'


def test_wrong_key(store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MASTER_KEY_ENV, Fernet.generate_key().decode())
    CredentialVault(store, tmp_path).set("a", BODY)
    monkeypatch.setenv(MASTER_KEY_ENV, Fernet.generate_key().decode())
    with pytest.raises(CredentialError) as info:
        CredentialVault(store, tmp_path).resolve("a")
    assert "cannot be decrypted" in str(info.value)
    assert "'a'" in str(info.value)


def test_invalid_env_key(store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MASTER_KEY_ENV, "not-a-fernet-key")
    with pytest.raises(CredentialError) as info:
        CredentialVault(store, tmp_path).set("a", {"v": 1})
    assert MASTER_KEY_ENV in str(info.value)
    assert "not-a-fernet-key" not in str(info.value)


def test_invalid_bodies_and_names(vault: CredentialVault) -> None:
    with pytest.raises(CredentialError):
        vault.set("", {"v": 1})
    with pytest.raises(CredentialError):
        vault.set("a", ["not", "a", "dict"])  # type: ignore[arg-type]
    with pytest.raises(CredentialError) as info:
        vault.set("a", {"v": {1, 2}, "password": "leaky-value"})
    assert "leaky-value" not in str(info.value)


def test_repr_hides_everything(vault: CredentialVault) -> None:
    vault.set("a", BODY)
    text = repr(vault)
    assert "s3cret-pw" not in text
    assert os.fspath(vault.key_path.parent) in text
