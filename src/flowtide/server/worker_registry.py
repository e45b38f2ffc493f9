"""The worker registry, and which worker identities a credential may speak for.

A worker registers with a worker id of its choosing (`HOSTNAME-PID` by default) under its
credential (a worker token or JWT, the principal's `subject`); the `worker` row keeps that
subject. From then on, heartbeats, claims, reports and credential requests naming the
worker id are taken only from the same subject: a worker id copied from the event log is
worth nothing to anyone else. A live worker id cannot be taken over by another
credential; a stopped or lost one can (a worker restarted with a new token).

The worker's pool is the one it registered for, which must be its credential's pool when
the credential is bound to one; it claims commands of that pool only.

A registering worker is also given a snowflake machine id of its own (leased in the
cluster database as flowtide.machines does for server processes; its heartbeats renew it,
deregistering gives it back): the event ids in its reports never repeat another
process's, which the server would drop as already stored.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar

from flowtide.errors import AuthError, NotFoundError, StoreError
from flowtide.machines import DEFAULT_SECONDS
from flowtide.store import pg
from flowtide.store.pg.workers import WorkerRow

if TYPE_CHECKING:
    import psycopg

    from flowtide.auth.principal import Principal
    from flowtide.store.postgres import PostgresStore

__all__ = ["WorkerRegistry", "WorkerRow"]

#: Seconds a process trusts what it read of a worker's binding.
_TTL: Final = 5.0
#: A worker's snowflake machine-id lease (renewed by its heartbeats): as a server's.
MACHINE_LEASE_SECONDS: Final = DEFAULT_SECONDS

T = TypeVar("T")


def _machine_reply(machine_id: int, holder: str, floor_ms: int) -> dict[str, Any]:
    """A machine-id lease as the register and heartbeat replies give it to a worker."""
    return {
        "machine_id": machine_id,
        "holder": holder,
        "floor_ms": floor_ms,
        "seconds": MACHINE_LEASE_SECONDS,
    }


class WorkerRegistry:
    """Worker rows of the cluster database, and the checks of a worker's identity."""

    def __init__(self, store: PostgresStore, *, worker_timeout: float) -> None:
        self.store = store
        self.worker_timeout = worker_timeout
        self._bound: dict[str, tuple[float, WorkerRow]] = {}

    async def _run(self, op: str, query: Callable[[psycopg.Connection], T]) -> T:
        """`query` in a transaction of the cluster database, in a thread."""

        def run() -> T:
            with self.store.transaction(op, "cluster") as conn:
                return query(conn)

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
        row = await self._run(
            "worker register",
            lambda conn: pg.workers.register(
                conn,
                worker_id=worker_id,
                pool=pool,
                hostname=hostname,
                pid=pid,
                concurrency=concurrency,
                subject=subject,
                now=now,
                lost_before=now - self.worker_timeout,
            ),
        )
        if row is None:
            raise AuthError(
                f"worker id {worker_id!r} is in use by a live worker of another credential",
                status=403,
            )
        self._bound[worker_id] = (time.monotonic() + _TTL, row)

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
            row = await self._run("worker lookup", lambda conn: pg.workers.get(conn, worker_id))
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

    async def acting(self, principal: Principal, worker_id: str | None) -> str:
        """The worker id a worker's request speaks for, once checked against its
        credential.

        Raises:
            AuthError: 422 without a worker id; see `check`.
            NotFoundError: the worker id is not registered.
        """
        if worker_id is None:
            raise AuthError("worker_id is required", status=422)
        await self.require(principal, worker_id)
        return worker_id

    async def require_holder(
        self, principal: Principal, execution_id: int, *, parent: bool = False
    ) -> None:
        """A worker reads only executions of the commands it holds (or their children,
        `parent`); other roles are not limited here.

        Raises:
            AuthError: 403, the caller is a worker that holds no such command.
        """
        if principal.role != "worker" or principal.insecure:
            return
        if not await self.holds(principal, execution_id, parent=parent):
            what = "a sub-playbook of a command" if parent else "a command"
            raise AuthError(
                f"{principal.describe()} holds no {what} of execution {execution_id}",
                status=403,
            )

    async def lease_machine(self, worker_id: str) -> dict[str, Any]:
        """A snowflake machine id for a registering worker (flowtide.machines): what the
        register reply carries, `holder` being the secret the worker renews it with.

        Raises:
            StoreError: all 1,024 are held.
        """
        holder = f"worker:{worker_id}:{secrets.token_hex(8)}"

        def lease_one(conn: psycopg.Connection) -> pg.machines.Lease | None:
            # One lease per worker id: registering again gives back the earlier one, so
            # no amount of re-registering can hoard the 1,024 ids.
            pg.machines.release_prefixed(conn, f"worker:{worker_id}:")
            return pg.machines.acquire(conn, holder, MACHINE_LEASE_SECONDS, pg.machines.WORKER_IDS)

        lease = await self._run("machine id lease", lease_one)
        if lease is None:
            raise StoreError(
                f"no free snowflake machine id for a worker: all {len(pg.machines.WORKER_IDS)}"
                " are held by live workers"
            )
        return _machine_reply(lease.machine_id, holder, lease.floor_ms)

    async def renew_machine(
        self, worker_id: str, machine_id: int, holder: str, issued_until_ms: int
    ) -> dict[str, Any]:
        """The worker's lease renewed, or a new machine id when it was lost (or the
        holder is not this worker's)."""
        if holder.startswith(f"worker:{worker_id}:"):
            kept = await self._run(
                "machine id renewal",
                lambda conn: pg.machines.renew(
                    conn, machine_id, holder, MACHINE_LEASE_SECONDS, issued_until_ms
                ),
            )
            if kept:
                return _machine_reply(machine_id, holder, 0)
        return await self.lease_machine(worker_id)

    async def release_machine(
        self, worker_id: str, machine_id: int, holder: str, issued_until_ms: int
    ) -> None:
        if holder.startswith(f"worker:{worker_id}:"):
            await self._run(
                "machine id release",
                lambda conn: pg.machines.release(conn, machine_id, holder, issued_until_ms),
            )

    async def heartbeat(self, worker_id: str, running: int) -> bool:
        now = time.time()
        return await self._run(
            "worker heartbeat", lambda conn: pg.workers.heartbeat(conn, worker_id, running, now)
        )

    async def deregister(self, worker_id: str) -> bool:
        self._bound.pop(worker_id, None)
        now = time.time()
        return await self._run(
            "worker deregister", lambda conn: pg.workers.deregister(conn, worker_id, now)
        )

    async def all(self) -> list[WorkerRow]:
        return await self._run("worker pools", pg.workers.list_all)

    async def ids_of(self, principal: Principal) -> list[str]:
        """The worker ids registered under the caller's credential."""
        return await self._run(
            "worker ids", lambda conn: pg.workers.ids_of(conn, principal.subject)
        )

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
                target = pg.executions.parent_of(conn, execution_id) if parent else execution_id
                if target is None:
                    return False
                return pg.commands.held_by_any(conn, target, ids)

        return await asyncio.to_thread(read)
