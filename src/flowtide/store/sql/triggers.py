"""Triggers (`flowtide.triggers`): their definitions (cluster part) and each one's firings
and planning state (shard part: the shard that owns the trigger, beside the executions it
starts), written once for SQLite and PostgreSQL.

A firing is keyed by (trigger_id, key): `record_firing` runs inside the transaction that
creates the execution, so a second firing of a key (another server racing, a redelivered
message, a retried webhook) finds the row and writes nothing (`AlreadyFired`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from flowtide.errors import AlreadyFired, NotFoundError, StoreError
from flowtide.store.base import ENDED_STATUSES
from flowtide.store.codec import decode, encode_value
from flowtide.store.sql.adapter import SQLAdapter
from flowtide.store.triggers import (
    FIRING_STATUSES,
    TRIGGER_KEYS,
    Firing,
    FiringRow,
    TriggerRow,
    TriggerState,
)

_DEF_COLUMNS: Final = (
    "kind, name, trigger_id, spec, secret IS NOT NULL, paused, resumed, created, updated"
)
_FIRING_COLUMNS: Final = "trigger_id, key, slot, status, execution_id, time, reason"
#: A firing with the status of the run it started (None: it started none).
_FIRING_READ: Final = (
    "SELECT f.trigger_id, f.key, f.slot, f.status, f.execution_id, f.time, f.reason, e.status"
    " FROM trigger_firing f LEFT JOIN execution e ON e.execution_id = f.execution_id"
)
_ENDED: Final = ", ".join(f"'{s}'" for s in sorted(ENDED_STATUSES))

_TAKE_BUFFERED: Final = (
    "UPDATE trigger_firing SET status = 'started', execution_id = ?, time = ?, reason = NULL"
    " WHERE trigger_id = ? AND key = ? AND status IN ('buffered', 'skipped', 'failed')"
)
_TAKE_MEMBER: Final = (
    "UPDATE trigger_firing SET status = 'batched', execution_id = ?, time = ?, reason = NULL"
    " WHERE trigger_id = ? AND key = ? AND status = 'failed'"
)
_INSERT_FIRING: Final = (
    f"INSERT INTO trigger_firing ({_FIRING_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (trigger_id, key) DO NOTHING"
)
_MOVE_WATERMARK: Final = (
    "INSERT INTO trigger_state (trigger_id, watermark, updated) VALUES (?, ?, ?)"
    " ON CONFLICT (trigger_id) DO UPDATE SET"
    " watermark = CASE WHEN excluded.watermark > trigger_state.watermark"
    " THEN excluded.watermark ELSE trigger_state.watermark END,"
    " updated = excluded.updated"
)


def _trigger_row(r: Sequence[Any]) -> TriggerRow:
    return TriggerRow(
        kind=r[0],
        name=r[1],
        trigger_id=int(r[2]),
        spec=decode(r[3]),
        has_secret=bool(r[4]),
        paused=bool(r[5]),
        resumed=r[6],
        created=r[7],
        updated=r[8],
    )


def _firing_row(r: Sequence[Any]) -> FiringRow:
    return FiringRow(
        trigger_id=int(r[0]),
        key=r[1],
        slot=r[2],
        status=r[3],
        execution_id=None if r[4] is None else int(r[4]),
        time=r[5],
        reason=r[6],
        execution_status=r[7],
    )


def _check_kind(kind: str) -> None:
    if kind not in TRIGGER_KEYS:
        raise StoreError(f"unknown trigger kind {kind!r} (one of {', '.join(TRIGGER_KEYS)})")


class TriggerTables(SQLAdapter):
    """Trigger definitions (cluster part); firings and planning state (shard part)."""

    # -- definitions (cluster) ---------------------------------------------------------

    def put_trigger(
        self,
        kind: str,
        name: str,
        spec: dict[str, Any],
        *,
        trigger_id: int,
        now: float,
        paused: bool = False,
        secret: bytes | None = None,
    ) -> TriggerRow:
        """Store a trigger, or replace the spec (and secret, when given) of the one of
        that kind and name, which keeps its id, creation time and paused state unless
        `paused` differs (then `resumed` is set when it goes from paused to running).
        `trigger_id` is used only when the trigger is new."""
        _check_kind(kind)
        text = encode_value(spec, f"{kind} {name!r}: spec")
        sql = self._sql
        with self.transaction("put_trigger", "cluster") as conn:
            found = conn.execute(
                sql("SELECT paused FROM trigger_def WHERE kind = ? AND name = ?"), (kind, name)
            ).fetchone()
            if found is None:
                conn.execute(
                    sql(
                        "INSERT INTO trigger_def (kind, name, trigger_id, spec, secret, paused,"
                        " resumed, created, updated) VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?)"
                    ),
                    (kind, name, trigger_id, text, secret, paused, now, now),
                )
            else:
                was_paused = bool(found[0])
                conn.execute(
                    sql(
                        "UPDATE trigger_def SET spec = ?, secret = COALESCE(?, secret),"
                        " paused = ?,"
                        " resumed = CASE WHEN ? THEN ? ELSE resumed END, updated = ?"
                        " WHERE kind = ? AND name = ?"
                    ),
                    (text, secret, paused, was_paused and not paused, now, now, kind, name),
                )
        return self.get_trigger(kind, name)

    def get_trigger(self, kind: str, name: str) -> TriggerRow:
        """One trigger. Raises NotFoundError."""
        rows = self._read(
            "get_trigger",
            f"SELECT {_DEF_COLUMNS} FROM trigger_def WHERE kind = ? AND name = ?",
            (kind, name),
            "cluster",
        )
        if not rows:
            raise NotFoundError(f"no {kind} named {name!r}")
        return _trigger_row(rows[0])

    def list_triggers(self, kind: str | None = None) -> list[TriggerRow]:
        """Every trigger (of `kind`), by kind and name."""
        sql = f"SELECT {_DEF_COLUMNS} FROM trigger_def"
        params: tuple[Any, ...] = ()
        if kind is not None:
            sql += " WHERE kind = ?"
            params = (kind,)
        sql += " ORDER BY kind, name"
        return [_trigger_row(r) for r in self._read("list_triggers", sql, params, "cluster")]

    def set_trigger_paused(self, kind: str, name: str, paused: bool, *, now: float) -> TriggerRow:
        """Pause or resume a trigger; resuming sets `resumed` (slots before it never fire).
        Raises NotFoundError."""
        with self.transaction("set_trigger_paused", "cluster") as conn:
            cur = conn.execute(
                self._sql(
                    "UPDATE trigger_def SET"
                    " resumed = CASE WHEN paused AND NOT ? THEN ? ELSE resumed END,"
                    " paused = ?, updated = ? WHERE kind = ? AND name = ?"
                ),
                (paused, now, paused, now, kind, name),
            )
            if cur.rowcount == 0:
                raise NotFoundError(f"no {kind} named {name!r}")
        return self.get_trigger(kind, name)

    def delete_trigger(self, kind: str, name: str) -> None:
        """Delete a trigger (its firings stay with the executions they started). Raises
        NotFoundError."""
        with self.transaction("delete_trigger", "cluster") as conn:
            cur = conn.execute(
                self._sql("DELETE FROM trigger_def WHERE kind = ? AND name = ?"), (kind, name)
            )
            if cur.rowcount == 0:
                raise NotFoundError(f"no {kind} named {name!r}")

    def trigger_secret(self, kind: str, name: str) -> bytes | None:
        """The sealed secret kept with a trigger (a webhook's), for the code that checks
        signatures; never shown. Raises NotFoundError."""
        rows = self._read(
            "trigger_secret",
            "SELECT secret FROM trigger_def WHERE kind = ? AND name = ?",
            (kind, name),
            "cluster",
        )
        if not rows:
            raise NotFoundError(f"no {kind} named {name!r}")
        secret = rows[0][0]
        return None if secret is None else bytes(secret)

    # -- firings and planning state (shard) --------------------------------------------

    @classmethod
    def record_firing(cls, conn: Any, firing: Firing, execution_id: int | None, now: float) -> None:
        """Record `firing` inside the caller's transaction on `conn` (the one creating
        `execution_id`, when it starts one). A buffered slot that now starts is taken
        over, and so is a skipped one (a backfill runs the slots a schedule skipped) and a
        failed one (a redelivered message). A batch's `members` are recorded too. Raises
        AlreadyFired when the key (or a member) started a run before (the caller rolls
        back)."""
        sql = cls._sql
        if firing.status not in FIRING_STATUSES:
            raise StoreError(f"unknown firing status {firing.status!r}")
        key = (firing.trigger_id, firing.key)
        written = 0
        if firing.status == "started":
            written = conn.execute(sql(_TAKE_BUFFERED), (execution_id, now, *key)).rowcount
        if not written:
            written = conn.execute(
                sql(_INSERT_FIRING),
                (*key, firing.slot, firing.status, execution_id, now, firing.reason),
            ).rowcount
        if not written:
            found = conn.execute(
                sql("SELECT execution_id FROM trigger_firing WHERE trigger_id = ? AND key = ?"),
                key,
            ).fetchone()
            raise AlreadyFired(
                firing.trigger_id,
                firing.key,
                None if not found or found[0] is None else int(found[0]),
            )
        for member in firing.members:
            cls._record_member(conn, firing.trigger_id, member, execution_id, now)
        if firing.watermark is not None:
            conn.execute(sql(_MOVE_WATERMARK), (firing.trigger_id, firing.watermark, now))

    @classmethod
    def _record_member(
        cls, conn: Any, trigger_id: int, key: str, execution_id: int | None, now: float
    ) -> None:
        sql = cls._sql
        written = conn.execute(sql(_TAKE_MEMBER), (execution_id, now, trigger_id, key)).rowcount
        if not written:
            written = conn.execute(
                sql(_INSERT_FIRING), (trigger_id, key, None, "batched", execution_id, now, None)
            ).rowcount
        if not written:
            found = conn.execute(
                sql("SELECT execution_id FROM trigger_firing WHERE trigger_id = ? AND key = ?"),
                (trigger_id, key),
            ).fetchone()
            raise AlreadyFired(
                trigger_id, key, None if not found or found[0] is None else int(found[0])
            )

    def record_firings(self, firings: Sequence[Firing], *, now: float) -> int:
        """Record firings that start nothing (skipped and buffered slots) in one
        transaction, each at most once; returns how many were new."""
        new = 0
        with self.transaction("record_firings") as conn:
            for firing in firings:
                try:
                    self.record_firing(conn, firing, None, now)
                except AlreadyFired:
                    continue
                new += 1
        return new

    def move_watermark(self, trigger_id: int, watermark: float, *, now: float) -> None:
        """Move a schedule's planning state forward to `watermark` (never back)."""
        with self.transaction("move_watermark") as conn:
            conn.execute(self._sql(_MOVE_WATERMARK), (trigger_id, watermark, now))

    def trigger_watermark(self, trigger_id: int) -> float | None:
        """The latest slot a schedule's planner decided (None: never planned)."""
        rows = self._read(
            "trigger_watermark",
            "SELECT watermark FROM trigger_state WHERE trigger_id = ?",
            (trigger_id,),
        )
        return None if not rows else float(rows[0][0])

    def firings(
        self, trigger_id: int, *, limit: int = 50, status: str | None = None
    ) -> list[FiringRow]:
        """A trigger's latest firings, newest first."""
        sql = f"{_FIRING_READ} WHERE f.trigger_id = ?"
        params: list[Any] = [trigger_id]
        if status is not None:
            sql += " AND f.status = ?"
            params.append(status)
        sql += " ORDER BY f.time DESC, f.key DESC LIMIT ?"
        params.append(limit)
        return [_firing_row(r) for r in self._read("firings", sql, params)]

    def firing(self, trigger_id: int, key: str) -> FiringRow | None:
        """One firing by its key."""
        rows = self._read(
            "firing",
            f"{_FIRING_READ} WHERE f.trigger_id = ? AND f.key = ?",
            (trigger_id, key),
        )
        return _firing_row(rows[0]) if rows else None

    def trigger_running(self, trigger_id: int) -> list[int]:
        """The executions a trigger started that have not ended, oldest first."""
        rows = self._read(
            "trigger_running",
            "SELECT f.execution_id FROM trigger_firing f"
            " JOIN execution e ON e.execution_id = f.execution_id"
            f" WHERE f.trigger_id = ? AND f.status = 'started' AND e.status NOT IN ({_ENDED})"
            " ORDER BY f.execution_id",
            (trigger_id,),
        )
        return [int(r[0]) for r in rows]

    def trigger_states(
        self, trigger_ids: Sequence[int], *, running: bool = True
    ) -> dict[int, TriggerState]:
        """The planning state of many triggers in one read: watermark, runs still going
        (when `running`), buffered slots."""
        states = {t: TriggerState(None, [], []) for t in trigger_ids}
        for start in range(0, len(trigger_ids), 500):
            chunk = list(trigger_ids[start : start + 500])
            marks = ", ".join("?" * len(chunk))
            for tid, mark in self._read(
                "trigger_states",
                f"SELECT trigger_id, watermark FROM trigger_state WHERE trigger_id IN ({marks})",
                chunk,
            ):
                states[int(tid)].watermark = float(mark)
            for tid, key, slot in self._read(
                "trigger_states",
                "SELECT trigger_id, key, slot FROM trigger_firing"
                f" WHERE trigger_id IN ({marks}) AND status = 'buffered' ORDER BY slot, key",
                chunk,
            ):
                states[int(tid)].buffered.append((str(key), float(slot)))
            if running:
                for tid, eid in self._read(
                    "trigger_states",
                    "SELECT f.trigger_id, f.execution_id FROM trigger_firing f"
                    " JOIN execution e ON e.execution_id = f.execution_id"
                    f" WHERE f.trigger_id IN ({marks}) AND f.status = 'started'"
                    f" AND e.status NOT IN ({_ENDED}) ORDER BY f.execution_id",
                    chunk,
                ):
                    states[int(tid)].running.append(int(eid))
        return states

    def trigger_buffered(self, trigger_id: int) -> list[tuple[str, float]]:
        """A schedule's buffered slots (key, slot), oldest first."""
        rows = self._read(
            "trigger_buffered",
            "SELECT key, slot FROM trigger_firing WHERE trigger_id = ? AND status = 'buffered'"
            " ORDER BY slot, key",
            (trigger_id,),
        )
        return [(str(r[0]), float(r[1])) for r in rows]
