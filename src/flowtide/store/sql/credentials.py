"""Credentials (cluster part of `SQLStore`), and re-sealing every value the master key
sealed: the credentials' ciphertexts and the JSON columns that hold a secret.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from flowtide.errors import NotFoundError
from flowtide.sealing import SEALED_PREFIX, Sealer
from flowtide.store.sql.adapter import SQLAdapter


class CredentialTables(SQLAdapter):
    """Credentials (cluster part) and re-sealing."""

    #: Tables whose `ciphertext` the credential master key sealed (cluster part).
    SEALED_TABLES: tuple[str, ...] = ("credential",)
    #: JSON text columns sealed when they hold a secret (flowtide.sealing; shard part).
    SEALED_JSON: ClassVar[tuple[tuple[str, str], ...]] = (
        ("event", "payload"),
        ("event", "error"),
        ("execution", "workload"),
        ("execution", "result"),
        ("execution", "error"),
    )

    def reseal(self, reseal: Callable[[bytes], bytes]) -> int:
        """See `flowtide.store.base.Store.reseal`: one transaction per part (shard, then
        cluster), so each database changes all of its values or none."""
        count = 0
        with self.transaction("reseal sealed values", "shard") as conn:
            for table, column in self.SEALED_JSON:
                rows = conn.execute(
                    self._sql(f"SELECT {column} FROM {table} WHERE {column} LIKE ?"),
                    (SEALED_PREFIX + "%",),
                ).fetchall()
                for (old,) in rows:
                    conn.execute(
                        self._sql(f"UPDATE {table} SET {column} = ? WHERE {column} = ?"),
                        (Sealer.reseal_text(old, reseal), old),
                    )
                    count += 1
        with self.transaction("reseal credentials", "cluster") as conn:
            for table in self.SEALED_TABLES:
                rows = conn.execute(f"SELECT ciphertext FROM {table}").fetchall()
                for (old,) in rows:
                    conn.execute(
                        self._sql(f"UPDATE {table} SET ciphertext = ? WHERE ciphertext = ?"),
                        (reseal(bytes(old)), bytes(old)),
                    )
                    count += 1
            # A webhook's secret (flowtide.triggers.hooks) is a Fernet token of the same key.
            rows = conn.execute(
                "SELECT kind, name, secret FROM trigger_def WHERE secret IS NOT NULL"
            ).fetchall()
            for kind, name, old in rows:
                conn.execute(
                    self._sql("UPDATE trigger_def SET secret = ? WHERE kind = ? AND name = ?"),
                    (reseal(bytes(old)), kind, name),
                )
                count += 1
        return count

    def put_credential(self, name: str, kind: str, ciphertext: bytes, *, updated: float) -> None:
        """See `flowtide.store.base.Store.put_credential`."""
        with self.transaction("put_credential", "cluster") as conn:
            conn.execute(
                self._sql(
                    "INSERT INTO credential (name, kind, ciphertext, created, updated)"
                    " VALUES (?, ?, ?, ?, ?)"
                    " ON CONFLICT (name) DO UPDATE SET kind = excluded.kind,"
                    " ciphertext = excluded.ciphertext, updated = excluded.updated"
                ),
                (name, kind, bytes(ciphertext), updated, updated),
            )

    def get_credential(self, name: str) -> tuple[str, bytes]:
        """See `flowtide.store.base.Store.get_credential`."""
        rows = self._read(
            "get_credential",
            "SELECT kind, ciphertext FROM credential WHERE name = ?",
            (name,),
            "cluster",
        )
        if not rows:
            raise NotFoundError(f"credential {name!r} not found")
        return rows[0][0], bytes(rows[0][1])

    def list_credentials(self) -> list[dict[str, Any]]:
        """See `flowtide.store.base.Store.list_credentials`."""
        rows = self._read(
            "list_credentials",
            "SELECT name, kind, created, updated FROM credential ORDER BY name",
            (),
            "cluster",
        )
        return [{"name": r[0], "kind": r[1], "created": r[2], "updated": r[3]} for r in rows]

    def credential_info(self, name: str) -> dict[str, Any]:
        """Credential `name`'s name, kind, created and updated (never its ciphertext).

        Raises:
            NotFoundError: no such credential.
        """
        rows = self._read(
            "credential_info",
            "SELECT name, kind, created, updated FROM credential WHERE name = ?",
            (name,),
            "cluster",
        )
        if not rows:
            raise NotFoundError(f"credential {name!r} not found")
        r = rows[0]
        return {"name": r[0], "kind": r[1], "created": r[2], "updated": r[3]}

    def delete_credential(self, name: str) -> None:
        """See `flowtide.store.base.Store.delete_credential`."""
        with self.transaction("delete_credential", "cluster") as conn:
            if (
                conn.execute(self._sql("DELETE FROM credential WHERE name = ?"), (name,)).rowcount
                == 0
            ):
                raise NotFoundError(f"credential {name!r} not found")
