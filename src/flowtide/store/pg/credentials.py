"""Reading the `credential` table of the cluster database without a store (the shard
map's logins are resolved before any shard is open: `flowtide.topology`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowtide.errors import NotFoundError

if TYPE_CHECKING:
    import psycopg

__all__ = ["Credentials"]


class Credentials:
    """A `flowtide.credentials.CredentialStore` (read side) over one connection."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn

    def get_credential(self, name: str) -> tuple[str, bytes]:
        """(kind, ciphertext) of credential `name`.

        Raises:
            NotFoundError: no such credential.
        """
        row = self.conn.execute(
            "SELECT kind, ciphertext FROM credential WHERE name = %s", (name,)
        ).fetchone()
        if row is None:
            raise NotFoundError(f"credential {name!r} not found")
        return str(row[0]), bytes(row[1])

    def exists(self, name: str) -> bool:
        row = self.conn.execute("SELECT 1 FROM credential WHERE name = %s", (name,)).fetchone()
        return row is not None
