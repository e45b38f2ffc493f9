"""The worker registry, and which worker identities a credential may speak for.

A worker registers with a worker id of its choosing (`HOSTNAME-PID` by default) under its
credential (a worker token or JWT, the principal's `subject`); the `worker` row keeps that
subject. From then on, heartbeats, claims, reports and credential requests naming the
worker id are taken only from the same subject: a worker id copied from the event log is
worth nothing to anyone else. A live worker id cannot be taken over by another
credential; a stopped or lost one can (a worker restarted with a new token).

The worker's pool is the one it registered for, which must be its credential's pool when
the credential is bound to one; it claims commands of that pool only.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from flowtide.errors import AuthError, NotFoundError

if TYPE_CHECKING:
    from flowtide.auth.principal import Principal
    from flowtide.store.postgres import PostgresStore

__all__ = ["WorkerRegistry", "WorkerRow"]

#: Seconds a process trusts what it read of a worker's binding.
_TTL: Final = 5.0


@dataclass(frozen=True)
class WorkerRow:
    worker_id: str
    pool: str
    hostname: str | None
    pid: int | None
    concurrency: int
    heartbeat: float
    status: str
    running: int
    subject: str | None


_COLUMNS: Final = (
    "worker_id, pool, hostname, pid, concurrency, heartbeat, status, running, token_id"
)


class WorkerRegistry:
    """Worker rows of the cluster database, and the checks of a worker's identity."""

    def __init__(self, store: PostgresStore, *, worker_timeout: float) -> None:
        self.store = store
        self.worker_timeout = worker_timeout
        self._bound: dict[str, tuple[float, WorkerRow]] = {}

    async def _run(self, op: str, sql: str, params: tuple[Any, ...]) -> list[Any]:
        def run() -> list[Any]:
            with self.store.transaction(op, "cluster") as conn:
                cur = conn.execute(sql, params)
                return list(cur.fetchall()) if cur.description else [cur.rowcount]

        return await asyncio.to_thread(run)

    async def register(
        self,
        principal: Principal,
        *,
        worker_id: str,
        pool: str,
        hostname: str | None,
        pid: int | None,
        concurrency: int,
    ) -> None:
        """Record (or renew) a worker under the caller's subject.

        Raises:
            AuthError: 403 when the credential is bound to another pool, or the worker id
                is held by a live worker of another credential.
        """
        if principal.pool is not None and pool != principal.pool:
            raise AuthError(
                f"{principal.describe()} serves pool {principal.pool!r}, not {pool!r}", status=403
            )
        now = time.time()
        subject = None if principal.insecure else principal.subject
        # One statement: the row is taken over only when it is ours, stopped or lost.
        rows = await self._run(
            "worker register",
            "INSERT INTO worker (worker_id, pool, hostname, pid, concurrency, registered,"
            " heartbeat, status, token_id) VALUES (%s,%s,%s,%s,%s,%s,%s,'ready',%s)"
            " ON CONFLICT (worker_id) DO UPDATE SET pool = excluded.pool,"
            " hostname = excluded.hostname, pid = excluded.pid,"
            " concurrency = excluded.concurrency, heartbeat = excluded.heartbeat,"
            " status = 'ready', token_id = excluded.token_id"
            " WHERE worker.token_id IS NOT DISTINCT FROM excluded.token_id"
            " OR worker.status = 'stopped' OR worker.heartbeat < %s"
            f" RETURNING {_COLUMNS}",
            (
                worker_id,
                pool,
                hostname,
                pid,
                concurrency,
                now,
                now,
                subject,
                now - self.worker_timeout,
            ),
        )
        if not rows:
            raise AuthError(
                f"worker id {worker_id!r} is in use by a live worker of another credential",
                status=403,
            )
        self._bound[worker_id] = (time.monotonic() + _TTL, _row(rows[0]))

    async def check(self, principal: Principal, worker_id: str) -> WorkerRow | None:
        """The row of `worker_id` when the caller may speak for it (None: not registered,
        or the server runs without authentication).

        Raises:
            AuthError: 403, the worker id is registered under another credential.
        """
        now = time.monotonic()
        hit = self._bound.get(worker_id)
        if hit is not None and hit[0] > now:
            row: WorkerRow | None = hit[1]
        else:
            found = await self._run(
                "worker lookup", f"SELECT {_COLUMNS} FROM worker WHERE worker_id = %s", (worker_id,)
            )
            row = _row(found[0]) if found else None
            if row is not None:
                self._bound[worker_id] = (now + _TTL, row)
                if len(self._bound) > 10_000:
                    self._bound.pop(next(iter(self._bound)))
        if row is None or principal.insecure:
            return row
        if row.subject != principal.subject:
            raise AuthError(
                f"{principal.describe()} may not act as worker {worker_id!r}", status=403
            )
        return row

    async def require(self, principal: Principal, worker_id: str) -> WorkerRow | None:
        """`check`, and a worker that is not registered is a 404 (register first).

        Raises:
            AuthError: see `check`.
            NotFoundError: the worker id is not registered.
        """
        row = await self.check(principal, worker_id)
        if row is None:
            raise NotFoundError(f"worker {worker_id!r} is not registered")
        return row

    async def heartbeat(self, worker_id: str, running: int) -> bool:
        rows = await self._run(
            "worker heartbeat",
            "UPDATE worker SET heartbeat = %s, running = %s WHERE worker_id = %s",
            (time.time(), running, worker_id),
        )
        return bool(rows[0])

    async def deregister(self, worker_id: str) -> bool:
        self._bound.pop(worker_id, None)
        rows = await self._run(
            "worker deregister",
            "UPDATE worker SET status = 'stopped', heartbeat = %s WHERE worker_id = %s",
            (time.time(), worker_id),
        )
        return bool(rows[0])

    async def all(self) -> list[WorkerRow]:
        rows = await self._run(
            "worker pools", f"SELECT {_COLUMNS} FROM worker ORDER BY pool, worker_id", ()
        )
        return [_row(r) for r in rows]

    async def ids_of(self, principal: Principal) -> list[str]:
        """The worker ids registered under the caller's credential."""
        rows = await self._run(
            "worker ids",
            "SELECT worker_id FROM worker WHERE token_id = %s",
            (principal.subject,),
        )
        return [r[0] for r in rows]

    async def holds(self, principal: Principal, execution_id: int, *, parent: bool = False) -> bool:
        """Whether one of the caller's workers holds or held a command of the execution
        (`parent`: of the execution's parent, for a sub-playbook the worker waits on).
        Held counts too: a cancel or finalize closes the commands, and their worker must
        still learn that it should stop."""
        if principal.insecure:
            return True
        ids = await self.ids_of(principal)
        if not ids:
            return False

        def read() -> bool:
            with self.store.transaction("worker holds") as conn:
                target = execution_id
                if parent:
                    row = conn.execute(
                        "SELECT parent_execution_id FROM execution WHERE execution_id = %s",
                        (execution_id,),
                    ).fetchone()
                    if row is None or row[0] is None:
                        return False
                    target = row[0]
                return (
                    conn.execute(
                        "SELECT 1 FROM command WHERE execution_id = %s"
                        " AND worker_id = ANY(%s) LIMIT 1",
                        (target, ids),
                    ).fetchone()
                    is not None
                )

        return await asyncio.to_thread(read)


def _row(r: Any) -> WorkerRow:
    return WorkerRow(*r)
