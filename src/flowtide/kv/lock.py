"""Leases on one key of a bucket: a lock with a fencing token, and leader election.

    lock = KVLock(kv, "gc", ttl=10, holder="server-1")
    async with lock.hold(timeout=30) as lease:   # LockTimeoutError after 30 s
        await collect_garbage(fence=lease.token)  # cancelled if the lease is lost

Works on every adapter of the port: it needs `create`, compare-and-set `update` and
`delete`, and `watch`; no per-message TTL and no synchronised clocks. Leader election
(`flowtide.kv.election.Election`) campaigns for such a lock again after every term.

**How.** Acquiring is `create(key, value)`; the value (JSON) names the holder, a random
lease id and the lease's `ttl`. The revision `create` returns is the lease's *fencing
token*: revisions of a bucket only grow, so each successive holder of the key gets a
larger one. While held, a background task renews every `ttl / 3` with
`update(key, value, last=<revision it wrote last>)`; each renewal is a new revision of
the key, the token stays the acquiring revision (renewals carry it in the value).
Releasing is `delete(key, last=<that revision>)`, so a late releaser never removes a
successor's lock.

**Take-over without clocks.** A contender that finds the key held notes, on its own
monotonic clock, when it first saw the key's current revision. If that revision is
still current `ttl` seconds later (the `ttl` the holder wrote in the value), the holder
has stopped renewing: the contender writes `update(key, value, last=<that revision>)`,
a compare-and-set only one contender wins. A deleted or purged key is `create`d again;
a watch on the key wakes contenders at once when it changes.

**The holder stops first.** A holder measures its lease from the moment it *sent* its
last successful renewal (or the create): it is valid until `sent + ttl * safety`
(`safety` 0.8 by default). A contender can see that revision only after it was written,
so it cannot take over before `sent + ttl` on its clock. At the holder's deadline
`Lease.lost` is set and the body of `async with lease:` is cancelled, `ttl * (1 -
safety)` before any contender may write (2 s of a 10 s lease). A renewal refused
because the key moved on (taken over, deleted) loses the lease at once.

**Guarantees, and what they rest on.** At most one holder considers itself holding at
any moment, provided (1) the clocks of holder and contenders run at nearly the same
*rate* (a monotonic clock that drifts less than `1 - safety` over one `ttl`; their
wall-clock times never matter), (2) a holder's process is not paused for longer than
that margin between checking `held` and acting on it (GC pauses, a suspended VM), and
(3) the bucket's revisions are linearizable and acknowledged writes are not lost (a
single nats-server, or an R3 bucket, whose writes go through the stream leader; a server
that loses an acknowledged write, as JetStream can on a crash without `sync_interval:
always`, may hand the same token out twice). It is a lease, not consensus across partitions: a
holder cut off from the server keeps its lease until its deadline, and a pause past
the deadline makes a stale holder act late. Hence the fencing token: a resource the
lock protects must remember the largest token it has accepted and refuse a write with
a smaller one, which makes a late, stale holder harmless. Destroying and re-creating
the bucket restarts its revisions, and with them the tokens. A bucket TTL must be
longer than the lease `ttl`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Self

from flowtide.kv.base import KeyValue, KeyWatcher
from flowtide.kv.errors import KeyExistsError, KeyNotFoundError, KVError, WrongRevisionError
from flowtide.kv.keys import validate_key

__all__ = [
    "DEFAULT_SAFETY",
    "MAX_HOLDER_LENGTH",
    "MAX_TTL",
    "MIN_TTL",
    "KVLock",
    "Lease",
    "LeaseLostError",
    "LockError",
    "LockInfo",
    "LockTimeoutError",
]

_log = logging.getLogger("flowtide.kv.lock")

#: Bounds of a lease's ttl in seconds: below 0.1 s a renewal's round trip is a large
#: part of the lease; above a day a crashed holder blocks everyone for too long.
MIN_TTL: Final = 0.1
MAX_TTL: Final = 86400.0
MAX_HOLDER_LENGTH: Final = 256
DEFAULT_SAFETY: Final = 0.8
_FORMAT: Final = "flowtide.lease/1"

Clock = Callable[[], float]


class LockError(KVError):
    """Root of the lock's errors."""


class LockTimeoutError(LockError, TimeoutError):
    """`acquire` gave up after its timeout; `holder` is who held the key last seen."""

    def __init__(self, bucket: str, key: str, timeout: float, holder: str | None) -> None:
        self.timeout = timeout
        self.holder = holder
        by = f" (held by {holder!r})" if holder else ""
        KVError.__init__(
            self,
            f"lock {key!r} in bucket {bucket!r} not acquired within {timeout:g} s{by}",
            bucket=bucket,
            key=key,
        )


class LeaseLostError(LockError):
    """The lease ended while its `async with` body ran; the body was cancelled."""

    def __init__(self, lease: Lease) -> None:
        self.token = lease.token
        self.reason = lease.lost_reason
        KVError.__init__(
            self,
            f"lease on {lease.key!r} (token {lease.token}) lost: {lease.lost_reason}",
            bucket=lease.bucket,
            key=lease.key,
        )


@dataclass(frozen=True, slots=True)
class LockInfo:
    """Who holds a lock, as its key says (`KVLock.current`)."""

    holder: str
    token: int
    revision: int
    ttl: float


def _validate_ttl(ttl: float, bucket: str) -> float:
    if (
        isinstance(ttl, bool)
        or not isinstance(ttl, int | float)
        or not math.isfinite(ttl)
        or not MIN_TTL <= ttl <= MAX_TTL
    ):
        raise KVError(
            f"lock ttl must be {MIN_TTL}..{MAX_TTL:g} seconds, got {ttl!r}", bucket=bucket
        )
    return float(ttl)


def _validate_holder(holder: str, bucket: str) -> str:
    if not isinstance(holder, str) or not 1 <= len(holder) <= MAX_HOLDER_LENGTH:
        raise KVError(
            f"lock holder must be a string of 1..{MAX_HOLDER_LENGTH} characters, "
            f"got {type(holder).__name__} of length {len(holder) if isinstance(holder, str) else '-'}",
            bucket=bucket,
        )
    if not holder.isprintable():
        raise KVError("lock holder must be printable text (no control characters)", bucket=bucket)
    return holder


def _parse(value: bytes) -> dict[str, Any] | None:
    """A lease value, or None when the key holds something else."""
    try:
        data = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict) or data.get("format") != _FORMAT:
        return None
    return data


def _declared_ttl(data: dict[str, Any] | None, default: float) -> float:
    """The ttl a lease value declares, clamped to the allowed range; `default` for a
    value that is not a lease (a contender then waits its own ttl)."""
    ttl = data.get("ttl") if data else None
    if isinstance(ttl, int | float) and not isinstance(ttl, bool) and math.isfinite(ttl):
        return min(max(float(ttl), MIN_TTL), MAX_TTL)
    return default


class _Observation:
    """A contender's view of the key: the revision it saw, since when (its own
    monotonic clock) and the ttl its holder declared. Pure logic."""

    def __init__(self) -> None:
        self.revision = -1
        self.since = 0.0
        self.ttl = 0.0

    def observe(self, revision: int, ttl: float, now: float) -> None:
        """Note that the key is at `revision` at `now`; a new revision restarts the wait."""
        if revision != self.revision:
            self.revision, self.since, self.ttl = revision, now, ttl

    @property
    def expires(self) -> float:
        """When the holder of `revision` has stopped renewing, if it is still current."""
        return self.since + self.ttl


class KVLock:
    """A lease-based lock on `key` of the bucket `kv` (see the module docstring).

    Args:
        kv: the bucket handle; it must stay open while leases are held.
        key: a valid key of the bucket.
        ttl: seconds a lease lasts without renewal (MIN_TTL..MAX_TTL).
        holder: who is asking, stored in the value for people (default host:pid);
            printable, at most MAX_HOLDER_LENGTH characters. Not a secret: anyone who
            can read the bucket sees it.
        safety: the part of `ttl` a holder trusts its lease for (0.5..0.95).
        clock: a monotonic clock in seconds (tests).
    Raises:
        InvalidKeyError: the key is invalid.
        KVError: ttl, holder or safety out of range.
    """

    def __init__(
        self,
        kv: KeyValue,
        key: str,
        *,
        ttl: float,
        holder: str | None = None,
        safety: float = DEFAULT_SAFETY,
        clock: Clock = time.monotonic,
    ) -> None:
        self.kv = kv
        self.key = validate_key(key, bucket=kv.bucket)
        self.ttl = _validate_ttl(ttl, kv.bucket)
        if holder is None:
            holder = f"{socket.gethostname()}:{os.getpid()}"[:MAX_HOLDER_LENGTH]
        self.holder = _validate_holder(holder, kv.bucket)
        if not isinstance(safety, int | float) or not 0.5 <= safety <= 0.95:
            raise KVError(f"lock safety must be 0.5..0.95, got {safety!r}", bucket=kv.bucket)
        self.safety = float(safety)
        self.clock = clock

    def _value(self, lease_id: str, token: int | None, renewals: int) -> bytes:
        """The value a lease writes (`time` is wall-clock, for people only)."""
        return json.dumps(
            {
                "format": _FORMAT,
                "holder": self.holder,
                "lease": lease_id,
                "ttl": self.ttl,
                "token": token,
                "renewals": renewals,
                "time": round(time.time(), 3),
            },
            separators=(",", ":"),
        ).encode()

    async def current(self) -> LockInfo | None:
        """Who holds the lock as the key says now (None: free). A holder that stopped
        renewing still shows until someone takes over."""
        try:
            entry = await self.kv.get(self.key)
        except KeyNotFoundError:
            return None
        data = _parse(entry.value) or {}
        token = data.get("token")
        return LockInfo(
            holder=str(data.get("holder", "?")),
            token=token if isinstance(token, int) else entry.revision,
            revision=entry.revision,
            ttl=_declared_ttl(data, self.ttl),
        )

    def hold(self, timeout: float | None = None) -> _Hold:
        """`async with lock.hold(timeout) as lease:` acquires, runs the body (cancelled
        and LeaseLostError raised if the lease is lost meanwhile) and releases."""
        return _Hold(self, timeout)

    async def acquire(self, timeout: float | None = None) -> Lease:
        """Wait until the lock is ours and return the lease (renewed in the background
        until `release`).

        A call cancelled while its write is in flight may leave the key written with
        nobody renewing it: contenders take it over after `ttl`.

        Args:
            timeout: seconds to wait at most (0: one try); None waits as long as it
                takes.
        Raises:
            LockTimeoutError: not acquired within `timeout`.
            KVError: the bucket failed (closed, destroyed, unreachable).
        """
        start = self.clock()
        task = asyncio.current_task()
        base = task.cancelling() if task is not None else 0

        def cancelled() -> bool:
            # A client that waits for a reply with asyncio.wait_for can, on Python 3.11,
            # swallow a cancellation that arrives with the reply: honour it here.
            return task is not None and task.cancelling() > base

        async def won(revision: int, sent: float) -> Lease:
            lease = Lease(self, lease_id, revision, sent)
            if cancelled():
                await lease.release()
                raise asyncio.CancelledError
            return lease

        give_up = None if timeout is None else start + max(0.0, timeout)
        lease_id = secrets.token_hex(8)
        value = self._value(lease_id, None, 0)
        changed = asyncio.Event()
        seen = _Observation()
        holder: str | None = None
        watcher = self.kv.watch(self.key, updates_only=True, meta_only=True)
        await watcher.__aenter__()  # starts the watch before the first look
        waker = asyncio.create_task(_wake_on_change(watcher, changed))
        try:
            while True:
                if cancelled():
                    raise asyncio.CancelledError
                changed.clear()
                sent = self.clock()
                try:
                    return await won(await self.kv.create(self.key, value), sent)
                except KeyExistsError as exc:
                    current = exc.revision
                if current != seen.revision:
                    try:
                        entry = await self.kv.get(self.key)
                    except KeyNotFoundError:
                        continue  # released meanwhile: create again
                    data = _parse(entry.value)
                    holder = str(data.get("holder")) if data else None
                    seen.observe(entry.revision, _declared_ttl(data, self.ttl), self.clock())
                now = self.clock()
                if now >= seen.expires and not cancelled():
                    sent = now
                    try:
                        revision = await self.kv.update(self.key, value, seen.revision)
                    except WrongRevisionError:
                        continue  # it moved: renewed, released or taken by another
                    _log.warning(
                        "lock %r: took over from %r, which stopped renewing", self.key, holder
                    )
                    return await won(revision, sent)
                wait = seen.expires - now
                if give_up is not None:
                    if now >= give_up:
                        raise LockTimeoutError(self.kv.bucket, self.key, timeout or 0.0, holder)
                    wait = min(wait, give_up - now)
                # The watch wakes us on any change; the timeout is the take-over time.
                # asyncio.timeout, not wait_for: on 3.11 wait_for may swallow a cancel.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(wait, 0.0)):
                        await changed.wait()
        finally:
            await _stop(waker)
            with contextlib.suppress(KVError):
                await watcher.stop()


async def _stop(task: asyncio.Task[Any]) -> None:
    """Cancel `task` and wait for it to end. A cancellation of the caller meanwhile
    propagates (suppressing CancelledError around `await task` would swallow it)."""
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled() and task.exception() is not None:
        _log.debug("lock: background task ended with %r", task.exception())


async def _wake_on_change(watcher: KeyWatcher, changed: asyncio.Event) -> None:
    with contextlib.suppress(KVError):
        async for _ in watcher:
            changed.set()


class _Hold:
    def __init__(self, lock: KVLock, timeout: float | None) -> None:
        self._lock = lock
        self._timeout = timeout
        self._lease: Lease | None = None

    async def __aenter__(self) -> Lease:
        self._lease = await self._lock.acquire(self._timeout)
        try:
            return await self._lease.__aenter__()
        except BaseException:
            await self._lease.release()
            raise

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._lease is not None
        await self._lease.__aexit__(et, e, tb)


class Lease:
    """A held lock: renewed in the background until `release` or until lost.

    `token` is the fencing token (the acquiring revision, larger than any earlier
    holder's); `revision` is the key's revision this lease wrote last. `lost` is set
    when the lease ends (lost or released; `lost_reason` says which) and `held` is
    False from then on. `async with lease:` releases at the end and cancels its body
    when the lease is lost, then raises LeaseLostError.
    """

    def __init__(self, lock: KVLock, lease_id: str, revision: int, sent: float) -> None:
        self._lock = lock
        self._id = lease_id
        self.bucket = lock.kv.bucket
        self.key = lock.key
        self.holder = lock.holder
        self.token = revision
        self.revision = revision
        self.renewals = 0
        #: Monotonic time the lease was acquired (the create/update answered).
        self.acquired_at = lock.clock()
        #: Monotonic time the lease ended, and why (None while held).
        self.lost_at: float | None = None
        self.lost_reason: str | None = None
        self.lost = asyncio.Event()
        self._deadline = sent + lock.ttl * lock.safety
        self._released = False
        self._body: asyncio.Task[Any] | None = None
        self._body_cancels = 0
        self._cancelled_body = False
        self._timer: asyncio.TimerHandle | None = None
        self._arm()
        self._task = asyncio.create_task(self._keep_alive(sent), name=f"kv-lease:{self.key}")
        _log.info("lock %r acquired by %r, token %d", self.key, self.holder, self.token)

    @property
    def deadline(self) -> float:
        """Monotonic time until which the lease is trusted, unless renewed."""
        return self._deadline

    @property
    def held(self) -> bool:
        """True while the lease is neither lost, released nor past its deadline (no I/O)."""
        return not self.lost.is_set() and self._lock.clock() < self._deadline

    async def check(self) -> bool:
        """Whether the key still holds this lease, by reading it once (and `held`).
        A key that moved to someone else loses the lease."""
        if not self.held:
            return False
        try:
            entry = await self._lock.kv.get(self.key)
        except KeyNotFoundError:
            self._lose("the key was deleted")
            return False
        if entry.revision != self.revision and (_parse(entry.value) or {}).get("lease") != self._id:
            self._lose(f"the key moved to revision {entry.revision}")
            return False
        return self.held

    async def release(self) -> bool:
        """Stop renewing and delete the key if it still holds this lease (a delete
        expecting the revision this lease wrote last). Idempotent; never raises for
        the bucket's errors (they are logged: the lease then expires after its ttl).

        Returns:
            True if this call deleted the key.
        """
        if self._released:
            return False
        self._released = True
        await _stop(self._task)
        self._lose("released")
        kv = self._lock.kv
        try:
            for _ in range(3):
                try:
                    await kv.delete(self.key, last=self.revision)
                    _log.info("lock %r released by %r", self.key, self.holder)
                    return True
                except WrongRevisionError:
                    # A renewal whose answer never came may have landed: ours if the
                    # value carries our lease id, else a successor's, left alone.
                    entry = await kv.get(self.key)
                    if (_parse(entry.value) or {}).get("lease") != self._id:
                        return False
                    self.revision = entry.revision
        except KeyNotFoundError:
            return False
        except KVError as exc:
            _log.warning("lock %r: release failed (%s); it expires after its ttl", self.key, exc)
        return False

    # ------------------------------------------------------------ the context manager

    async def __aenter__(self) -> Self:
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - always inside a task under asyncio
            raise LockError("a lease's async with needs an asyncio task", bucket=self.bucket)
        if not self.held:
            raise LeaseLostError(self)
        self._body, self._body_cancels = task, task.cancelling()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        body, self._body = self._body, None
        ours = self._cancelled_body and body is not None
        outside = False
        if ours and body is not None:
            outside = body.uncancel() > self._body_cancels
        await self.release()
        if ours and not outside and (et is None or issubclass(et, asyncio.CancelledError)):
            raise LeaseLostError(self) from e
        if et is None and body is not None and body.cancelling() > self._body_cancels:
            # A cancellation the bucket's client swallowed while releasing (see acquire).
            raise asyncio.CancelledError

    # ------------------------------------------------------------------ internals

    def _arm(self) -> None:
        """(Re)schedule the deadline, which loses the lease even if renewal hangs."""
        if self._timer is not None:
            self._timer.cancel()
        delay = max(0.0, self._deadline - self._lock.clock())
        self._timer = asyncio.get_running_loop().call_later(delay, self._expire)

    def _expire(self) -> None:
        if self._lock.clock() >= self._deadline:
            self._lose("no renewal succeeded before the lease's deadline")
        else:
            self._arm()

    def _lose(self, reason: str) -> None:
        if self.lost.is_set():
            return
        self.lost_at = self._lock.clock()
        self.lost_reason = reason
        self.lost.set()
        if self._timer is not None:
            self._timer.cancel()
        if reason != "released":
            _log.warning(
                "lock %r: lease of %r (token %d) lost: %s",
                self.key,
                self.holder,
                self.token,
                reason,
            )
            if self._task is not asyncio.current_task():
                self._task.cancel()
            if self._body is not None and not self._body.done():
                self._cancelled_body = True
                self._body.cancel(f"lease on {self.key!r} lost")

    async def _keep_alive(self, sent: float) -> None:
        lock = self._lock
        interval = lock.ttl / 3
        next_at = sent + interval
        while not (self._released or self.lost.is_set()):
            await asyncio.sleep(max(0.0, next_at - lock.clock()))
            sent = lock.clock()
            if sent >= self._deadline:
                self._lose("no renewal succeeded before the lease's deadline")
                return
            value = lock._value(self._id, self.token, self.renewals + 1)
            try:
                async with asyncio.timeout(self._deadline - sent):
                    revision = await lock.kv.update(self.key, value, self.revision)
            except WrongRevisionError as exc:
                try:
                    entry = await lock.kv.get(self.key)
                except KeyNotFoundError:
                    self._lose(f"the key was deleted (revision {exc.current})")
                    return
                except KVError:
                    next_at = min(lock.clock() + interval / 4, self._deadline)
                    continue
                if (_parse(entry.value) or {}).get("lease") != self._id:
                    self._lose(f"taken over (the key is at revision {entry.revision})")
                    return
                # Our own renewal whose answer was lost: adopt it, the deadline stays.
                self.revision = entry.revision
                next_at = lock.clock()
                continue
            except (KVError, TimeoutError) as exc:
                _log.warning("lock %r: renewal failed (%s); retrying", self.key, exc)
                next_at = min(lock.clock() + interval / 4, self._deadline)
                continue
            if self.lost.is_set():
                return
            self.revision = revision
            self.renewals += 1
            self._deadline = sent + lock.ttl * lock.safety
            self._arm()
            next_at = sent + interval
