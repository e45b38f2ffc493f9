"""Port methods whose SQL is the same on SQLite and PostgreSQL, written once.

An adapter subclasses `SQLStore` and provides `transaction(op, part)` (one write
transaction on a connection whose `execute` returns a cursor), `_query(op, sql, params,
part)` (one read), and `PARAM`, its driver's placeholder. The SQL here is written with
`?` and turned into the adapter's placeholder once per statement (`_sql`). `part` says
which database a statement belongs to: "shard" (per-execution tables) or "cluster"
(catalog, credentials); a single-database adapter ignores it.

What differs between the adapters stays in them: opening and migrating, `write_batch`
(how a prepared batch reaches the database inside `append`'s transaction), duplicate
detection (`_is_duplicate`) and `close`. An adapter sets
`sealer`, the `flowtide.sealing.Sealer` its JSON columns are sealed and unsealed with.

Modules: `adapter` (what an adapter provides, and the placeholder conversion), then one
per group of tables, each a part of `SQLStore`: `executions` (executions, their events,
commands and kept summaries: the shard part), `notifications` (the deliveries transitions owe: shard part), `catalog` and
`retention` (removing ended executions: `flowtide gc`), `credentials` (the cluster
part; `credentials` also re-seals every sealed value when the master key changes).
"""

from __future__ import annotations

from flowtide.store.sql.catalog import CatalogTables
from flowtide.store.sql.credentials import CredentialTables
from flowtide.store.sql.executions import (
    INSERT_EVENT,
    PUT_SUMMARY,
    UPSERT_COMMAND,
    ExecutionTables,
)
from flowtide.store.sql.notifications import NotificationTables
from flowtide.store.sql.retention import RetentionTables

__all__ = ["INSERT_EVENT", "PUT_SUMMARY", "UPSERT_COMMAND", "SQLStore"]


class SQLStore(
    ExecutionTables, NotificationTables, RetentionTables, CatalogTables, CredentialTables
):
    """The shared half of the SQL adapters (see the module docstring)."""
