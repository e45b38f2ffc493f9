"""Versioned PostgreSQL schema of the store, in two independent parts.

* `shard`: per-execution tables (execution, event, command, and later the outbox and
  variables). Every row is reachable by execution_id, so executions can be spread over
  several databases by `shard_for(execution_id, n)` without a schema change.
* `cluster`: tables shared by the whole cluster (catalog, credential, the worker-pool
  registry, the keychain, API tokens and the web UI's sessions).

Each part keeps its own version in `flowtide_schema (component, version, applied)` of the
database it lives in, so both parts can share one database (the default) or live in
separate ones. A migration is a list of statements applied in one transaction together
with its version row; `upgrade` takes a transaction-scoped advisory lock first, so any
number of servers starting at once apply each migration exactly once.

Why `text` and not `jsonb` for JSON columns: flowtide stores any JSON value a Python
tool can produce, and PostgreSQL's jsonb refuses some of them (the escape \\u0000 and
lone surrogates, which HTTP APIs do return). The text is flowtide's own compact JSON;
ad-hoc queries can still cast it (`payload::jsonb`) where the content allows.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from flowtide.errors import StoreError
from flowtide.store.base import COMMAND_STATUSES

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "CLUSTER",
    "COMPONENTS",
    "SHARD",
    "Component",
    "current_versions",
    "upgrade",
]

_STATUS_LIST = ", ".join(f"'{s}'" for s in sorted(COMMAND_STATUSES))

# Arbitrary constant of the advisory lock serialising migrations ("flowtide" in ASCII).
_MIGRATION_LOCK: Final = 0x666C6F77746964

_VERSION_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS flowtide_schema ("
    " component text NOT NULL,"
    " version integer NOT NULL,"
    " applied double precision NOT NULL,"
    " PRIMARY KEY (component, version))"
)


@dataclass(frozen=True)
class Component:
    """One independently versioned part of the schema."""

    name: str
    #: version -> statements that bring the schema from version - 1 to it.
    migrations: Mapping[int, Sequence[str]]

    @property
    def latest(self) -> int:
        return max(self.migrations)


SHARD: Final = Component(
    "shard",
    {
        1: (
            """
            CREATE TABLE execution (
                execution_id        bigint PRIMARY KEY,
                parent_execution_id bigint,
                parent_command_id   bigint,
                playbook_path       text,
                playbook_version    integer,
                playbook_file       text,
                playbook_text       text NOT NULL,
                workload            text NOT NULL,
                status              text NOT NULL,
                result              text,
                error               text,
                created             double precision NOT NULL,
                updated             double precision NOT NULL
            )
            """,
            "CREATE INDEX execution_status ON execution (status, execution_id)",
            """
            CREATE TABLE event (
                execution_id    bigint NOT NULL,
                event_id        bigint NOT NULL,
                type            text NOT NULL,
                step            text,
                status          text,
                payload         text,
                error           text,
                parent_event_id bigint,
                command_id      bigint,
                worker_id       text,
                time            double precision NOT NULL,
                PRIMARY KEY (execution_id, event_id)
            )
            """,
            f"""
            CREATE TABLE command (
                command_id    bigint PRIMARY KEY,
                execution_id  bigint NOT NULL,
                step          text NOT NULL,
                status        text NOT NULL CHECK (status IN ({_STATUS_LIST})),
                attempt       integer NOT NULL,
                loop_instance bigint,
                loop_index    bigint,
                worker_id     text,
                payload       text,
                created       double precision NOT NULL,
                updated       double precision NOT NULL
            )
            """,
            "CREATE INDEX command_execution ON command (execution_id, status, command_id)",
        ),
        # The distributed runtime: insertion order of the log (servers catch up on what
        # other servers wrote by `seq`, since event ids of workers are not in arrival
        # order), command leases, the transactional outbox and execution variables.
        2: (
            "ALTER TABLE event ADD COLUMN seq bigint GENERATED ALWAYS AS IDENTITY",
            "CREATE INDEX event_seq ON event (execution_id, seq)",
            "ALTER TABLE execution ADD COLUMN cancel_requested double precision",
            "ALTER TABLE command ADD COLUMN pool text",
            "ALTER TABLE command ADD COLUMN claimed double precision",
            "ALTER TABLE command ADD COLUMN lease_until double precision",
            "CREATE INDEX command_lease ON command (lease_until) WHERE status = 'claimed'",
            """
            CREATE TABLE outbox (
                id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                execution_id bigint NOT NULL,
                command_id   bigint NOT NULL,
                subject      text NOT NULL,
                payload      text NOT NULL,
                created      double precision NOT NULL,
                published    double precision,
                attempts     integer NOT NULL DEFAULT 0,
                last_error   text,
                locked_until double precision
            )
            """,
            "CREATE INDEX outbox_pending ON outbox (id) WHERE published IS NULL",
            "CREATE INDEX outbox_command ON outbox (command_id, id)",
            """
            CREATE TABLE variable (
                execution_id bigint NOT NULL,
                name         text NOT NULL,
                value        text NOT NULL,
                updated      double precision NOT NULL,
                PRIMARY KEY (execution_id, name)
            )
            """,
        ),
        # A commit-consistent order of the log for readers that follow it (the event
        # stream of the API). `seq` is taken at insert time, so a transaction can commit
        # a lower seq after a reader has passed it (claims write events without the
        # execution lock). Rows of transactions older than every transaction still in
        # progress never appear later: a reader ordering by (xact, seq) and stopping below
        # that horizon sees each event once and in the same order every time. The column
        # default rewrites the table once; existing rows share the migration's xact.
        3: (
            "ALTER TABLE event ADD COLUMN xact xid8 NOT NULL DEFAULT pg_current_xact_id()",
            "CREATE INDEX event_xact ON event (execution_id, xact, seq)",
        ),
        # No statistics on the execution_id of the per-execution tables. A running
        # execution is almost always newer than the last ANALYZE, and when the sampled
        # values cover the table the planner takes an unseen id for one row: then every
        # index that starts with execution_id looks equally good, and a lookup by
        # (execution_id, event_id) could walk the whole execution through event_xact
        # (3 ms at 12,000 events, in each step of a loop) instead of the primary key.
        # Without statistics an id matches the default fraction of the table, and the
        # index that matches more of the condition wins. (An upgraded database keeps
        # the statistics ANALYZE already wrote for the column until they are replaced.)
        4: (
            "ALTER TABLE event ALTER COLUMN execution_id SET STATISTICS 0",
            "ALTER TABLE command ALTER COLUMN execution_id SET STATISTICS 0",
            "ALTER TABLE outbox ALTER COLUMN execution_id SET STATISTICS 0",
        ),
        # The sub-playbook executions of a parent (a cancel goes down to them).
        5: (
            "CREATE INDEX execution_parent ON execution (parent_execution_id)"
            " WHERE parent_execution_id IS NOT NULL",
        ),
        # What the UI shows of an ended execution at a glance (per-step status, runs,
        # loop counts), written when it ends: opening a 100,000-iteration run's page
        # then reads one row instead of folding its log. `format` names the document's
        # shape; a reader that knows another one folds the log instead.
        6: (
            """
            CREATE TABLE execution_summary (
                execution_id bigint PRIMARY KEY,
                format       integer NOT NULL,
                doc          text NOT NULL
            )
            """,
        ),
        # Triggers (flowtide.triggers): what started an execution (a schedule's slot, a
        # webhook delivery, a message), and each trigger's firings and planning state in
        # the shard that owns it, written in the transaction that creates the execution:
        # a slot, a delivery or a message starts exactly one run.
        7: (
            "ALTER TABLE execution ADD COLUMN trigger_kind text",
            "ALTER TABLE execution ADD COLUMN trigger_name text",
            "ALTER TABLE execution ADD COLUMN trigger_key text",
            "CREATE INDEX execution_trigger ON execution (trigger_kind, trigger_name,"
            " execution_id) WHERE trigger_kind IS NOT NULL",
            # A playbook's `timeout:` and `sla:` as instants (flowtide.triggers deadlines):
            # the reaper finds the runs past them with one indexed scan.
            "ALTER TABLE execution ADD COLUMN deadline double precision",
            "ALTER TABLE execution ADD COLUMN sla double precision",
            "CREATE INDEX execution_deadline ON execution (deadline) WHERE deadline IS NOT NULL",
            "CREATE INDEX execution_sla ON execution (sla) WHERE sla IS NOT NULL",
            """
            CREATE TABLE trigger_firing (
                trigger_id   bigint NOT NULL,
                key          text NOT NULL,
                slot         double precision,
                status       text NOT NULL,
                execution_id bigint,
                time         double precision NOT NULL,
                reason       text,
                PRIMARY KEY (trigger_id, key)
            )
            """,
            "CREATE INDEX trigger_firing_time ON trigger_firing (trigger_id, time)",
            """
            CREATE TABLE trigger_state (
                trigger_id bigint PRIMARY KEY,
                watermark  double precision NOT NULL,
                updated    double precision NOT NULL
            )
            """,
        ),
        # Notifications (flowtide.notify): the deliveries a transition owes, written in
        # the step transaction that records the transition and leased by the shard's
        # servers (FOR UPDATE SKIP LOCKED): one delivery per transition, however many
        # servers there are. A row is deleted with the event of its last attempt.
        8: (
            """
            CREATE TABLE notification (
                id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                execution_id  bigint NOT NULL,
                event_id      bigint NOT NULL,
                on_transition text NOT NULL,
                target        text NOT NULL,
                doc           text NOT NULL,
                attempts      integer NOT NULL DEFAULT 0,
                next_at       double precision NOT NULL,
                locked_until  double precision,
                created       double precision NOT NULL
            )
            """,
            "CREATE INDEX notification_due ON notification (next_at)",
            "CREATE INDEX notification_execution ON notification (execution_id)",
        ),
    },
)

CLUSTER: Final = Component(
    "cluster",
    {
        1: (
            """
            CREATE TABLE catalog (
                path        text NOT NULL,
                version     integer NOT NULL,
                content     text NOT NULL,
                source_file text,
                created     double precision NOT NULL,
                PRIMARY KEY (path, version)
            )
            """,
            """
            CREATE TABLE credential (
                name       text PRIMARY KEY,
                kind       text NOT NULL,
                ciphertext bytea NOT NULL,
                created    double precision NOT NULL,
                updated    double precision NOT NULL
            )
            """,
        ),
        # Worker processes by pool (registration and heartbeats).
        2: (
            """
            CREATE TABLE worker (
                worker_id   text PRIMARY KEY,
                pool        text NOT NULL,
                hostname    text,
                pid         integer,
                concurrency integer NOT NULL,
                registered  double precision NOT NULL,
                heartbeat   double precision NOT NULL,
                status      text NOT NULL,
                running     integer NOT NULL DEFAULT 0
            )
            """,
            "CREATE INDEX worker_pool ON worker (pool, heartbeat)",
        ),
        # The keychain: secrets and tokens cached per catalog entry (a token an auth step
        # obtained, with its expiry), Fernet-encrypted with the credential master key.
        # `execution_id` is 0 for the scopes shared by every execution of the entry
        # (global, catalog) and the owning execution for local/shared scope; it is part
        # of the key, so it cannot be NULL.
        3: (
            """
            CREATE TABLE keychain (
                path         text NOT NULL,
                version      integer NOT NULL,
                name         text NOT NULL,
                scope        text NOT NULL
                             CHECK (scope IN ('global', 'catalog', 'local', 'shared')),
                execution_id bigint NOT NULL DEFAULT 0,
                kind         text NOT NULL,
                ciphertext   bytea NOT NULL,
                expires      double precision,
                created      double precision NOT NULL,
                updated      double precision NOT NULL,
                PRIMARY KEY (path, version, name, scope, execution_id),
                FOREIGN KEY (path, version) REFERENCES catalog (path, version)
                    ON DELETE CASCADE
            )
            """,
            "CREATE INDEX keychain_expires ON keychain (expires) WHERE expires IS NOT NULL",
        ),
        # API tokens (flowtide.auth.tokens): the SHA-256 of each secret, never the secret.
        # A worker row remembers the token that registered it: reports, claims and
        # heartbeats for that worker id are taken from that token only.
        4: (
            """
            CREATE TABLE api_token (
                token_id  text PRIMARY KEY,
                name      text NOT NULL,
                role      text NOT NULL
                          CHECK (role IN ('reader', 'operator', 'admin', 'worker')),
                pool      text,
                digest    bytea NOT NULL,
                created   double precision NOT NULL,
                expires   double precision,
                revoked   double precision,
                last_used double precision
            )
            """,
            "CREATE INDEX api_token_name ON api_token (name) WHERE revoked IS NULL",
            "ALTER TABLE worker ADD COLUMN token_id text",
        ),
        # Snowflake machine ids (flowtide.machines): each of the 1,024 leased by at most
        # one live process, so no two server processes or workers issue the same id.
        5: (
            """
            CREATE TABLE machine_lease (
                machine_id      integer PRIMARY KEY CHECK (machine_id BETWEEN 0 AND 1023),
                holder          text,
                expires         double precision NOT NULL DEFAULT 0,
                issued_until_ms bigint NOT NULL DEFAULT 0
            )
            """,
            "INSERT INTO machine_lease (machine_id) SELECT g FROM generate_series(0, 1023) g",
            "CREATE INDEX machine_lease_expires ON machine_lease (expires)",
        ),
        # The shard map of phase G (flowtide.topology): where each shard's database is,
        # its login a credential alias of the credential table, never a password here.
        6: (
            """
            CREATE TABLE shard_endpoint (
                shard_index integer PRIMARY KEY CHECK (shard_index >= 0),
                host        text NOT NULL,
                port        integer NOT NULL CHECK (port BETWEEN 1 AND 65535),
                database    text NOT NULL,
                credential  text NOT NULL,
                active      boolean NOT NULL DEFAULT true,
                updated     double precision NOT NULL
            )
            """,
        ),
        # Live server processes and the shard each serves (flowtide.server.servers): the
        # topology endpoint's view, and where requests for a shard can be sent.
        7: (
            """
            CREATE TABLE server_endpoint (
                server_id   text PRIMARY KEY,
                shard_index integer NOT NULL,
                url         text,
                started     double precision NOT NULL,
                heartbeat   double precision NOT NULL
            )
            """,
            "CREATE INDEX server_endpoint_shard ON server_endpoint (shard_index, heartbeat)",
        ),
        # Triggers (flowtide.triggers): schedules, webhooks and subscriptions by kind and
        # name; `trigger_id` (a snowflake) names the shard that fires it; a webhook's
        # secret is sealed like a credential.
        8: (
            """
            CREATE TABLE trigger_def (
                kind       text NOT NULL,
                name       text NOT NULL,
                trigger_id bigint NOT NULL UNIQUE,
                spec       text NOT NULL,
                secret     bytea,
                paused     boolean NOT NULL DEFAULT false,
                resumed    double precision,
                created    double precision NOT NULL,
                updated    double precision NOT NULL,
                PRIMARY KEY (kind, name)
            )
            """,
        ),
        # The web UI's sessions (flowtide.auth.sessions): the SHA-256 of each session id,
        # never the id, with the principal it stands for and the token it was opened with
        # (revoking the token deletes them).
        9: (
            """
            CREATE TABLE ui_session (
                digest   bytea PRIMARY KEY,
                subject  text NOT NULL,
                name     text NOT NULL,
                role     text NOT NULL,
                pool     text,
                token_id text,
                created  double precision NOT NULL,
                expires  double precision NOT NULL,
                seen     double precision NOT NULL
            )
            """,
            "CREATE INDEX ui_session_token ON ui_session (token_id) WHERE token_id IS NOT NULL",
            "CREATE INDEX ui_session_expires ON ui_session (expires)",
        ),
    },
)

COMPONENTS: Final = (SHARD, CLUSTER)


def current_versions(conn: psycopg.Connection) -> dict[str, int]:
    """The schema version of every component present in the database (0: absent)."""
    exists = conn.execute("SELECT to_regclass('flowtide_schema') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        return {c.name: 0 for c in COMPONENTS}
    rows = conn.execute(
        "SELECT component, MAX(version) FROM flowtide_schema GROUP BY component"
    ).fetchall()
    found = {str(name): int(version) for name, version in rows}
    return {c.name: found.get(c.name, 0) for c in COMPONENTS} | found


def upgrade(
    conn: psycopg.Connection, components: Sequence[Component], *, where: str
) -> list[tuple[str, int, int]]:
    """Bring `components` to their latest version in the database behind `conn`.

    `conn` must be idle (no transaction open); every migration runs in its own
    transaction. `where` names the database in errors (a DSN without its password).

    Returns:
        (component, from_version, to_version) for every component, changed or not.
    Raises:
        StoreError: the database holds a newer schema than this flowtide knows, or a
            migration failed (it is rolled back; earlier ones stay applied).
    """
    import psycopg

    report: list[tuple[str, int, int]] = []
    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            conn.execute(_VERSION_TABLE)
        for component in components:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
                before = current_versions(conn).get(component.name, 0)
                if before > component.latest:
                    raise StoreError(
                        f"{where}: {component.name} schema version {before} is newer than "
                        f"this flowtide supports ({component.latest}); upgrade flowtide"
                    )
                for version in range(before + 1, component.latest + 1):
                    for statement in component.migrations[version]:
                        conn.execute(statement)  # our own literals
                    conn.execute(
                        "INSERT INTO flowtide_schema (component, version, applied)"
                        " VALUES (%s, %s, %s)",
                        (component.name, version, time.time()),
                    )
            report.append((component.name, before, component.latest))
    except psycopg.Error as exc:
        raise StoreError(f"{where}: schema upgrade failed: {exc}") from exc
    return report


def check_current(conn: psycopg.Connection, components: Sequence[Component], *, where: str) -> None:
    """Raise unless every component is at exactly the version this flowtide expects."""
    found = current_versions(conn)
    for component in components:
        version = found.get(component.name, 0)
        if version < component.latest:
            raise StoreError(
                f"{where}: {component.name} schema is at version {version}, this flowtide "
                f"needs {component.latest}; run `flowtide db upgrade`"
            )
        if version > component.latest:
            raise StoreError(
                f"{where}: {component.name} schema version {version} is newer than this "
                f"flowtide supports ({component.latest}); upgrade flowtide"
            )
