"""NATS decentralised (JWT) authentication for a test nats-server: an operator, one
account with JetStream, and users whose `.creds` files flowtide is given.

Written from the JWT layout nats-server checks: a JSON header and claims, base64url
without padding, signed with the issuer's ed25519 nkey (operator signs accounts, the
account signs its users).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys

__all__ = ["JwtAccount"]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _keypair(prefix: int) -> Any:
    return nkeys.from_seed(bytearray(nkeys.encode_seed(os.urandom(32), prefix)))


def _jwt(issuer: Any, subject: str, name: str, nats: dict[str, Any]) -> str:
    claims: dict[str, Any] = {
        "iat": int(time.time()),
        "iss": issuer.public_key.decode(),
        "name": name,
        "sub": subject,
        "nats": {**nats, "version": 2},
    }
    digest = hashlib.sha512(json.dumps(claims, sort_keys=True).encode()).digest()[:32]
    claims["jti"] = base64.b32encode(digest).rstrip(b"=").decode()
    head = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body = _b64(json.dumps(claims).encode())
    signature = _b64(issuer.sign(f"{head}.{body}".encode()))
    return f"{head}.{body}.{signature}"


@dataclass
class JwtAccount:
    """An operator, one account (JetStream without limits) and the system account that
    JetStream needs in operator mode."""

    operator: Any
    account: Any
    system: Any

    @classmethod
    def create(cls) -> JwtAccount:
        return cls(
            _keypair(nkeys.PREFIX_BYTE_OPERATOR),
            _keypair(nkeys.PREFIX_BYTE_ACCOUNT),
            _keypair(nkeys.PREFIX_BYTE_ACCOUNT),
        )

    def server_config(self, path: Path) -> Path:
        """A nats-server configuration trusting the operator, with the account preloaded."""
        system = self.system.public_key.decode()
        operator = _jwt(
            self.operator,
            self.operator.public_key.decode(),
            "test-operator",
            {"type": "operator", "system_account": system},
        )
        unlimited = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1}
        jetstream = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}
        account = _jwt(
            self.operator,
            self.account.public_key.decode(),
            "flowtide",
            {
                "type": "account",
                "limits": {**unlimited, "wildcards": True, "conn": -1, "leaf": -1, **jetstream},
            },
        )
        doc = {
            "operator": operator,
            "system_account": system,
            "resolver": "MEMORY",
            "resolver_preload": {
                self.account.public_key.decode(): account,
                system: _jwt(self.operator, system, "SYS", {"type": "account"}),
            },
        }
        path.write_text(json.dumps(doc))
        return path

    def creds(self, path: Path, name: str, permissions: dict[str, Any] | None = None) -> Path:
        """A user's `.creds` file: its JWT (signed by the account) and its nkey seed."""
        user = _keypair(nkeys.PREFIX_BYTE_USER)
        claims: dict[str, Any] = {"type": "user", "subs": -1, "data": -1, "payload": -1}
        claims.update(permissions or {})
        token = _jwt(self.account, user.public_key.decode(), name, claims)
        path.write_text(
            "-----BEGIN NATS USER JWT-----\n"
            f"{token}\n"
            "------END NATS USER JWT------\n\n"
            "-----BEGIN USER NKEY SEED-----\n"
            f"{user.seed.decode()}\n"
            "------END USER NKEY SEED------\n"
        )
        path.chmod(0o600)
        return path
