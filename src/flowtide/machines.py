"""A process's snowflake machine id, leased from the cluster database.

Every process that writes ids into a shared database — each `flowtide server` process
(each of `--workers N`) — holds one of the 1,024 machine ids at a time
(`store/pg/machines.py`), so no two live processes issue the same id, whatever their
WORKER_ID, host name or pid. A hash of those (the embedded default) collides: at 40
processes, more likely than not.

The lease lasts `seconds` by the database's clock and is renewed every quarter of that.
The generator stops issuing ids a margin short of the expiry, measured on this process's
monotonic clock from before the statement was sent, so a process paused past its lease
(a stopped VM, a long GC) raises `MachineLeaseExpired` instead of issuing ids another
process may have taken the machine id for. A lease found lost on renewal is replaced by a
new machine id; the new holder of an id starts after the last millisecond the previous
one could have used.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from typing import Any

from flowtide.errors import StoreError
from flowtide.ids import Snowflake, lease_margin
from flowtide.store import pg

log = logging.getLogger("flowtide.machines")

__all__ = ["MachineLease", "holder_name"]

DEFAULT_SECONDS = 60.0


def holder_name(kind: str) -> str:
    """A holder label unique to this process: kind, host, pid and a random suffix."""
    return f"{kind}:{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class MachineLease:
    """One machine id for `generator`, leased as `holder` through `store` (a
    PostgresStore: its cluster part)."""

    def __init__(
        self,
        store: Any,
        holder: str,
        generator: Snowflake,
        *,
        seconds: float = DEFAULT_SECONDS,
        among: range = pg.machines.SERVER_IDS,
    ) -> None:
        self.store = store
        self.among = among
        self.holder = holder
        self.generator = generator
        self.seconds = seconds
        # Stop issuing this long before the database's expiry.
        self.margin = lease_margin(seconds)
        self.machine: int | None = None

    def acquire(self) -> int:
        """Take a machine id and point the generator at it.

        Raises:
            StoreError: the database cannot be reached, or all 1,024 ids are held.
        """
        sent = time.monotonic()
        with self.store.transaction("machine id lease", "cluster") as conn:
            lease = pg.machines.acquire(conn, self.holder, self.seconds, self.among)
        if lease is None:
            raise StoreError(
                f"no free snowflake machine id: the {len(self.among)} of this kind of"
                " process are all held; stop some, or wait for the leases of dead ones to"
                f" expire ({self.seconds:g} s)"
            )
        self.machine = lease.machine_id
        self._lease(sent, floor_ms=lease.floor_ms)
        return lease.machine_id

    def _lease(self, sent: float, *, floor_ms: int = 0) -> None:
        assert self.machine is not None
        valid_for = sent + self.seconds - self.margin - time.monotonic()
        self.generator.lease(self.machine, valid_for=valid_for, floor_ms=floor_ms)

    def renew(self) -> int:
        """Extend the lease; a lease found lost is replaced by a new machine id (which is
        returned).

        Raises:
            StoreError: the database cannot be reached (the generator keeps issuing until
                its deadline; the next renewal tries again).
        """
        if self.machine is None:
            return self.acquire()
        sent = time.monotonic()
        # The bound holds for the renewed term too, should this process die holding it.
        issued = self.generator.issued_until_ms(extended_by=self.seconds)
        with self.store.transaction("machine id renewal", "cluster") as conn:
            kept = pg.machines.renew(conn, self.machine, self.holder, self.seconds, issued)
        if kept:
            self._lease(sent)
            return self.machine
        log.warning(
            "machine id %s: the lease was lost (this process was paused or cut off for"
            " longer than %g s); taking another",
            self.machine,
            self.seconds,
        )
        return self.acquire()

    def release(self) -> None:
        """Stop issuing ids and give the machine id back (a process that stops)."""
        if self.machine is None:
            return
        issued = self.generator.end_lease()  # nothing is issued after this
        machine, self.machine = self.machine, None
        try:
            with self.store.transaction("machine id release", "cluster") as conn:
                pg.machines.release(conn, machine, self.holder, issued)
        except StoreError as exc:  # it expires on its own
            log.warning("machine id %s: not released (%s); it expires on its own", machine, exc)

    async def keep(self) -> None:
        """Renew every quarter of the lease until cancelled."""
        while True:
            await asyncio.sleep(self.seconds / 4)
            try:
                await asyncio.to_thread(self.renew)
            except asyncio.CancelledError:
                raise
            except StoreError as exc:
                log.warning("machine id %s: renewal failed: %s", self.machine, exc)
