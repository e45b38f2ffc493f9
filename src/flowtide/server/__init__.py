"""The distributed runtime's server side: coordinator (engine in PostgreSQL transactions),
outbox relay to NATS JetStream, and the HTTP API (FastAPI).

- the app: `app` composes the routers (`api_*`, one module per group of routes) with
  `access` (who may call what), `errors` and `openapi`; a process's `Runtime` (`runtime`)
  is what the routes depend on; `settings`, `schemas`, `documents`, `fields` and
  `problems` are the edges of the HTTP API;
- the engine in the database: `coordinator` is the front of `statecache`, `steps`,
  `stale`, `claims` and `leases`; `outbox` relays command notifications, `workers` is
  the worker registry, `metrics` the Prometheus metrics;
- no SQL here: every statement is a function of `flowtide.store.pg`.
"""
