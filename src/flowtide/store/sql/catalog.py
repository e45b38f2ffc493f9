"""The playbook catalog (cluster part of `SQLStore`): registered versions of each path."""

from __future__ import annotations

from typing import Any, Final

from flowtide.errors import NotFoundError, StoreError
from flowtide.store.base import CatalogRow
from flowtide.store.codec import CATALOG_FIELDS, catalog_row
from flowtide.store.sql.adapter import SQLAdapter

_CATALOG_COLUMNS: Final = (
    f"{CATALOG_FIELDS}, (SELECT COUNT(*) FROM catalog n WHERE n.path = c.path)"
)


class CatalogTables(SQLAdapter):
    """The catalog (cluster part)."""

    def register_playbook(
        self,
        path: str,
        text: str,
        *,
        source_file: str | None,
        created: float,
        version: int | None = None,
    ) -> int:
        """See `flowtide.store.base.Store.register_playbook`."""
        if version is not None and version < 1:
            raise StoreError(f"playbook {path!r}: version must be >= 1, got {version}")
        sql = self._sql
        with self.transaction("register_playbook", "cluster") as conn:
            self._lock_catalog_path(conn, path)
            if version is None:
                latest = conn.execute(
                    sql(
                        "SELECT version, content FROM catalog WHERE path = ?"
                        " ORDER BY version DESC LIMIT 1"
                    ),
                    (path,),
                ).fetchone()
                if latest is not None and latest[1] == text:
                    return int(latest[0])
                version = 1 if latest is None else int(latest[0]) + 1
            else:
                existing = conn.execute(
                    sql("SELECT content FROM catalog WHERE path = ? AND version = ?"),
                    (path, version),
                ).fetchone()
                if existing is not None:
                    if existing[0] == text:
                        return version
                    raise StoreError(
                        f"playbook {path!r} version {version} is already registered "
                        "with different content"
                    )
            conn.execute(
                sql(
                    "INSERT INTO catalog (path, version, content, source_file, created)"
                    " VALUES (?, ?, ?, ?, ?)"
                ),
                (path, version, text, source_file, created),
            )
            return version

    def get_playbook(self, path: str, version: int | None = None) -> CatalogRow:
        """See `flowtide.store.base.Store.get_playbook`."""
        if version is None:
            rows = self._read(
                "get_playbook",
                f"SELECT {_CATALOG_COLUMNS} FROM catalog c WHERE c.path = ?"
                " ORDER BY c.version DESC LIMIT 1",
                (path,),
                "cluster",
            )
            if not rows:
                raise NotFoundError(f"playbook {path!r} not found in the catalog")
        else:
            rows = self._read(
                "get_playbook",
                f"SELECT {_CATALOG_COLUMNS} FROM catalog c WHERE c.path = ? AND c.version = ?",
                (path, version),
                "cluster",
            )
            if not rows:
                raise NotFoundError(f"playbook {path!r} version {version} not found")
        return catalog_row(rows[0])

    def list_playbooks(self) -> list[CatalogRow]:
        """See `flowtide.store.base.Store.list_playbooks`."""
        rows = self._read(
            "list_playbooks",
            f"SELECT {CATALOG_FIELDS}, m.n"
            " FROM catalog c JOIN ("
            "SELECT path, MAX(version) AS v, COUNT(*) AS n FROM catalog GROUP BY path"
            ") m ON c.path = m.path AND c.version = m.v"
            " ORDER BY c.path",
            (),
            "cluster",
        )
        return [catalog_row(r) for r in rows]

    def catalog_entries(self, prefix: str | None = None) -> list[dict[str, Any]]:
        """The latest version of every catalog path starting with `prefix` (all when None
        or empty), without the playbook text: path, version, versions (how many are
        registered), source_file and created; ordered by path."""
        where = ""
        params: tuple[str, ...] = ()
        if prefix:
            # substr/length rather than LIKE: no wildcards to escape, and SQLite's LIKE
            # ignores case.
            where = " WHERE substr(path, 1, length(CAST(? AS text))) = CAST(? AS text)"
            params = (prefix, prefix)
        rows = self._read(
            "catalog_entries",
            "SELECT c.path, c.version, m.n, c.source_file, c.created"
            " FROM catalog c JOIN ("
            f"SELECT path, MAX(version) AS v, COUNT(*) AS n FROM catalog{where} GROUP BY path"
            ") m ON c.path = m.path AND c.version = m.v"
            " ORDER BY c.path",
            params,
            "cluster",
        )
        return [
            {
                "path": r[0],
                "version": int(r[1]),
                "versions": int(r[2]),
                "source_file": r[3],
                "created": r[4],
            }
            for r in rows
        ]
