"""The streams the server keeps on NATS JetStream, laid out as the settings say
(replicas, placement, storage, size), and the JetStream calls that must outlast a
leader election.

`StreamLayout` is the settings (`flowtide server --nats-replicas ...`, FLOWTIDE_NATS_*).
`ensure_stream` creates a stream with it or brings an existing one to it: what
JetStream can change in place is updated (replicas, placement, size limits, ages) and
logged; what it cannot (storage, retention) stops the server with the reason and the
way out, rather than leaving the setting silently unapplied.

In a cluster, a stream whose leader dies has none for a few seconds (its other replicas
elect one); JetStream API calls meanwhile time out or answer 503 / "temporarily
unavailable". `with_retries` repeats such a call until it answers or its time budget
runs out (a real refusal, such as a bad configuration, is raised at once).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final, TypeVar

from flowtide.errors import NatsError

if TYPE_CHECKING:
    from nats.js import JetStreamContext
    from nats.js.api import StreamConfig, StreamInfo

__all__ = ["StreamLayout", "ensure_stream", "stream_update", "transient", "with_retries"]

log = logging.getLogger("flowtide.server.jetstream")

T = TypeVar("T")

#: Seconds a JetStream call is repeated through a leader election (measured elections of
#: a 3-node cluster on loopback take 2-5 s; docs/distributed.md "NATS cluster").
ELECTION_BUDGET: Final = 30.0
#: JetStream's "temporarily unavailable" (no meta leader, or the stream has none yet)
#: and "insufficient resources" while a node is away.
_TRANSIENT_CODES: Final = frozenset({10008, 10023})
#: "replicas > 1 not supported in non-clustered mode".
_NOT_CLUSTERED: Final = 10074


@dataclass(frozen=True)
class StreamLayout:
    """How the server's streams and bucket live in JetStream (the FLOWTIDE_NATS_*
    settings): replicas, placement (a cluster's name, nodes' tags), storage, sizes."""

    replicas: int = 1
    placement_cluster: str | None = None
    placement_tags: tuple[str, ...] = ()
    storage: str = "file"
    commands_max_bytes: int = -1
    logs_max_bytes: int = 256 * 1024 * 1024

    @classmethod
    def from_tree(cls, tree: Any) -> StreamLayout:
        """The layout a ServerSection (flowtide.settings) describes.

        Raises:
            SettingsError: a placement tag or the cluster's name is not one word.
        """
        from flowtide.errors import SettingsError

        tags = tuple(t.strip() for t in (tree.nats_placement_tags or "").split(",") if t.strip())
        cluster = (tree.nats_placement_cluster or "").strip() or None
        for env, words in (
            ("FLOWTIDE_NATS_PLACEMENT_TAGS", tags),
            ("FLOWTIDE_NATS_PLACEMENT_CLUSTER", (cluster,) if cluster else ()),
        ):
            for word in words:
                if any(c.isspace() or not c.isprintable() for c in word):
                    raise SettingsError(
                        f"{env}: {word!r} is not one word (a NATS server tag or cluster"
                        " name has no spaces or control characters; tags are"
                        " comma-separated: ssd,az1)",
                        env=env,
                        value=word,
                    )
        return cls(
            replicas=tree.nats_replicas,
            placement_cluster=cluster,
            placement_tags=tags,
            storage=tree.nats_storage,
            commands_max_bytes=tree.nats_commands_max_bytes,
            logs_max_bytes=tree.nats_logs_max_bytes,
        )

    def placement(self) -> Any:
        """nats-py's Placement, or None (JetStream chooses)."""
        if self.placement_cluster is None and not self.placement_tags:
            return None
        from nats.js.api import Placement

        return Placement(cluster=self.placement_cluster, tags=list(self.placement_tags) or None)

    def kv_placement(self) -> Any:
        """The KV port's Placement for the loop-state bucket, or None."""
        if self.placement_cluster is None and not self.placement_tags:
            return None
        from flowtide.kv import Placement

        return Placement(cluster=self.placement_cluster, tags=self.placement_tags)

    def shape(self, config: StreamConfig, max_bytes: int) -> StreamConfig:
        """`config` with this layout's replicas, placement, storage and `max_bytes`."""
        from nats.js.api import StorageType

        return replace(
            config,
            num_replicas=self.replicas,
            placement=self.placement(),
            storage=StorageType(self.storage),
            max_bytes=max_bytes,
        )


def transient(exc: BaseException) -> bool:
    """True for what a JetStream call gets while the cluster elects a leader (or a node
    is away): no reply in time, no responders, 503, "temporarily unavailable", a
    connection being re-established."""
    import nats.errors
    import nats.js.errors

    if isinstance(exc, nats.js.errors.ServiceUnavailableError):
        return True
    if isinstance(exc, nats.js.errors.APIError):
        return exc.err_code in _TRANSIENT_CODES
    return isinstance(
        exc,
        nats.errors.TimeoutError
        | nats.errors.NoRespondersError
        | nats.errors.ConnectionReconnectingError
        | nats.errors.StaleConnectionError
        | TimeoutError,
    )


async def with_retries(
    call: Callable[[], Awaitable[T]], what: str, budget: float = ELECTION_BUDGET
) -> T:
    """`await call()`, repeated while it fails transiently (`transient`), for at most
    `budget` seconds; the last failure is raised after that. Other failures at once."""
    deadline = time.monotonic() + budget
    pause = 0.1
    reported = False
    while True:
        try:
            return await call()
        except Exception as exc:
            if not transient(exc) or time.monotonic() + pause > deadline:
                raise
            if not reported:
                log.warning("JetStream: %s: %s; trying again", what, str(exc) or type(exc).__name__)
                reported = True
        await asyncio.sleep(pause)
        pause = min(pause * 2, 1.0)


#: Fields a stream keeps for life (JetStream refuses to change them).
_FIXED: Final = ("storage", "retention")
#: Fields `ensure_stream` brings to what flowtide asks.
_MANAGED: Final = (
    "num_replicas",
    "placement",
    "max_bytes",
    "max_age",
    "max_msgs_per_subject",
    "max_msg_size",
    "discard",
    "duplicate_window",
)


def _value(config: StreamConfig, name: str) -> Any:
    value = getattr(config, name)
    if name == "placement" and value is not None:
        return (value.cluster or None, tuple(sorted(value.tags or ())))
    if name in ("max_age", "duplicate_window") and value is not None:
        return round(float(value), 3)
    return getattr(value, "value", value)


def stream_update(
    current: StreamConfig, wanted: StreamConfig
) -> tuple[StreamConfig | None, list[str]]:
    """What `ensure_stream` changes on an existing stream: (the configuration to update
    it to, or None when it is as wanted; each change in words).

    Raises:
        NatsError: `wanted` differs in a field JetStream cannot change (the message says
            which, and what to do).
    """
    name = current.name
    for field in _FIXED:
        have, want = _value(current, field), _value(wanted, field)
        if want is not None and have != want:
            raise NatsError(
                f"NATS stream {name} keeps {field} {have}, and flowtide asks for {want}:"
                f" JetStream cannot change a stream's {field}. Keep {have}"
                f" (FLOWTIDE_NATS_STORAGE={have}), or remove the stream while no run is in"
                f" flight (`nats stream rm {name}`) and start the server again to create it"
            )
    changes: list[str] = []
    updates: dict[str, Any] = {}
    for field in _MANAGED:
        want = getattr(wanted, field)
        if want is None and field != "placement":
            continue
        if _value(current, field) != _value(wanted, field):
            changes.append(f"{field} {_value(current, field)} -> {_value(wanted, field)}")
            updates[field] = want
    if not changes:
        return None, []
    return replace(current, **updates), changes


async def ensure_stream(js: JetStreamContext, wanted: StreamConfig) -> StreamInfo:
    """Create stream `wanted.name` as configured, or bring the existing one to it
    (`stream_update`); through leader elections (`with_retries`).

    Raises:
        NatsError: JetStream refused (the reason in words: e.g. replicas over the
            cluster's size), or the stream's storage differs from the setting.
    """
    from nats.js.errors import APIError, BadRequestError, NotFoundError

    name = wanted.name or "?"
    try:
        try:
            info = await with_retries(lambda: js.stream_info(name), f"stream {name} info")
        except NotFoundError:
            try:
                return await with_retries(lambda: js.add_stream(wanted), f"create stream {name}")
            except BadRequestError as exc:
                if exc.err_code != 10058:  # "stream name already in use": another server won
                    raise
                info = await with_retries(lambda: js.stream_info(name), f"stream {name} info")
        updated, changes = stream_update(info.config, wanted)
        if updated is None:
            return info
        log.warning("NATS stream %s: applying %s", name, "; ".join(changes))
        return await with_retries(lambda: js.update_stream(updated), f"update stream {name}")
    except APIError as exc:
        raise NatsError(_refusal(name, wanted, exc)) from None


def _refusal(name: str, wanted: StreamConfig, exc: Any) -> str:
    reason = exc.description or str(exc)
    if exc.err_code == _NOT_CLUSTERED:
        return (
            f"NATS stream {name}: {wanted.num_replicas} replicas need a NATS cluster of at"
            f" least {wanted.num_replicas} nodes, and this NATS server is not clustered"
            f" ({reason}); set FLOWTIDE_NATS_REPLICAS=1 (--nats-replicas 1) or run a cluster"
            " (`flowtide dev up --nats-cluster 3`)"
        )
    return f"NATS refused stream {name}: {reason} (JetStream error {exc.err_code})"
