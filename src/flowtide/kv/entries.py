"""What a reader of a bucket gets: an entry (one message of a key) with its operation,
and a bucket's status."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from flowtide.kv.options import Placement, Republish

__all__ = ["Entry", "Operation", "Status", "StorageType"]

StorageType = Literal["file", "memory"]


class Operation(enum.Enum):
    """What a message of the bucket does to its key."""

    PUT = "PUT"
    DEL = "DEL"
    PURGE = "PURGE"


@dataclass(frozen=True, slots=True)
class Entry:
    """One message of a bucket as seen by a reader."""

    bucket: str
    key: str
    value: bytes
    revision: int
    created: float
    delta: int
    operation: Operation


@dataclass(frozen=True, slots=True)
class Status:
    """The state and configuration of a bucket.

    `values` counts every stored message (history and delete/purge markers included);
    `bytes` is what the adapter stores for them (memory: key + value lengths).
    `max_bytes` is the bucket size limit (None: none); `placement`, `republish`,
    `mirror` (the origin bucket of a read-only mirror), `sources` (buckets this one
    aggregates) and `limit_marker_ttl` (per-value TTL on, markers kept that long) as
    configured (`flowtide.kv.options`).
    """

    bucket: str
    values: int
    history: int
    ttl: float | None
    max_value_size: int | None
    storage: StorageType
    replicas: int
    compression: bool
    bytes: int
    backing_store: str
    max_bytes: int | None = None
    placement: Placement | None = None
    republish: Republish | None = None
    mirror: str | None = None
    sources: tuple[str, ...] = ()
    limit_marker_ttl: float | None = None
