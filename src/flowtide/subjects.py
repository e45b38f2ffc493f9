"""What each NATS user may do with the names flowtide's processes share (`flowtide.wire`).

    FLOWTIDE_COMMANDS                 the command stream (work queue), subjects
      flowtide.commands.<pool>.<shard>.<eid>  one notification per issued command
      flowtide-<pool>                   a pool's durable pull consumer, shared by its workers
    KV_<bucket>, $KV.<bucket>.>       the loop-state bucket (flowtide.kv.nats)
    _WORKER_INBOX.<pool>.>            replies to a worker of <pool> (pulls, consumer info)
    FLOWTIDE_LOGS, flowtide.logs.<pool>.<eid>.<command>  what running steps print

Two kinds of NATS user (the dev stack creates one of each kind per pool of workers):

- `server`: publishes notifications, manages the stream and the pools' consumers, reads
  and writes the KV bucket; its replies come to `_INBOX.>`.
- `worker` of one pool: pulls from its pool's consumer, acks what it pulled and reads
  that consumer's info, publishes what its steps print under its pool's log prefix;
  nothing else. It cannot publish a command, read or write the
  KV, or touch another pool's consumer.

A worker's inbox is not under `_INBOX`: any client allowed `_INBOX.>` (the usual grant
for request/reply) could otherwise subscribe to the server's replies, KV reads included,
and a worker must not hold that grant.
"""

from __future__ import annotations

from dataclasses import dataclass

# The names are the wire contract's; they are importable from here too.
from flowtide.wire import (
    COMMAND_PREFIX,
    COMMAND_STREAM,
    LOG_PREFIX,
    command_filter,
    pool_consumer,
    worker_inbox,
)

__all__ = [
    "COMMAND_PREFIX",
    "COMMAND_STREAM",
    "Permissions",
    "command_filter",
    "pool_consumer",
    "server_permissions",
    "worker_inbox",
    "worker_permissions",
]


@dataclass(frozen=True)
class Permissions:
    """Subjects a NATS user may publish to and subscribe to (everything else is denied)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]

    def to_config(self) -> dict[str, dict[str, list[str]]]:
        """The `permissions` block of a nats-server user entry."""
        return {
            "publish": {"allow": list(self.publish)},
            "subscribe": {"allow": list(self.subscribe)},
        }


def server_permissions(kv_bucket: str) -> Permissions:
    """What `flowtide server` needs: notifications, stream and consumer management (the
    JetStream API), the KV bucket `kv_bucket`, and flow-control answers for KV watchers."""
    return Permissions(
        publish=(f"{COMMAND_PREFIX}.>", f"$KV.{kv_bucket}.>", "$JS.API.>", "$JS.FC.>"),
        subscribe=("_INBOX.>",),
    )


def worker_permissions(pool: str) -> Permissions:
    """What a worker of `pool` needs: pull from and ack on its pool's consumer, read that
    consumer's info, receive on its own inbox."""
    consumer = pool_consumer(pool)
    return Permissions(
        publish=(
            f"$JS.API.CONSUMER.MSG.NEXT.{COMMAND_STREAM}.{consumer}",
            f"$JS.API.CONSUMER.INFO.{COMMAND_STREAM}.{consumer}",
            f"$JS.ACK.{COMMAND_STREAM}.{consumer}.>",
            f"{LOG_PREFIX}.{pool}.>",
        ),
        subscribe=(f"{worker_inbox(pool)}.>",),
    )
