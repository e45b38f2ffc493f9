"""The executions, their events and commands, and the summaries kept of ended ones: the
shard part of `SQLStore`, written once for SQLite and PostgreSQL.
"""

from __future__ import annotations

import re
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final

from flowtide.engine.events import Event
from flowtide.errors import NotFoundError, StoreError
from flowtide.store.base import (
    ENDED_STATUSES,
    EXECUTION_CREATED,
    PENDING_COMMAND_STATUSES,
    UNSET,
    CommandRow,
    CommandUpdate,
    ExecutionRow,
    ExecutionUpdate,
    Unset,
)
from flowtide.store.codec import (
    COMMAND_COLUMNS,
    EVENT_COLUMNS,
    EXECUTION_COLUMNS,
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
from flowtide.store.notifications import PendingNotification
from flowtide.store.sql.notifications import INSERT_NOTIFICATION, notification_params
from flowtide.store.sql.triggers import TriggerTables
from flowtide.store.triggers import Firing

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
    " created, updated, trigger_kind, trigger_name, trigger_key, deadline, sla)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_PENDING_COMMANDS: Final = (
    f"SELECT {COMMAND_COLUMNS} FROM command WHERE execution_id = ?"
    f" AND status IN ({', '.join(repr(s) for s in PENDING_COMMAND_STATUSES)})"
    " ORDER BY command_id"
)
_UPDATE_EXECUTION: Final = {
    (r, e): update_execution_sql(r, e, "?") for r in (False, True) for e in (False, True)
}


class ExecutionTables(TriggerTables):
    """Executions, events, commands and summaries (the shard part)."""

    def append(
        self,
        events: Sequence[Event],
        *,
        commands: Sequence[CommandUpdate] = (),
        execution_updates: Sequence[ExecutionUpdate] = (),
        secrets: Mapping[int, Collection[str]] | None = None,
        notifications: Sequence[PendingNotification] = (),
    ) -> None:
        """See `flowtide.store.base.Store.append`."""
        if not events and not commands and not execution_updates and not notifications:
            return
        # Rows are serialised before the transaction: the writer holds it only for the SQL.
        event_rows = event_params(events, self.sealer, secrets)
        command_rows = command_params(commands)
        updates = [
            (u.execution_id, *self.execution_update(u, (secrets or {}).get(u.execution_id, ())))
            for u in execution_updates
        ]
        owed = notification_params(notifications)
        with self.transaction("append (batch rolled back)") as conn:
            self.write_batch(conn, event_rows, command_rows, updates)
            if owed:
                conn.executemany(self._sql(INSERT_NOTIFICATION), owed)

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
        firing: Firing | None = None,
        deadline: float | None = None,
        sla: float | None = None,
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
            firing=firing,
            deadline=deadline,
            sla=sla,
        )
        try:
            with self.transaction("create_execution") as conn:
                if firing is not None:
                    self.record_firing(conn, firing, execution_id, created)
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
        firing: Firing | None = None,
        deadline: float | None = None,
        sla: float | None = None,
    ) -> tuple[str, tuple[Any, ...]]:
        """(sql, params) inserting a new execution row (`Store.create_execution`); the
        firing that starts it, if any, is recorded separately (`record_firing`) in the
        same transaction."""
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
            firing.kind if firing else None,
            firing.name if firing else None,
            firing.key if firing else None,
            deadline,
            sla,
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
        trigger: str | None = None,
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
        if trigger is not None:
            kind, _, name = trigger.partition(":")
            where.append("trigger_kind = ?")
            params.append(kind)
            if name:
                where.append("trigger_name = ?")
                params.append(name)
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


def _among(column: str, values: Collection[str] | None, params: list[Any]) -> str:
    """` AND column IN (?, ...)` for `values` (bound in `params`); nothing for None."""
    if values is None:
        return ""
    wanted = sorted(values)
    if not wanted:
        return " AND FALSE"
    params.extend(wanted)
    return f" AND {column} IN ({', '.join(['?'] * len(wanted))})"
