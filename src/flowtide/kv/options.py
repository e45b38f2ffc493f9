"""The bucket settings beyond the ADR-8 basics, and how a setting of an existing bucket
changes: placement, republish, mirrors and sourced buckets (ADR-8 topologies), the
bucket size limit and per-value TTL (ADR-48 limit markers).

`BucketConfig` (in `kv.base`) holds these fields and calls `validate_extended` on
construction. `UNSET` marks a `connect` argument the caller did not pass: a new bucket
gets the default, and `connect(..., apply=True)` leaves that setting of an existing
bucket alone (only the settings passed explicitly are compared and changed).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

from flowtide.kv.errors import KVError
from flowtide.kv.keys import validate_bucket_name, validate_filter

if TYPE_CHECKING:
    from flowtide.kv.base import BucketConfig

__all__ = [
    "CHANGEABLE",
    "MIN_LIMIT_MARKER_TTL",
    "SETTINGS",
    "UNSET",
    "Placement",
    "Republish",
    "Unset",
    "check_changes",
    "check_value_ttl",
    "validate_extended",
]


_T = TypeVar("_T")


class Unset(enum.Enum):
    """The type of `UNSET`."""

    UNSET = "unset"


#: A `connect` argument not passed: default on creation, left as it is by `apply=True`.
UNSET: Final = Unset.UNSET

# JetStream refuses a per-message TTL under one second (error 10165) and ADR-48 asks
# for a marker TTL of at least one second.
MIN_LIMIT_MARKER_TTL: Final = 1.0
#: The largest duration JetStream stores (int64 nanoseconds), in whole seconds.
MAX_SECONDS: Final = (2**63 - 1) // 1_000_000_000
#: JetStream keeps a stream's max_bytes in an int64 and max_msg_size in an int32.
MAX_BYTES: Final = 2**63 - 1
MAX_VALUE_SIZE: Final = 2**31 - 1
#: Subjects a bucket may not republish to: NATS's own (`$KV.` another bucket's keys,
#: where two buckets republishing into each other write in a loop; `$JS.` the JetStream
#: API; any `$...`), reply inboxes (`_INBOX.`, flowtide's `_WORKER_INBOX.<pool>.`: a
#: worker would receive the bucket's values; any `_...`), and flowtide's command and log
#: streams (flowtide.wire COMMAND_PREFIX, LOG_PREFIX), which would take the values as
#: commands or as a step's output.
RESERVED_SUBJECTS: Final = ("$KV.>", "$JS.>", "_INBOX.>", "flowtide.commands.>", "flowtide.logs.>")


def subjects_overlap(a: str, b: str) -> bool:
    """Whether some subject matches both NATS subject patterns (`*`, `>` wildcards)."""
    ta, tb = a.split("."), b.split(".")
    for i, x in enumerate(ta):
        if i >= len(tb):
            return False
        y = tb[i]
        if ">" in (x, y):
            return True
        if x != y and "*" not in (x, y):
            return False
    return len(ta) == len(tb)


def _reserved_subject(subject: str) -> bool:
    first = subject.split(".")[0]
    return first[:1] in ("$", "_") or any(subjects_overlap(subject, r) for r in RESERVED_SUBJECTS)


#: The settings `connect(..., apply=True)` compares, in the order they are reported.
SETTINGS: Final = (
    "history",
    "ttl",
    "max_value_size",
    "max_bytes",
    "storage",
    "replicas",
    "compression",
    "placement",
    "republish",
    "mirror",
    "sources",
    "limit_marker_ttl",
)

#: The settings JetStream changes in place (STREAM.UPDATE); the others are refused.
CHANGEABLE: Final = frozenset(SETTINGS) - {"storage", "mirror"}


@dataclass(frozen=True, slots=True)
class Placement:
    """Where JetStream places the bucket's stream: a cluster by name and/or the servers
    carrying all these tags (`server_tags` in nats-server's config)."""

    cluster: str | None = None
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.cluster is None and not self.tags:
            raise KVError("placement needs a cluster name or at least one tag")
        for text in (self.cluster or "x", *self.tags):
            if not text or any(c.isspace() for c in text):
                raise KVError(f"placement cluster and tags are non-empty words, got {text!r}")


@dataclass(frozen=True, slots=True)
class Republish:
    """Republish every write to the keys matching `source` (a key filter within the
    bucket, `>` for all) on the subject `destination`, with the message's headers
    (`Nats-Stream`, `Nats-Subject`, `Nats-Sequence`, ...) and, unless `headers_only`,
    its value. The destination may reuse the source's wildcards (`out.>` for `>`);
    JetStream checks the mapping when the bucket is created."""

    destination: str
    source: str = ">"
    headers_only: bool = False

    def __post_init__(self) -> None:
        validate_filter(self.source)
        dest = self.destination
        if not isinstance(dest, str) or not dest or "" in dest.split("."):
            raise KVError(f"republish destination must be a NATS subject, got {dest!r}")
        if any(c.isspace() or not c.isprintable() for c in dest):
            raise KVError(f"republish destination must be a NATS subject, got {dest!r}")
        if _reserved_subject(dest):
            raise KVError(
                f"republish destination {dest!r} is not allowed: it may not reach NATS's "
                "own subjects ($KV, $JS, $SYS, ...), reply inboxes (_INBOX, ...) or "
                "flowtide's commands and logs (flowtide.commands, flowtide.logs); choose "
                "a subject of your own, e.g. 'out.orders.>'. To copy keys into another "
                "bucket, give that bucket sources instead"
            )


def as_found(cls: type[_T], **fields: Any) -> _T:
    """A Placement or Republish as an existing stream has it, not validated: a bucket
    some other tool configured (a tag with a space, a republish to `$KV.`) still opens,
    and `status()` shows what it has."""
    obj = object.__new__(cls)
    for name, value in fields.items():
        object.__setattr__(obj, name, value)
    return obj


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def validate_extended(config: BucketConfig) -> None:
    """Check the extended settings of `config` (see the module docstring).

    Raises:
        KVError: a value is out of range or the settings contradict each other.
        InvalidKeyError: a mirror's origin or a source is not a valid bucket name.
    """
    b = config.bucket
    if config.max_bytes is not None and not (
        isinstance(config.max_bytes, int) and 0 < config.max_bytes <= MAX_BYTES
    ):
        raise KVError(
            f"max_bytes must be 1..{MAX_BYTES} or None, got {config.max_bytes!r}", bucket=b
        )
    if config.max_value_size is not None and not (
        isinstance(config.max_value_size, int) and config.max_value_size <= MAX_VALUE_SIZE
    ):
        raise KVError(
            f"max_value_size must be 1..{MAX_VALUE_SIZE} or None, got {config.max_value_size!r}",
            bucket=b,
        )
    for name in ("ttl", "limit_marker_ttl"):
        seconds = getattr(config, name)
        if seconds is not None and _positive(seconds) and not seconds <= MAX_SECONDS:
            raise KVError(
                f"{name} must be at most {MAX_SECONDS} s (JetStream keeps durations in "
                f"nanoseconds, in 64 bits), got {seconds!r}",
                bucket=b,
            )
    if config.placement is not None and not isinstance(config.placement, Placement):
        raise KVError("placement must be a flowtide.kv.Placement", bucket=b)
    if config.republish is not None and not isinstance(config.republish, Republish):
        raise KVError("republish must be a flowtide.kv.Republish", bucket=b)
    marker = config.limit_marker_ttl
    if marker is not None and not (_positive(marker) and marker >= MIN_LIMIT_MARKER_TTL):
        raise KVError(
            f"limit_marker_ttl must be at least {MIN_LIMIT_MARKER_TTL:g} s or None, got {marker!r}",
            bucket=b,
        )
    if isinstance(config.sources, str):
        raise KVError("sources is a sequence of bucket names, not one string", bucket=b)
    for name in (*config.sources, *([config.mirror] if config.mirror else [])):
        validate_bucket_name(name)
        if name == b:
            raise KVError(f"bucket {b!r} cannot mirror or source itself", bucket=b)
    if len(set(config.sources)) != len(config.sources):
        raise KVError(f"sources name a bucket twice: {list(config.sources)}", bucket=b)
    if config.mirror is not None:
        if config.sources:
            raise KVError(
                f"bucket {b!r}: a mirror copies exactly one bucket; sources are for a "
                "bucket that aggregates several",
                bucket=b,
            )
        if config.republish is not None or marker is not None:
            raise KVError(
                f"bucket {b!r}: a mirror takes no republish or limit_marker_ttl "
                "(set them on the origin bucket)",
                bucket=b,
            )


def check_changes(bucket: str, changes: dict[str, tuple[Any, Any]]) -> None:
    """Refuse the setting changes JetStream cannot apply in place, saying why and what
    to do instead. `changes` maps a setting to (current, wanted).

    Raises:
        KVError: storage or the mirror setting changes, or limit_marker_ttl is turned off.
    """
    if "storage" in changes:
        old, new = changes["storage"]
        raise KVError(
            f"bucket {bucket!r} is stored in {old}; JetStream cannot move a stream to "
            f"{new} storage in place: create a new bucket with storage={new!r} and copy "
            "the keys over",
            bucket=bucket,
        )
    if "mirror" in changes:
        old, new = changes["mirror"]
        what = (
            f"turn it into a mirror of {new!r}"
            if old is None
            else f"make it stop mirroring {old!r}"
            if new is None
            else f"switch it from mirroring {old!r} to {new!r}"
        )
        raise KVError(
            f"bucket {bucket!r}: JetStream cannot {what} in place (a mirror has no subjects "
            "of its own); create a new bucket with the mirror setting you want, and "
            "destroy this one once nothing uses it",
            bucket=bucket,
        )
    if "limit_marker_ttl" in changes and changes["limit_marker_ttl"][1] is None:
        raise KVError(
            f"bucket {bucket!r} has per-value TTL (limit markers) turned on, and it cannot "
            "be turned off (ADR-48: values written with a TTL must still expire); "
            "change limit_marker_ttl to another duration instead",
            bucket=bucket,
        )


def check_value_ttl(bucket: str, key: str, ttl: float | None, marker_ttl: float | None) -> None:
    """Check a per-value TTL (`create(..., ttl=)`, `purge(..., ttl=)`) before writing.

    Raises:
        KVError: the bucket was created without limit markers, or `ttl` is under 1 s.
    """
    if ttl is None:
        return
    if marker_ttl is None:
        raise KVError(
            f"bucket {bucket!r} does not allow per-value TTL: turn on limit markers "
            f"(connect(..., limit_marker_ttl=1, apply=True), or `flowtide kv edit {bucket} "
            "--limit-marker-ttl 1`; needs nats-server 2.11 or newer)",
            bucket=bucket,
            key=key,
        )
    if not _positive(ttl) or ttl < MIN_LIMIT_MARKER_TTL:
        raise KVError(
            f"a value's TTL must be at least {MIN_LIMIT_MARKER_TTL:g} s, got {ttl!r}",
            bucket=bucket,
            key=key,
        )
