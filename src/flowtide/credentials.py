"""Encrypted credential aliases (`pg_local`, `github_token`, ...).

A credential is a JSON object encrypted with Fernet and kept by a store (the SQLite store in
production) under its alias. The master key comes from the `FLOWTIDE_MASTER_KEY` environment
variable or from `<home>/master.key`, created with mode 0600 on first use.

Either may hold several keys (comma- or line-separated): the first encrypts, all decrypt, so
a rotation (`rotate_key`, `flowtide credential rotate-key`) never leaves a credential that
nobody can read. A vault that cannot decrypt reads its keys again once (another process
rotated them).

Nothing here logs or formats credential values: error messages name aliases only.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from flowtide.errors import CredentialError, NotFoundError
from flowtide.home import find_home

if TYPE_CHECKING:
    from cryptography.fernet import MultiFernet

__all__ = ["MASTER_KEY_ENV", "CredentialStore", "CredentialVault", "MasterKey", "Rotation"]

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

    def reseal(self, reseal: Callable[[bytes], bytes]) -> int:
        """Replace every sealed value by `reseal(token)`, one transaction per database;
        how many."""
        ...


def _how_to_add(name: str) -> str:
    return f"add it with: flowtide credential set {name} --json '{{...}}'"


class MasterKey:
    """The Fernet keys of a flowtide home: `FLOWTIDE_MASTER_KEY`, else `<home>/master.key`
    (created with mode 0600 on first use). Several keys, comma- or line-separated: the
    first encrypts, all decrypt. Loaded once, on first use, under a lock; `reload` reads
    them again (another process rotated them)."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = find_home(home)
        self._fernet: MultiFernet | None = None
        self._loaded_stamp: int | None = None
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

    def cipher(self) -> MultiFernet:
        """The keys as one MultiFernet (encrypt, decrypt, rotate).

        Raises:
            CredentialError: a key is not a valid Fernet key, or the file cannot be read
                or created.
        """
        stamp = self._stamp()
        if self._fernet is not None and stamp == self._loaded_stamp:
            return self._fernet
        with self._lock:
            if self._fernet is None or stamp != self._loaded_stamp:
                self._fernet = self._load_cipher()
                self._loaded_stamp = stamp
            return self._fernet

    def _stamp(self) -> int | None:
        # A rotation rewrites the key file: a stat per use notices it (the environment
        # variable cannot change under a running process).
        if os.environ.get(MASTER_KEY_ENV, "").strip():
            return None
        try:
            return os.stat(self.path).st_mtime_ns
        except OSError:
            return None

    def reload(self) -> None:
        with self._lock:
            self._fernet = None

    def use(self, keys: list[bytes]) -> None:
        """Hold these keys from now on (after a rotation this process made)."""
        from cryptography.fernet import Fernet, MultiFernet

        with self._lock:
            self._fernet = MultiFernet([Fernet(k) for k in keys])
            self._loaded_stamp = self._stamp()

    def keys(self) -> tuple[str, list[bytes]]:
        """(where they came from, the keys, newest first)."""
        env_key = os.environ.get(MASTER_KEY_ENV, "").strip()
        if env_key:
            source = f"${MASTER_KEY_ENV}"
            text = env_key.encode("ascii", errors="replace")
        else:
            source = str(self.path)
            text = self._read_or_create_key_file()
        keys = [k.strip() for k in text.replace(b",", b"\n").splitlines() if k.strip()]
        return source, keys

    def _load_cipher(self) -> MultiFernet:
        from cryptography.fernet import Fernet, MultiFernet

        source, keys = self.keys()
        try:
            return MultiFernet([Fernet(key) for key in keys])
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

    def write(self, path: Path, keys: list[bytes]) -> None:
        """Replace key file `path` (mode 0600) by `keys`, atomically."""
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".master.key.", dir=path.parent)
            try:
                os.fchmod(fd, 0o600)
                with os.fdopen(fd, "wb") as handle:
                    handle.write(b"\n".join(keys) + b"\n")
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
        except OSError as exc:
            raise CredentialError(f"cannot write master key {path}: {exc.strerror}") from None


@dataclass(frozen=True)
class Rotation:
    """What `rotate_key` did: values resealed, where the keys are, how many it holds."""

    resealed: int
    key_file: Path
    keys: int
    from_env: bool


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
    def key(self) -> MasterKey:
        return self._key

    @property
    def key_path(self) -> Path:
        """Where the master key file lives (used when FLOWTIDE_MASTER_KEY is unset)."""
        return self._key.path

    def _cipher(self) -> MultiFernet:
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
                f"credential '{name}' is not defined; {_how_to_add(name)}", missing=True
            ) from None
        try:
            plaintext = self._cipher().decrypt(bytes(ciphertext))
        except InvalidToken:
            # Another process may have rotated the key since this one read it.
            self._key.reload()
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

    def rotate_key(self, new_key_file: Path | None = None, *, retire: bool = False) -> Rotation:
        """Re-encrypt every credential, keychain entry and sealed value of the store.

        Without `retire`: a new key is made and put first (it encrypts from now on) with
        the old ones after it (they still decrypt what a process that had not yet read the
        new key may seal meanwhile), and every value is resealed with it. With `retire`:
        every value is resealed with the first key once more, and the other keys are
        dropped: run it when every process has the new key.

        Keys in the key file: the file is rewritten (processes that use it notice on their
        own). Keys in FLOWTIDE_MASTER_KEY: the new list goes to `new_key_file` (default
        `<home>/master.key.new`, 0600, never printed), to be put in the variable of every
        process that reads credentials.

        Raises:
            CredentialError: a value none of the current keys decrypts (the database of
                that value is unchanged), or the key file cannot be written.
        """
        from cryptography.fernet import Fernet, InvalidToken, MultiFernet

        source, current = self._key.keys()
        self._key.cipher()  # the current keys are valid, or say so
        keys = [current[0]] if retire else [Fernet.generate_key(), *current]
        every = MultiFernet([Fernet(k) for k in (keys if not retire else current)])
        from_env = source.startswith("$")
        target = new_key_file or (
            self._home / (KEY_FILE_NAME + ".new") if from_env else self._key.path
        )

        def reseal(token: bytes) -> bytes:
            try:
                return every.rotate(token)
            except InvalidToken:
                raise CredentialError(
                    f"a stored value does not decrypt with the keys of {source}: not rotated"
                ) from None

        if not retire:
            # First the keys, then the values: whatever stops this, every value decrypts.
            self._key.write(target, keys)
        count = self._store.reseal(reseal)
        if retire:
            self._key.write(target, keys)
        self._key.use(keys)
        return Rotation(count, target, len(keys), from_env)

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
