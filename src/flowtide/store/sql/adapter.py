"""What each SQL adapter provides to the port methods written once (`flowtide.store.sql`):
its transactions, reads and batch writes, and its driver's placeholder, which the shared
statements (written with `?`) are converted to once per statement.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

from flowtide.sealing import Sealer


class SQLAdapter:
    """The adapter's side of `SQLStore`: every group of tables builds on it."""

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
