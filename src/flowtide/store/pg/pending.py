"""`Pending`: the rows of a statement sent in a pipeline, read once the others are sent."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    import psycopg

__all__ = ["Pending", "ping"]

T = TypeVar("T")


class Pending(Generic[T]):
    """A statement already sent (or queued in the connection's pipeline); `result()`
    reads its rows, as named values, when the caller needs them."""

    __slots__ = ("_cursor", "_read")

    def __init__(
        self, cursor: psycopg.Cursor[Any], read: Callable[[psycopg.Cursor[Any]], T]
    ) -> None:
        self._cursor = cursor
        self._read = read

    def result(self) -> T:
        """The statement's rows (inside a pipeline, this syncs it: every statement queued
        so far goes in the same round trip)."""
        return self._read(self._cursor)


def ping(conn: psycopg.Connection) -> None:
    """The cheapest statement: the database answers (readiness)."""
    conn.execute("SELECT 1")
