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
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Final

from flowtide.engine.events import Event
from flowtide.errors import NotFoundError, StoreError
from flowtide.sealing import SEALED_PREFIX, Sealer
from flowtide.store.base import (
    ENDED_STATUSES,
    EXECUTION_CREATED,
    PENDING_COMMAND_STATUSES,
    UNSET,
    CatalogRow,
    CommandRow,
    CommandUpdate,
    ExecutionRow,
    ExecutionUpdate,
    Unset,
)
from flowtide.store.codec import (
    CATALOG_FIELDS,
    COMMAND_COLUMNS,
    EVENT_COLUMNS,
    EXECUTION_COLUMNS,
    catalog_row,
    check_limit,
    command_params,
    command_row,
    decode,
    decode_events,
    encode_value,
    event_params,
    execution_row,
    execution_update_params,
    update_execution_sql,
)

__all__ = ["INSERT_EVENT", "PUT_SUMMARY", "UPSERT_COMMAND", "SQLStore"]

#: Keep an ended execution's summary (`Store.put_summary`), replacing an older one.
PUT_SUMMARY: Final = (
    "INSERT INTO execution_summary (execution_id, format, doc) VALUES (?, ?, ?)"
    " ON CONFLICT (execution_id) DO UPDATE SET format = excluded.format, doc = excluded.doc"
)

INSERT_EVENT: Final = (
    "INSERT INTO event (execution_id, event_id, type, step, status, payload, error,"
    " parent_event_id, command_id, worker_id, time) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# The semantics of `CommandUpdate`. `attempt` is bound twice (insert default and update)
# because after COALESCE on insert the excluded row can no longer tell "not given" from 1.
UPSERT_COMMAND: Final = (
    "INSERT INTO command (command_id, execution_id, step, status, attempt, loop_instance,"
    " loop_index, worker_id, payload, created, updated)"
    " VALUES (?, ?, ?, ?, COALESCE(?, 1), ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (command_id) DO UPDATE SET"
    " status = excluded.status,"
    " attempt = COALESCE(?, command.attempt),"
    " worker_id = CASE WHEN excluded.status = 'issued' THEN excluded.worker_id"
    " ELSE COALESCE(excluded.worker_id, command.worker_id) END,"
    " payload = COALESCE(excluded.payload, command.payload),"
    " updated = excluded.updated"
)
_INSERT_EXECUTION: Final = (
    "INSERT INTO execution (execution_id, parent_execution_id, parent_command_id,"
    " playbook_path, playbook_version, playbook_file, playbook_text, workload, status,"
    " created, updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_PENDING_COMMANDS: Final = (
    f"SELECT {COMMAND_COLUMNS} FROM command WHERE execution_id = ?"
    f" AND status IN ({', '.join(repr(s) for s in PENDING_COMMAND_STATUSES)})"
    " ORDER BY command_id"
)
_CATALOG_COLUMNS: Final = (
    f"{CATALOG_FIELDS}, (SELECT COUNT(*) FROM catalog n WHERE n.path = c.path)"
)
_UPDATE_EXECUTION: Final = {
    (r, e): update_execution_sql(r, e, "?") for r in (False, True) for e in (False, True)
}


class SQLStore:
    """The shared half of the SQL adapters (see the module docstring)."""

    #: The driver's placeholder for `?`.
    PARAM: ClassVar[str] = "?"
    _converted: ClassVar[dict[str, str]]
    #: Seals JSON columns that hold a secret, unseals them on read.
    sealer: Sealer

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._converted = {}

    @classmethod
    def _sql(cls, text: str) -> str:
        """`text` with the driver's placeholders (statements here contain no other `?`)."""
        if cls.PARAM == "?":
            return text
        out = cls._converted.get(text)
        if out is None:
            out = cls._converted[text] = text.replace("?", cls.PARAM)
        return out

    # -- what the adapter provides -----------------------------------------------------

    def transaction(self, op: str, part: str = "shard") -> AbstractContextManager[Any]:
        raise NotImplementedError

    def _query(
        self, op: str, sql: str, params: Sequence[Any] = (), part: str = "shard"
    ) -> list[Any]:
        raise NotImplementedError

    @classmethod
    def write_batch(
        cls,
        conn: Any,
        event_rows: list[tuple[Any, ...]],
        command_rows: list[tuple[Any, ...]],
        updates: list[tuple[int, str, tuple[Any, ...]]],
    ) -> None:
        """Write `append`'s prepared rows inside the caller's transaction on `conn`:
        events (`event_params`), command upserts (`command_params`) and execution updates
        as (execution_id, sql, params) from `execution_update`. NotFoundError when an
        update finds no execution row."""
        raise NotImplementedError

    def _lock_catalog_path(self, conn: Any, path: str) -> None:
        """Serialise registrations of `path` inside the transaction (a no-op where the
        database already serialises every writer)."""

    # -- shared ------------------------------------------------------------------------

    def _read(
        self, op: str, sql: str, params: Sequence[Any] = (), part: str = "shard"
    ) -> list[Any]:
        return self._query(op, self._sql(sql), params, part)

    def _is_duplicate(self, error: BaseException | None) -> bool:
        """Whether the database error under a StoreError is a primary-key violation."""
        raise NotImplementedError

    def append(
        self,
        events: Sequence[Event],
        *,
        commands: Sequence[CommandUpdate] = (),
        execution_updates: Sequence[ExecutionUpdate] = (),
        secrets: Mapping[int, Collection[str]] | None = None,
    ) -> None:
        """See `flowtide.store.base.Store.append`."""
        if not events and not commands and not execution_updates:
            return
        # Rows are serialised before the transaction: the writer holds it only for the SQL.
        event_rows = event_params(events, self.sealer, secrets)
        command_rows = command_params(commands)
        updates = [
            (u.execution_id, *self.execution_update(u, (secrets or {}).get(u.execution_id, ())))
            for u in execution_updates
        ]
        with self.transaction("append (batch rolled back)") as conn:
            self.write_batch(conn, event_rows, command_rows, updates)

    def create_execution(
        self,
        execution_id: int,
        *,
        playbook_path: str | None,
        playbook_version: int | None,
        playbook_file: str | None,
        playbook_text: str,
        workload: dict[str, Any],
        parent_execution_id: int | None = None,
        parent_command_id: int | None = None,
        created: float,
        secrets: Collection[str] = (),
    ) -> None:
        """See `flowtide.store.base.Store.create_execution`."""
        sql, row = self.execution_insert(
            execution_id,
            playbook_path=playbook_path,
            playbook_version=playbook_version,
            playbook_file=playbook_file,
            playbook_text=playbook_text,
            workload=workload,
            parent_execution_id=parent_execution_id,
            parent_command_id=parent_command_id,
            created=created,
            secrets=secrets,
        )
        try:
            with self.transaction("create_execution") as conn:
                conn.execute(sql, row)
        except StoreError as exc:
            if self._is_duplicate(exc.__cause__):
                raise StoreError(f"execution {execution_id} already exists") from exc
            raise

    def execution_insert(
        self,
        execution_id: int,
        *,
        playbook_path: str | None,
        playbook_version: int | None,
        playbook_file: str | None,
        playbook_text: str,
        workload: dict[str, Any],
        parent_execution_id: int | None = None,
        parent_command_id: int | None = None,
        created: float,
        secrets: Collection[str] = (),
    ) -> tuple[str, tuple[Any, ...]]:
        """(sql, params) inserting a new execution row (`Store.create_execution`)."""
        workload_text = encode_value(workload, f"execution {execution_id}: workload")
        row = (
            execution_id,
            parent_execution_id,
            parent_command_id,
            playbook_path,
            playbook_version,
            playbook_file,
            playbook_text,
            self.sealer.store_text(workload_text, secrets),
            EXECUTION_CREATED,
            created,
            created,
        )
        return self._sql(_INSERT_EXECUTION), row

    def execution_update(
        self, update: ExecutionUpdate, secrets: Collection[str] = ()
    ) -> tuple[str, tuple[Any, ...]]:
        """(sql, params) of `update`; a result or error holding a value of `secrets` is
        sealed."""
        shape, params = execution_update_params(update, self.sealer, secrets)
        return self._sql(_UPDATE_EXECUTION[shape]), params

    def get_execution(self, execution_id: int) -> ExecutionRow:
        """See `flowtide.store.base.Store.get_execution`."""
        rows = self._read(
            "get_execution",
            f"SELECT {EXECUTION_COLUMNS} FROM execution WHERE execution_id = ?",
            (execution_id,),
        )
        if not rows:
            raise NotFoundError(f"execution {execution_id} not found")
        return execution_row(rows[0], self.sealer)

    def list_executions(
        self,
        *,
        status: str | None = None,
        limit: int = 50,
        before_id: int | None = None,
        playbook: str | None = None,
        parent_id: int | None = None,
        created_since: float | None = None,
        created_until: float | None = None,
        min_seconds: float | None = None,
        max_seconds: float | None = None,
        now: float | None = None,
    ) -> list[ExecutionRow]:
        """See `flowtide.store.base.Store.list_executions`."""
        check_limit(limit)
        where: list[str] = []
        params: list[Any] = []
        if status is not None:
            where.append("status = ?")
            params.append(status)
        if before_id is not None:
            where.append("execution_id < ?")
            params.append(before_id)
        if playbook:
            # A LIKE pattern with the text's own wildcards escaped ('!' escapes).
            pattern = "%" + re.sub(r"([!%_])", r"!\1", playbook.lower()) + "%"
            where.append(
                "(LOWER(COALESCE(playbook_path, '')) LIKE ? ESCAPE '!'"
                " OR LOWER(COALESCE(playbook_file, '')) LIKE ? ESCAPE '!')"
            )
            params += [pattern, pattern]
        if parent_id is not None:
            where.append("parent_execution_id = ?")
            params.append(parent_id)
        if created_since is not None:
            where.append("created >= ?")
            params.append(created_since)
        if created_until is not None:
            where.append("created < ?")
            params.append(created_until)
        if min_seconds is not None or max_seconds is not None:
            ended = ", ".join(f"'{s}'" for s in sorted(ENDED_STATUSES))
            lasted = f"(CASE WHEN status IN ({ended}) THEN updated ELSE ? END) - created"
            at = time.time() if now is None else now
            if min_seconds is not None:
                where.append(f"{lasted} >= ?")
                params += [at, min_seconds]
            if max_seconds is not None:
                where.append(f"{lasted} <= ?")
                params += [at, max_seconds]
        sql = f"SELECT {EXECUTION_COLUMNS} FROM execution"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY execution_id DESC LIMIT ?"
        params.append(limit)
        return [execution_row(r, self.sealer) for r in self._read("list_executions", sql, params)]

    def update_execution(
        self,
        execution_id: int,
        *,
        status: str,
        result: Any | Unset = UNSET,
        error: dict[str, Any] | None | Unset = UNSET,
        updated: float,
        secrets: Collection[str] = (),
    ) -> None:
        """See `flowtide.store.base.Store.update_execution`."""
        update = ExecutionUpdate(
            execution_id=execution_id, status=status, updated=updated, result=result, error=error
        )
        sql, params = self.execution_update(update, secrets)
        with self.transaction("update_execution") as conn:
            if conn.execute(sql, params).rowcount == 0:
                raise NotFoundError(f"execution {execution_id} not found")

    def events(
        self,
        execution_id: int,
        *,
        after_event_id: int | None = None,
        limit: int | None = None,
        types: Collection[str] | None = None,
        steps: Collection[str] | None = None,
        newest: bool = False,
        before_event_id: int | None = None,
    ) -> list[Event]:
        """See `flowtide.store.base.Store.events`."""
        check_limit(limit)
        sql = f"SELECT {EVENT_COLUMNS} FROM event WHERE execution_id = ?"
        params: list[Any] = [execution_id]
        if after_event_id is not None:
            sql += " AND event_id > ?"
            params.append(after_event_id)
        if before_event_id is not None:
            sql += " AND event_id < ?"
            params.append(before_event_id)
        sql += _among("type", types, params) + _among("step", steps, params)
        backwards = newest and limit is not None
        sql += " ORDER BY event_id DESC" if backwards else " ORDER BY event_id"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        sealer = self.sealer
        rows = self._read("events", sql, params)
        if backwards:
            rows.reverse()
        return decode_events(rows, sealer)

    def event_times(
        self, execution_id: int, *, types: Collection[str], steps: Collection[str] | None = None
    ) -> list[tuple[str | None, str, str | None, float]]:
        """See `flowtide.store.base.Store.event_times`."""
        params: list[Any] = [execution_id]
        sql = "SELECT step, type, status, time FROM event WHERE execution_id = ?"
        sql += _among("type", types, params) + _among("step", steps, params)
        sql += " ORDER BY event_id"
        return [(r[0], r[1], r[2], float(r[3])) for r in self._read("event_times", sql, params)]

    def event_span(self, execution_id: int) -> tuple[float, float] | None:
        """See `flowtide.store.base.Store.event_span`."""
        rows = self._read(
            "event_span",
            "SELECT MIN(time), MAX(time) FROM event WHERE execution_id = ?",
            (execution_id,),
        )
        if not rows or rows[0][0] is None:
            return None
        return float(rows[0][0]), float(rows[0][1])

    def count_events(self, execution_id: int) -> int:
        """See `flowtide.store.base.Store.count_events`."""
        rows = self._read(
            "count_events", "SELECT COUNT(*) FROM event WHERE execution_id = ?", (execution_id,)
        )
        return int(rows[0][0])

    def pending_commands(self, execution_id: int) -> list[CommandRow]:
        """See `flowtide.store.base.Store.pending_commands`."""
        rows = self._read("pending_commands", _PENDING_COMMANDS, (execution_id,))
        return [command_row(r) for r in rows]

    def get_command(self, command_id: int) -> CommandRow:
        """See `flowtide.store.base.Store.get_command`."""
        rows = self._read(
            "get_command",
            f"SELECT {COMMAND_COLUMNS} FROM command WHERE command_id = ?",
            (command_id,),
        )
        if not rows:
            raise NotFoundError(f"command {command_id} not found")
        return command_row(rows[0])

    # -- catalog (cluster) -------------------------------------------------------------

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

    def put_summary(self, execution_id: int, doc: dict[str, Any], *, format: int) -> None:
        """See `flowtide.store.base.Store.put_summary`."""
        text = encode_value(doc, f"execution {execution_id}: summary")
        with self.transaction("put_summary") as conn:
            conn.execute(self._sql(PUT_SUMMARY), (execution_id, format, text))

    def get_summary(self, execution_id: int) -> tuple[int, dict[str, Any]] | None:
        """See `flowtide.store.base.Store.get_summary`."""
        rows = self._read(
            "get_summary",
            "SELECT format, doc FROM execution_summary WHERE execution_id = ?",
            (execution_id,),
        )
        if not rows:
            return None
        return int(rows[0][0]), decode(rows[0][1])

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

    # -- credentials (cluster) ---------------------------------------------------------

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


def _among(column: str, values: Collection[str] | None, params: list[Any]) -> str:
    """` AND column IN (?, ...)` for `values` (bound in `params`); nothing for None."""
    if values is None:
        return ""
    wanted = sorted(values)
    if not wanted:
        return " AND FALSE"
    params.extend(wanted)
    return f" AND {column} IN ({', '.join(['?'] * len(wanted))})"
