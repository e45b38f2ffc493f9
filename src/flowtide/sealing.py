"""Sealing at rest: stored JSON that holds a secret is kept encrypted, read back intact.

A value that a tool touched (a password, a token, a DSN) joins its execution's secret set
(`secrets.added` events). Any stored text of that execution containing a value of the set
— an event's payload or error, the execution row's result, error or workload — is written
sealed: a Fernet token of the JSON text, made with the credential master key
(`FLOWTIDE_MASTER_KEY` or `<home>/master.key`), in the spirit of Temporal's payload codec.
`secrets.added` events are always sealed. Readers of the store get the intact value back:
the engine and later steps read what the tool returned, unchanged. Display paths mask
secrets instead (`flowtide.redaction`).

A sealed column holds `{"$sealed":"<token>"}`, still JSON, so ad-hoc queries can tell it
apart (and cast it) without the key. Text that happens to start like that is sealed too,
so every stored text with the prefix is a token.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable
from functools import lru_cache
from pathlib import Path
from typing import Final

from flowtide.credentials import MasterKey
from flowtide.errors import CredentialError, StoreError

__all__ = ["SEALED_PREFIX", "Sealer", "needles"]

SEALED_PREFIX: Final = '{"$sealed":"'
_SUFFIX: Final = '"}'
# The store's JSON encoder escapes everything outside ASCII; a needle must be written the
# way the value appears inside that text.
_escape = json.JSONEncoder(ensure_ascii=True).encode


@lru_cache(maxsize=1024)
def _needles(secrets: frozenset[str]) -> tuple[str, ...]:
    return tuple(sorted({_escape(s)[1:-1] for s in secrets if s}, key=len, reverse=True))


def needles(secrets: Iterable[str]) -> tuple[str, ...]:
    """The forms in which the values of `secrets` appear in stored JSON text."""
    return _needles(secrets if isinstance(secrets, frozenset) else frozenset(secrets))


class Sealer:
    """Seals and unseals stored JSON text with the master key of `home`.

    The key is loaded on first use only: a store that never meets a secret never needs
    (nor creates) a key file.
    """

    def __init__(self, home: Path | None = None, *, key: MasterKey | None = None) -> None:
        self.key = key or MasterKey(home)

    def __repr__(self) -> str:
        return f"Sealer({self.key!r})"

    def seal(self, text: str) -> str:
        """`text` as a sealed column value.

        Raises:
            StoreError: the master key is unusable.
        """
        try:
            token = self.key.cipher().encrypt(text.encode("utf-8", "surrogatepass"))
        except CredentialError as exc:
            raise StoreError(f"cannot seal a value that holds a secret: {exc}") from None
        return SEALED_PREFIX + token.decode("ascii") + _SUFFIX

    def unseal(self, text: str, what: str) -> str:
        """The JSON text inside a sealed column value; `what` names it in errors.

        Raises:
            StoreError: the master key is unusable, or is not the one `text` was sealed with.
        """
        from cryptography.fernet import InvalidToken

        token = text[len(SEALED_PREFIX) : -len(_SUFFIX)].encode("ascii")
        try:
            try:
                plain = self.key.cipher().decrypt(token)
            except (InvalidToken, ValueError):
                # Another process may have rotated the key since this one read it.
                self.key.reload()
                plain = self.key.cipher().decrypt(token)
        except CredentialError as exc:
            raise StoreError(f"{what} is sealed and cannot be read: {exc}") from None
        except (InvalidToken, ValueError):
            raise StoreError(
                f"{what} is sealed with another master key than the one in {self.key.source}"
            ) from None
        return plain.decode("utf-8", "surrogatepass")

    @staticmethod
    def reseal_text(text: str, reseal: Callable[[bytes], bytes]) -> str:
        """A sealed column value with its token passed through `reseal` (a key rotation)."""
        token = text[len(SEALED_PREFIX) : -len(_SUFFIX)].encode("ascii")
        return SEALED_PREFIX + reseal(token).decode("ascii") + _SUFFIX

    def store_text(self, text: str, secrets: Collection[str] = (), *, always: bool = False) -> str:
        """What to store for the JSON `text`: sealed when `always`, when it holds a value
        of `secrets`, or when it would read as sealed; else `text` itself."""
        if always or text.startswith(SEALED_PREFIX):
            return self.seal(text)
        if secrets:
            for needle in needles(secrets):
                if needle in text:
                    return self.seal(text)
        return text
