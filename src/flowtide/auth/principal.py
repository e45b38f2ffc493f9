"""The identity a request was authenticated as, and what its role implies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["ANONYMOUS", "Principal", "outranks"]

#: People's roles in increasing power; `worker` is apart (it runs commands, and sees
#: nothing but what the commands it holds need).
_RANK: Final = {"reader": 1, "operator": 2, "admin": 3}


def outranks(role: str, needed: str) -> bool:
    """Whether `role` may do what `needed` may (admin > operator > reader; worker only
    what worker may)."""
    if role == "worker" or needed == "worker":
        return role == needed
    return _RANK.get(role, 0) >= _RANK[needed]


@dataclass(frozen=True)
class Principal:
    """An authenticated caller.

    `subject` is stable across requests: a token's id, or a JWT's `iss`/`sub`. `pool`
    binds a worker to one pool (None: any pool). `insecure` marks the caller of a server
    started with --insecure-no-auth, which may do everything.
    """

    subject: str
    name: str
    role: str
    pool: str | None = None
    insecure: bool = False

    def can(self, needed: str) -> bool:
        return self.insecure or outranks(self.role, needed)

    def describe(self) -> str:
        return f"{self.role} {self.name!r}"


ANONYMOUS: Final = Principal("insecure", "anonymous", "admin", insecure=True)
