"""A browser's sign-in to the web UI: a session of its own, never the token it began with.

`POST /api/session` (flowtide.web.session) verifies a token, then opens a session: a
random id (`secrets.token_urlsafe(32)`, 256 bits) that goes in the browser's cookie and
nowhere else; the store keeps only its SHA-256, with the principal it stands for and the
token it was opened with. A session ends when the browser signs out (its row is
deleted), after `lifetime` seconds however active, after `idle` seconds without a
request, and when the token it was opened with is revoked or expires. A stolen cookie is
therefore worth a sign-in that its owner can end, not the long-lived token.

Two stores:

* `PgSessions`: the server's, the `ui_session` table of the cluster database (cluster
  schema 9), so every server of the cluster takes every session and signing out on one
  ends it on all. A session of an API token is taken only while that token is active
  (the lookup joins `api_token`), and revoking the token deletes its sessions.
* `MemorySessions`: `flowtide ui`'s, in the process's memory: its only token is a
  secret made at start, so its sessions could not outlive the process anyway.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final, Protocol

from flowtide.auth.principal import Principal
from flowtide.errors import AuthError

if TYPE_CHECKING:
    from flowtide.store.postgres import PostgresStore

__all__ = [
    "MemorySessions",
    "PgSessions",
    "Session",
    "SessionPolicy",
    "SessionStore",
    "Sessions",
    "new_session_id",
    "session_digest",
]

#: The longest session id a cookie may carry (token_urlsafe(32) is 43 characters).
MAX_ID_CHARS: Final = 128


def new_session_id() -> str:
    return secrets.token_urlsafe(32)


def session_digest(session_id: str) -> bytes:
    """What a store keeps of a session id (a plain hash: the id has 256 random bits)."""
    return hashlib.sha256(session_id.encode("utf-8", "replace")).digest()


@dataclass(frozen=True)
class SessionPolicy:
    """How long a session lasts: `lifetime` seconds at most, `idle` without a request."""

    lifetime: float = 12 * 3600.0
    idle: float = 3600.0

    @classmethod
    def configured(cls) -> SessionPolicy:
        """The process's settings (FLOWTIDE_SESSION_LIFETIME, FLOWTIDE_SESSION_IDLE)."""
        from flowtide.settings import SessionSection, current

        s = current(SessionSection)
        return cls(lifetime=s.lifetime, idle=s.idle)

    @property
    def touch_every(self) -> float:
        """How stale a session's last-seen time may get before a request records it."""
        return min(60.0, self.idle / 10)


@dataclass(frozen=True)
class Session:
    """A live session: who it stands for, the token it was opened with (None for a JWT
    or `flowtide ui`'s secret), and its instants (epoch seconds)."""

    principal: Principal
    token_id: str | None
    created: float
    expires: float
    seen: float

    def ends(self, policy: SessionPolicy) -> float:
        """The instant it ends unless a request comes first."""
        return min(self.expires, self.seen + policy.idle)


class SessionStore(Protocol):
    def open(self, digest: bytes, session: Session) -> None:
        """Keep a new session under the digest of its id."""

    def find(self, digest: bytes, now: float, policy: SessionPolicy) -> Session | None:
        """The live session of `digest` (its last-seen time recorded when older than
        `policy.touch_every`), or None: unknown, ended, or its token no longer active."""

    def close(self, digest: bytes) -> None:
        """End a session (nothing when it does not exist)."""


class MemorySessions:
    """Sessions in this process's memory (`flowtide ui`): at most `max_sessions`, the
    oldest dropped first."""

    def __init__(self, max_sessions: int = 1000) -> None:
        self.max_sessions = max_sessions
        self._rows: OrderedDict[bytes, Session] = OrderedDict()
        self._lock = threading.Lock()

    def open(self, digest: bytes, session: Session) -> None:
        with self._lock:
            self._rows[digest] = session
            while len(self._rows) > self.max_sessions:
                self._rows.popitem(last=False)

    def find(self, digest: bytes, now: float, policy: SessionPolicy) -> Session | None:
        with self._lock:
            found = self._rows.get(digest)
            if found is None:
                return None
            if found.ends(policy) <= now:
                del self._rows[digest]
                return None
            if found.seen < now - policy.touch_every:
                found = self._rows[digest] = replace(found, seen=now)
            return found

    def close(self, digest: bytes) -> None:
        with self._lock:
            self._rows.pop(digest, None)


_COLUMNS: Final = "s.subject, s.name, s.role, s.pool, s.token_id, s.created, s.expires, s.seen"


def _session(row: Sequence[Any]) -> Session:
    subject, name, role, pool, token_id, created, expires, seen = row
    return Session(Principal(subject, name, role, pool), token_id, created, expires, seen)


class PgSessions:
    """The `ui_session` rows of a cluster database."""

    def __init__(self, store: PostgresStore) -> None:
        self.store = store

    def open(self, digest: bytes, session: Session) -> None:
        p = session.principal
        with self.store.transaction("session open", "cluster") as conn:
            # Ended sessions go as new ones come (a sign-out deletes its own row).
            conn.execute("DELETE FROM ui_session WHERE expires <= %s", (session.created,))
            conn.execute(
                "INSERT INTO ui_session (digest, subject, name, role, pool, token_id, created,"
                " expires, seen) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    digest,
                    p.subject,
                    p.name,
                    p.role,
                    p.pool,
                    session.token_id,
                    session.created,
                    session.expires,
                    session.seen,
                ),
            )

    def find(self, digest: bytes, now: float, policy: SessionPolicy) -> Session | None:
        with self.store.transaction("session find", "cluster") as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM ui_session s WHERE s.digest = %s"
                " AND s.expires > %s AND s.seen > %s"
                " AND (s.token_id IS NULL OR EXISTS (SELECT 1 FROM api_token t"
                "  WHERE t.token_id = s.token_id AND t.revoked IS NULL"
                "  AND (t.expires IS NULL OR t.expires > %s)))",
                (digest, now, now - policy.idle, now),
            ).fetchone()
            if row is None:
                return None
            found = _session(row)
            if found.seen < now - policy.touch_every:
                conn.execute("UPDATE ui_session SET seen = %s WHERE digest = %s", (now, digest))
                found = replace(found, seen=now)
        return found

    def close(self, digest: bytes) -> None:
        with self.store.transaction("session close", "cluster") as conn:
            conn.execute("DELETE FROM ui_session WHERE digest = %s", (digest,))


class Sessions:
    """Opens, finds and ends sessions in a `store`, for the app's authenticator
    (`flowtide.web.access`); blocking store calls run in a thread.

    Found sessions are cached for `ttl` seconds per process (one page load's burst of
    requests is one lookup), unknown ones for a second; ending one here forgets it at
    once, another server of the cluster within `ttl`. `clock` is the wall clock sessions
    are timed by (epoch seconds); `policy` the process's settings unless given.
    """

    def __init__(
        self,
        store: SessionStore | None = None,
        *,
        policy: SessionPolicy | None = None,
        ttl: float = 2.0,
        clock: Callable[[], float] = time.time,
        max_entries: int = 10_000,
    ) -> None:
        self.store: SessionStore = store if store is not None else MemorySessions()
        self._policy = policy
        self.ttl = ttl
        self.clock = clock
        self.max_entries = max_entries
        self._cache: OrderedDict[bytes, tuple[float, Session | None]] = OrderedDict()

    @property
    def policy(self) -> SessionPolicy:
        if self._policy is None:
            self._policy = SessionPolicy.configured()
        return self._policy

    async def open(
        self, principal: Principal, token_id: str | None, until: float | None = None
    ) -> tuple[str, float]:
        """A new session for `principal`: its id (for the cookie; never stored) and its
        lifetime in seconds (`policy.lifetime`, or less when `until` comes first)."""
        now = self.clock()
        expires = now + self.policy.lifetime
        if until is not None:
            expires = min(expires, until)
        session_id = new_session_id()
        session = Session(principal, token_id, now, expires, now)
        await asyncio.to_thread(self.store.open, session_digest(session_id), session)
        return session_id, expires - now

    async def resume(self, session_id: str) -> Principal:
        """The principal of a live session.

        Raises:
            AuthError: 401, unknown, signed out, ended, or its token no longer active.
        """
        refused = AuthError("not signed in, or the session ended: sign in again", status=401)
        if len(session_id) > MAX_ID_CHARS:
            raise refused
        key = session_digest(session_id)
        now, policy = self.clock(), self.policy
        hit = self._cache.get(key)
        if hit is not None and hit[0] > time.monotonic():
            found = hit[1]
        else:
            found = await asyncio.to_thread(self.store.find, key, now, policy)
            ttl = self.ttl if found is not None else 1.0
            self._cache[key] = (time.monotonic() + ttl, found)
            self._cache.move_to_end(key)
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
        if found is None or found.ends(policy) <= now:
            raise refused
        return found.principal

    async def close(self, session_id: str) -> None:
        """End a session (sign-out); nothing for one that does not exist."""
        if len(session_id) > MAX_ID_CHARS:
            return
        key = session_digest(session_id)
        self._cache.pop(key, None)
        await asyncio.to_thread(self.store.close, key)

    def forget_token(self, token_id: str) -> None:
        """Drop the cached sessions of a token just revoked here (its rows are gone)."""
        for key, (_, found) in list(self._cache.items()):
            if found is not None and found.token_id == token_id:
                self._cache.pop(key, None)
