"""The server's credential vault: it encrypts what the API is given, and never hands a
decrypted value to anyone but the worker holding the command that needs it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flowtide.credentials import CredentialVault

__all__ = ["ServerVault", "server_home"]


class ServerVault(CredentialVault):
    """The server's vault: it encrypts, and never hands out a decrypted value."""

    def seal(self, body: dict[str, Any]) -> bytes:
        """The Fernet token of `body` as compact JSON (what `resolve` decrypts)."""
        plaintext = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
        return self._cipher().encrypt(plaintext)


def server_home() -> Path:
    # Where `flowtide worker` looks too (its --home defaults to $FLOWTIDE_HOME).
    from flowtide.home import find_home
    from flowtide.settings import HomeSection, read

    return find_home(read(HomeSection).home)
