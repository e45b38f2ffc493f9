"""A worker process of the distributed runtime (`flowtide worker`).

It pulls command notifications of its pool from NATS JetStream (one durable consumer per
pool, shared by every worker of the pool; pull requests kept open for its free slots:
`_pull`) and claims what arrived together in one request (`_claims`: per command exactly
one claimer wins; a loser acks and moves on). It runs each command won with the same
`StepRunner` as the embedded runtime in a thread (`_commands`), and sends the events back
in batches (`_reports`: retried; the server drops event ids it already has). Its own
calls to the server go through aiohttp (`_api`); the steps' threads use a blocking httpx
client (credentials, cancellation checks, sub-playbooks). It registers its pool and
heartbeats; the heartbeat extends the leases of the commands it holds, so a worker that
dies loses them to the server's reaper after one lease (`_worker`).

What travels between the worker and the server is `flowtide.wire`'s; nothing here
imports `flowtide.server`.
"""

from __future__ import annotations

from flowtide.worker._worker import Worker

__all__ = ["Worker"]
