"""flowtide API tokens: what they look like, how they are stored, how one is checked.

A token is `ftk_<id>_<secret>`: `id` names the token's row (12 lowercase base32
characters, shown by `flowtide token list`), `secret` is 32 random bytes (base64url).
Only the SHA-256 of the secret is stored, so a copy of the database (or a backup) holds
nothing that authenticates; the secret is shown once, when the token is created. A plain
hash is enough here, unlike passwords: the secret has 256 bits of entropy, so there is
nothing to guess. The `ftk_` prefix lets secret scanners find leaked tokens.

Tokens live in the cluster database (`api_token`, cluster schema 4): every server of the
cluster accepts every token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from flowtide.errors import AuthError, FlowtideError, NotFoundError

if TYPE_CHECKING:
    from flowtide.store.postgres import PostgresStore

__all__ = [
    "ROLES",
    "TokenRecord",
    "TokenStore",
    "generate_token",
    "parse_duration",
    "parse_token",
]

#: The roles a token (or a JWT) can carry; see flowtide.web.access for what each may do.
ROLES: Final = ("reader", "operator", "admin", "worker")
PREFIX: Final = "ftk_"
_ID_BYTES: Final = 8  # 13 base32 characters, 12 kept: 60 bits, unique by the primary key
_SECRET_BYTES: Final = 32
_TOKEN: Final = re.compile(r"ftk_([a-z2-7]{12})_([A-Za-z0-9_-]{43})", re.ASCII)
_POOL: Final = re.compile(r"[A-Za-z0-9_-]{1,64}", re.ASCII)
_NAME: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@:\-]{0,127}", re.ASCII)
_DURATION: Final = re.compile(r"([0-9]+)\s*([smhdw]?)", re.ASCII)
_UNITS: Final = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("ascii")).digest()


def generate_token() -> tuple[str, str, bytes]:
    """A new token: (token text, its id, the digest to store)."""
    token_id = base64.b32encode(secrets.token_bytes(_ID_BYTES)).decode().lower()[:12]
    secret = base64.urlsafe_b64encode(secrets.token_bytes(_SECRET_BYTES)).decode().rstrip("=")
    return f"{PREFIX}{token_id}_{secret}", token_id, _digest(secret)


def parse_token(text: str) -> tuple[str, bytes] | None:
    """(id, digest of the secret) of a well-formed token; None for anything else."""
    match = _TOKEN.fullmatch(text)
    if match is None:
        return None
    return match.group(1), _digest(match.group(2))


def parse_duration(text: str) -> float:
    """Seconds in `30d`, `12h`, `90m`, `3600` (s, m, h, d, w).

    Raises:
        ValueError: not such a duration, or zero.
    """
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a duration such as 30d, 12h, 90m or 3600s")
    seconds = int(match.group(1)) * _UNITS[match.group(2)]
    if seconds <= 0:
        raise ValueError(f"{text!r}: a duration must be positive")
    return float(seconds)


@dataclass(frozen=True)
class TokenRecord:
    """A token's row, without anything that authenticates."""

    token_id: str
    name: str
    role: str
    pool: str | None
    created: float
    expires: float | None
    revoked: float | None
    last_used: float | None

    def active(self, now: float) -> bool:
        return self.revoked is None and (self.expires is None or self.expires > now)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.token_id,
            "name": self.name,
            "role": self.role,
            "pool": self.pool,
            "created": self.created,
            "expires": self.expires,
            "revoked": self.revoked,
            "last_used": self.last_used,
        }


_COLUMNS: Final = "token_id, name, role, pool, created, expires, revoked, last_used"


def _record(row: Sequence[Any]) -> TokenRecord:
    token_id, name, role, pool, created, expires, revoked, last_used = row
    return TokenRecord(token_id, name, role, pool, created, expires, revoked, last_used)


def check_fields(role: str, pool: str | None, name: str | None) -> None:
    """Raise FlowtideError naming the field that a token cannot have."""
    if role not in ROLES:
        raise FlowtideError(f"role: {role!r} is not one of {', '.join(ROLES)}")
    if pool is not None and not _POOL.fullmatch(pool):
        raise FlowtideError(f"pool: {pool!r} is not a pool name ([A-Za-z0-9_-], 1-64)")
    if pool is not None and role != "worker":
        raise FlowtideError("pool: only worker tokens are bound to a pool")
    if name is not None and not _NAME.fullmatch(name):
        raise FlowtideError(
            f"name: {name!r} is not a token name (letters, digits, _ . @ : -; up to 128)"
        )


class TokenStore:
    """The `api_token` rows of a cluster database."""

    def __init__(self, store: PostgresStore) -> None:
        self.store = store

    def create(
        self,
        *,
        role: str,
        name: str | None = None,
        pool: str | None = None,
        expires_in: float | None = None,
        now: float | None = None,
    ) -> tuple[str, TokenRecord]:
        """A new token: its text (shown once, never stored) and its record.

        Raises:
            FlowtideError: a field is invalid, or an active token has this name.
        """
        check_fields(role, pool, name)
        now = time.time() if now is None else now
        text, token_id, digest = generate_token()
        name = name or f"{role}-{token_id[:6]}"
        expires = now + expires_in if expires_in is not None else None
        with self.store.transaction("token create", "cluster") as conn:
            taken = conn.execute(
                "SELECT 1 FROM api_token WHERE name = %s AND revoked IS NULL"
                " AND (expires IS NULL OR expires > %s)",
                (name, now),
            ).fetchone()
            if taken is not None:
                raise FlowtideError(f"name: an active token is already named {name!r}")
            row = conn.execute(
                "INSERT INTO api_token (token_id, name, role, pool, digest, created, expires)"
                f" VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING {_COLUMNS}",
                (token_id, name, role, pool, digest, now, expires),
            ).fetchone()
        assert row is not None  # INSERT ... RETURNING gives its row
        return text, _record(row)

    def list(self, *, include_inactive: bool = False) -> list[TokenRecord]:
        """Every token (the active ones unless `include_inactive`), newest first."""
        now = time.time()
        with self.store.transaction("token list", "cluster") as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM api_token ORDER BY created DESC, token_id"
            ).fetchall()
        records = [_record(r) for r in rows]
        return records if include_inactive else [r for r in records if r.active(now)]

    def revoke(self, id_or_name: str) -> TokenRecord:
        """Revoke the active token with this id or name (idempotent for an id), and end
        the web UI sessions it opened.

        Raises:
            NotFoundError: no token has this id, and no active token this name.
        """
        now = time.time()
        with self.store.transaction("token revoke", "cluster") as conn:
            row = conn.execute(
                f"UPDATE api_token SET revoked = COALESCE(revoked, %s)"
                f" WHERE token_id = %s OR (name = %s AND revoked IS NULL) RETURNING {_COLUMNS}",
                (now, id_or_name, id_or_name),
            ).fetchone()
            if row is not None:
                # Its browsers' sign-ins end with it (flowtide.auth.sessions).
                conn.execute("DELETE FROM ui_session WHERE token_id = %s", (row[0],))
        if row is None:
            raise NotFoundError(f"no token has the id or name {id_or_name!r}")
        return _record(row)

    def any_active(self) -> bool:
        """Whether some token can still authenticate (a server refuses to start without)."""
        with self.store.transaction("token check", "cluster") as conn:
            row = conn.execute(
                "SELECT 1 FROM api_token WHERE revoked IS NULL"
                " AND (expires IS NULL OR expires > %s) LIMIT 1",
                (time.time(),),
            ).fetchone()
        return row is not None

    def verify(self, text: str, *, touch_before: float | None = None) -> TokenRecord:
        """The record of an active token whose secret matches `text`.

        `touch_before`: record the use in `last_used` when the last one is older.

        Raises:
            AuthError: 401, malformed, unknown, revoked or expired (one message for all:
                the caller learns nothing about which tokens exist).
        """
        parsed = parse_token(text)
        refused = AuthError("invalid or expired token", status=401)
        if parsed is None:
            raise refused
        token_id, digest = parsed
        now = time.time()
        with self.store.transaction("token verify", "cluster") as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS}, digest FROM api_token WHERE token_id = %s", (token_id,)
            ).fetchone()
            if row is None or not hmac.compare_digest(bytes(row[-1]), digest):
                raise refused
            record = _record(row[:-1])
            if not record.active(now):
                raise refused
            if touch_before is not None and (record.last_used or 0) < touch_before:
                conn.execute(
                    "UPDATE api_token SET last_used = %s WHERE token_id = %s", (now, token_id)
                )
        return record
