"""Encrypted credential aliases (`pg_local`, `github_token`, ...).

A credential is a JSON object encrypted with Fernet and kept by a store (the SQLite store in
production) under its alias. The master key comes from the `FLOWTIDE_MASTER_KEY` environment
variable or from `<home>/master.key`, created with mode 0600 on first use.

Nothing here logs or formats credential values: error messages name aliases only.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from flowtide.errors import CredentialError, NotFoundError

if TYPE_CHECKING:
    from cryptography.fernet import Fernet

__all__ = ["MASTER_KEY_ENV", "CredentialStore", "CredentialVault", "MasterKey"]

MASTER_KEY_ENV = "FLOWTIDE_MASTER_KEY"
KEY_FILE_NAME = "master.key"


class CredentialStore(Protocol):
    """The persistence the vault needs; the SQLite store implements it."""

    def put_credential(self, name: str, kind: str, ciphertext: bytes, *, updated: float) -> None:
        """Insert or replace credential `name`."""
        ...

    def get_credential(self, name: str) -> tuple[str, bytes]:
        """Return (kind, ciphertext); raise NotFoundError when absent."""
        ...

    def list_credentials(self) -> list[dict[str, Any]]:
        """Metadata of every credential (name, kind, updated), no ciphertext needed."""
        ...

    def delete_credential(self, name: str) -> None:
        """Remove credential `name`; raise NotFoundError when absent."""
        ...


def _how_to_add(name: str) -> str:
    return f"add it with: flowtide credential set {name} --json '{{...}}'"


class MasterKey:
    """The Fernet key of a flowtide home: `FLOWTIDE_MASTER_KEY`, else `<home>/master.key`
    (created with mode 0600 on first use). Loaded once, on first use, under a lock."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = Path(home) if home is not None else Path.cwd() / ".flowtide"
        self._fernet: Fernet | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"MasterKey(home={str(self.home)!r})"

    @property
    def path(self) -> Path:
        """Where the key file lives (used when FLOWTIDE_MASTER_KEY is unset)."""
        return self.home / KEY_FILE_NAME

    @property
    def source(self) -> str:
        """Where the key comes from, for messages: `$FLOWTIDE_MASTER_KEY` or the file."""
        return (
            f"${MASTER_KEY_ENV}" if os.environ.get(MASTER_KEY_ENV, "").strip() else str(self.path)
        )

    def cipher(self) -> Fernet:
        """The Fernet object of the key.

        Raises:
            CredentialError: the key is not a valid Fernet key, or the file cannot be read
                or created.
        """
        if self._fernet is not None:
            return self._fernet
        with self._lock:
            if self._fernet is None:
                self._fernet = self._load()
            return self._fernet

    def _load(self) -> Fernet:
        from cryptography.fernet import Fernet

        env_key = os.environ.get(MASTER_KEY_ENV, "").strip()
        if env_key:
            source = f"${MASTER_KEY_ENV}"
            key = env_key.encode("ascii", errors="replace")
        else:
            source = str(self.path)
            key = self._read_or_create_key_file()
        try:
            return Fernet(key)
        except (ValueError, TypeError):
            raise CredentialError(
                f"the master key in {source} is not a valid Fernet key "
                "(32 url-safe base64-encoded bytes; generate one with "
                "`python -c 'from cryptography.fernet import Fernet; "
                "print(Fernet.generate_key().decode())'`)"
            ) from None

    def _read_or_create_key_file(self) -> bytes:
        from cryptography.fernet import Fernet

        path = self.path
        try:
            return path.read_bytes().strip()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise CredentialError(f"cannot read master key {path}: {exc.strerror}") from None

        try:
            self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
            # Write a private temp file, then hard-link it into place: the link fails if a
            # concurrent process created the key first, and nobody ever sees half a key.
            fd, tmp_name = tempfile.mkstemp(prefix=".master.key.", dir=self.home)
            try:
                os.fchmod(fd, 0o600)
                with os.fdopen(fd, "wb") as handle:
                    handle.write(Fernet.generate_key() + b"\n")
                    handle.flush()
                    os.fsync(handle.fileno())
                try:
                    os.link(tmp_name, path)
                except FileExistsError:
                    pass
            finally:
                os.unlink(tmp_name)
            return path.read_bytes().strip()
        except OSError as exc:
            raise CredentialError(f"cannot create master key {path}: {exc.strerror}") from None


class CredentialVault:
    """Encrypts credential bodies into a store and resolves aliases for tools.

    Implements `flowtide.tools.base.CredentialResolver`. Thread-safe: the key is loaded once
    under a lock and Fernet objects are stateless.
    """

    def __init__(self, store: CredentialStore, home: Path | None = None) -> None:
        """Create a vault over `store`; `home` holds master.key (default ./.flowtide)."""
        self._store = store
        self._key = MasterKey(home)
        self._home = self._key.home

    def __repr__(self) -> str:
        # Never show the key or anything decrypted.
        return f"CredentialVault(home={str(self._home)!r})"

    @property
    def key_path(self) -> Path:
        """Where the master key file lives (used when FLOWTIDE_MASTER_KEY is unset)."""
        return self._key.path

    def _cipher(self) -> Fernet:
        return self._key.cipher()

    # -- public API ------------------------------------------------------------------------

    def set(self, name: str, body: dict[str, Any], kind: str = "generic") -> None:
        """Encrypt `body` and store it as credential `name` (replacing any previous one)."""
        name = self._check_name(name)
        if not isinstance(body, dict):
            raise CredentialError(f"credential '{name}' body must be a JSON object")
        try:
            plaintext = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
        except (TypeError, ValueError):
            # The message of json's error would quote the offending value: keep it out.
            raise CredentialError(f"credential '{name}' body is not JSON-serialisable") from None
        ciphertext = self._cipher().encrypt(plaintext)
        self._store.put_credential(name, str(kind or "generic"), ciphertext, updated=time.time())

    def resolve(self, name: str) -> dict[str, Any]:
        """Return the decrypted body of credential `name`.

        Raises:
            CredentialError: the alias does not exist or the master key cannot decrypt it.
        """
        from cryptography.fernet import InvalidToken

        name = self._check_name(name)
        try:
            _kind, ciphertext = self._store.get_credential(name)
        except NotFoundError:
            raise CredentialError(
                f"credential '{name}' is not defined; {_how_to_add(name)}"
            ) from None
        try:
            plaintext = self._cipher().decrypt(bytes(ciphertext))
        except InvalidToken:
            raise CredentialError(
                f"credential '{name}' cannot be decrypted: the master key "
                f"(${MASTER_KEY_ENV} or {self.key_path}) is not the one it was stored with"
            ) from None
        try:
            body = json.loads(plaintext)
        except ValueError:
            raise CredentialError(f"credential '{name}' holds corrupt data") from None
        if not isinstance(body, dict):
            raise CredentialError(f"credential '{name}' holds corrupt data")
        return body

    def list(self) -> list[dict[str, Any]]:
        """Metadata of every stored credential (name, kind, updated); never the values."""
        items = []
        for item in self._store.list_credentials():
            entry = {k: v for k, v in dict(item).items() if k not in ("ciphertext", "body")}
            items.append(entry)
        return sorted(items, key=lambda entry: str(entry.get("name", "")))

    def delete(self, name: str) -> None:
        """Remove credential `name`; CredentialError when it does not exist."""
        name = self._check_name(name)
        try:
            self._store.delete_credential(name)
        except NotFoundError:
            raise CredentialError(f"credential '{name}' is not defined") from None

    @staticmethod
    def _check_name(name: str) -> str:
        if not isinstance(name, str) or not name.strip():
            raise CredentialError("a credential alias must be a non-empty string")
        return name.strip()
