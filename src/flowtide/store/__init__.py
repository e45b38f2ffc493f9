"""The store port (event log, commands, executions, catalog, credentials).

Adapters live side by side and are imported explicitly, so importing the port never
pulls in a database driver: `from flowtide.store.sqlite import SQLiteStore`.

Modules: the port (`base`), its adapters `sqlite` and `postgres`, what both write once
(`sql`, a package by group of tables: executions, catalog, credentials; `codec`, JSON
columns and row mapping); PostgreSQL's schema (`pgschema`) and keychain (`pgkeychain`,
part of `PostgresStore`); `pg`, every statement the server runs, one function each.
"""

from flowtide.store.base import (
    COMMAND_STATUSES,
    EXECUTION_CREATED,
    PENDING_COMMAND_STATUSES,
    UNSET,
    CatalogRow,
    CommandRow,
    CommandUpdate,
    ExecutionRow,
    ExecutionUpdate,
    Store,
    Unset,
)

__all__ = [
    "COMMAND_STATUSES",
    "EXECUTION_CREATED",
    "PENDING_COMMAND_STATUSES",
    "UNSET",
    "CatalogRow",
    "CommandRow",
    "CommandUpdate",
    "ExecutionRow",
    "ExecutionUpdate",
    "Store",
    "Unset",
]
