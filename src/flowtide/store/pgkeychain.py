"""The keychain (cluster part of `PostgresStore`): NoETL's keychain entries, kept under a
catalog entry (path@version) by name, scope and execution, sealed, with an optional
expiry. PostgreSQL only: the keychain serves the distributed runtime's API.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from flowtide.errors import NotFoundError
from flowtide.store.sql.adapter import SQLAdapter

__all__ = ["KeychainRow", "KeychainTables"]

_KEYCHAIN_COLUMNS: Final = (
    "path, version, name, scope, execution_id, kind, ciphertext, expires, created, updated"
)


@dataclass(frozen=True, slots=True)
class KeychainRow:
    """One keychain entry; `ciphertext` is the Fernet token of its JSON body.

    `scope` is NoETL's: global and catalog entries are shared by every execution of the
    catalog entry; local and shared ones belong to `execution_id` (and its children).
    """

    path: str
    version: int
    name: str
    scope: str
    execution_id: int | None
    kind: str
    ciphertext: bytes
    expires: float | None
    created: float
    updated: float

    @property
    def catalog_id(self) -> str:
        return f"{self.path}@{self.version}"


def _keychain_row(r: Sequence[Any]) -> KeychainRow:
    return KeychainRow(
        path=r[0],
        version=int(r[1]),
        name=r[2],
        scope=r[3],
        execution_id=int(r[4]) or None,
        kind=r[5],
        ciphertext=bytes(r[6]),
        expires=r[7],
        created=r[8],
        updated=r[9],
    )


class KeychainTables(SQLAdapter):
    """The keychain's entries: written, read, deleted and listed, expired ones never
    served."""

    def put_keychain(
        self,
        path: str,
        version: int,
        name: str,
        *,
        scope: str,
        execution_id: int | None,
        kind: str,
        ciphertext: bytes,
        expires: float | None,
        now: float,
    ) -> KeychainRow:
        """Create or replace a keychain entry of catalog entry `path`@`version`; entries
        that have expired (anywhere) are purged in the same transaction.

        Args:
            scope: global, catalog, local or shared.
            execution_id: the owning execution (local/shared scope), else None.
            ciphertext: the encrypted body (never plaintext).
            expires: unix time the entry stops being served; None: never.
            now: the current time (created/updated, and what counts as expired).
        Returns:
            The stored entry.
        Raises:
            NotFoundError: no such catalog entry.
        """
        with self.transaction("put_keychain", "cluster") as conn:
            found = conn.execute(
                "SELECT 1 FROM catalog WHERE path = %s AND version = %s", (path, version)
            ).fetchone()
            if found is None:
                raise NotFoundError(f"catalog entry {path}@{version} not found")
            # SKIP LOCKED: concurrent writers purging the same rows must not deadlock.
            conn.execute(
                "DELETE FROM keychain WHERE (path, version, name, scope, execution_id) IN ("
                "SELECT path, version, name, scope, execution_id FROM keychain"
                " WHERE expires <= %s LIMIT 1000 FOR UPDATE SKIP LOCKED)",
                (now,),
            )
            row = conn.execute(
                f"INSERT INTO keychain ({_KEYCHAIN_COLUMNS})"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (path, version, name, scope, execution_id) DO UPDATE SET"
                " kind = excluded.kind, ciphertext = excluded.ciphertext,"
                " expires = excluded.expires, updated = excluded.updated,"
                # An expired entry the purge skipped is replaced, not renewed.
                " created = CASE WHEN keychain.expires <= excluded.updated"
                " THEN excluded.created ELSE keychain.created END"
                f" RETURNING {_KEYCHAIN_COLUMNS}",
                (
                    path,
                    version,
                    name,
                    scope,
                    execution_id or 0,
                    kind,
                    bytes(ciphertext),
                    expires,
                    now,
                    now,
                ),
            ).fetchone()
        assert row is not None
        return _keychain_row(row)

    def get_keychain(
        self,
        path: str,
        version: int,
        name: str,
        *,
        scope: str,
        execution_id: int | None,
        now: float,
    ) -> KeychainRow:
        """The live keychain entry `name` of `path`@`version` in `scope`.

        Raises:
            NotFoundError: no such entry, or it expired before `now`.
        """
        rows = self._query(
            "get_keychain",
            f"SELECT {_KEYCHAIN_COLUMNS} FROM keychain WHERE path = %s AND version = %s"
            " AND name = %s AND scope = %s AND execution_id = %s",
            (path, version, name, scope, execution_id or 0),
            "cluster",
        )
        return self._live(rows, path, version, name, now)

    def delete_keychain(
        self,
        path: str,
        version: int,
        name: str,
        *,
        scope: str,
        execution_id: int | None,
        now: float,
    ) -> KeychainRow:
        """Delete keychain entry `name` of `path`@`version` in `scope`; the deleted entry.

        Raises:
            NotFoundError: no such entry, or it had expired (it is removed all the same).
        """
        with self.transaction("delete_keychain", "cluster") as conn:
            rows = conn.execute(
                "DELETE FROM keychain WHERE path = %s AND version = %s AND name = %s"
                f" AND scope = %s AND execution_id = %s RETURNING {_KEYCHAIN_COLUMNS}",
                (path, version, name, scope, execution_id or 0),
            ).fetchall()
        return self._live(rows, path, version, name, now)

    def list_keychain(self, path: str, version: int, *, now: float) -> list[KeychainRow]:
        """The live keychain entries of `path`@`version`, by name, scope, execution."""
        rows = self._query(
            "list_keychain",
            f"SELECT {_KEYCHAIN_COLUMNS} FROM keychain WHERE path = %s AND version = %s"
            " AND (expires IS NULL OR expires > %s) ORDER BY name, scope, execution_id",
            (path, version, now),
            "cluster",
        )
        return [_keychain_row(r) for r in rows]

    @staticmethod
    def _live(rows: list[Any], path: str, version: int, name: str, now: float) -> KeychainRow:
        if not rows:
            raise NotFoundError(f"keychain entry {name!r} of {path}@{version} not found")
        entry = _keychain_row(rows[0])
        if entry.expires is not None and entry.expires <= now:
            raise NotFoundError(f"keychain entry {name!r} of {path}@{version} has expired")
        return entry
