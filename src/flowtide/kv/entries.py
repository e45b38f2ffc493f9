"""What a reader of a bucket gets: an entry (one message of a key) with its operation,
and a bucket's status."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

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
