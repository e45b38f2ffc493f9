"""The PostgreSQL statements of the distributed runtime, one function each.

The server (`flowtide.server`) holds no SQL: it calls these. Each function takes the
connection it runs on and works inside the caller's transaction (the caller commits or
rolls back), so whoever holds the connection decides where a statement runs: a sharded
server hands each call the connection of the execution's shard. Rows come back with
names (frozen dataclasses and NamedTuples), never as `row[9]`.

The step's and the claim's transactions send several statements in one round trip (a
psycopg pipeline). A function whose statement takes part in one returns a `Pending`: the
statement is sent (or queued) at once and its rows are read by `Pending.result()` once
the statements after it are queued too. Reading it before that costs a round trip.

Modules by table: `executions`, `events` (the log: catch-up, the live stream, variables'
history), `commands` (the step's rows, claims, leases), `outbox`, `notifications`, `firings` (a burst's trigger
firings), `workers`,
`machines` (snowflake machine-id leases), `shards` (the shard map), `servers` (live
server processes), `credentials`
(the shard map's logins, read before any store is open).
"""

from flowtide.store.pg import (
    commands,
    credentials,
    events,
    executions,
    firings,
    machines,
    notifications,
    outbox,
    servers,
    shards,
    workers,
)
from flowtide.store.pg.pending import Pending, ping

__all__ = [
    "Pending",
    "commands",
    "credentials",
    "events",
    "executions",
    "firings",
    "machines",
    "notifications",
    "outbox",
    "ping",
    "servers",
    "shards",
    "workers",
]
