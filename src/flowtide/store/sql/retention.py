"""`RetentionStore` for both SQL adapters (see `flowtide.store.retention`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from flowtide.errors import StoreError
from flowtide.store.base import ENDED_STATUSES
from flowtide.store.retention import Collected
from flowtide.store.sql.adapter import SQLAdapter

__all__ = ["RetentionTables"]

#: Ids removed per statement (well under every driver's parameter limit).
_CHUNK = 500


class _DryRun(Exception):
    """Ends a dry run's transaction (rolled back)."""


class RetentionTables(SQLAdapter):
    #: The per-execution tables besides `execution` (an adapter adds its own).
    GC_TABLES: ClassVar[tuple[str, ...]] = (
        "event",
        "command",
        "execution_summary",
        "notification",
    )

    def collectable(self, *, before: float, statuses: Sequence[str], limit: int = 500) -> list[int]:
        chosen = sorted(set(statuses))
        if not chosen or not set(chosen) <= ENDED_STATUSES:
            raise StoreError(f"only ended executions may go: {', '.join(sorted(ENDED_STATUSES))}")
        ended = sorted(ENDED_STATUSES)
        marks = ", ".join("?" for _ in chosen)
        open_marks = ", ".join("?" for _ in ended)
        rows = self._read(
            "collectable executions",
            f"SELECT x.execution_id FROM execution x WHERE x.status IN ({marks})"  # noqa: S608
            " AND x.updated < ? AND NOT EXISTS (SELECT 1 FROM execution c"
            " WHERE c.parent_execution_id = x.execution_id"
            f" AND c.status NOT IN ({open_marks})) ORDER BY x.updated, x.execution_id LIMIT ?",
            (*chosen, before, *ended, limit),
        )
        return [int(r[0]) for r in rows]

    def collect(self, execution_ids: Sequence[int], *, dry_run: bool = False) -> Collected:
        done = Collected(rows=dict.fromkeys((*self.GC_TABLES, "execution"), 0))
        ids = list(dict.fromkeys(execution_ids))
        try:
            with self.transaction("collect executions") as conn:
                for start in range(0, len(ids), _CHUNK):
                    chunk = ids[start : start + _CHUNK]
                    marks = ", ".join("?" for _ in chunk)
                    for table in (*self.GC_TABLES, "execution"):
                        sql = f"DELETE FROM {table} WHERE execution_id IN ({marks})"  # noqa: S608
                        cur = conn.execute(self._sql(sql), chunk)
                        done.rows[table] += max(cur.rowcount, 0)
                done.executions = done.rows["execution"]
                if dry_run:
                    raise _DryRun  # counted; the transaction rolls back
        except _DryRun:
            pass
        return done

    def reclaim(self) -> None:
        """Nothing here: an adapter gives space back its way."""
