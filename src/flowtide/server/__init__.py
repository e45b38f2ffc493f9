"""The distributed runtime's server side: coordinator (engine in PostgreSQL transactions),
outbox relay to NATS JetStream, and the HTTP API (FastAPI).

- the app: `app` composes the routers both apps serve (`flowtide.web`: executions,
  catalog, session) over this server's read port (`reads`), the server's own routers
  (`api_*`, one module per group of routes: `api_executions` what workers and admins ask
  of an execution, `api_vars` its variables, `api_credentials` credentials and the
  keychain, `api_commands` worker reports and claims, `api_workers` the worker pool,
  `api_tokens`, `api_outbox`, `api_health`, `api_shards`) and the UI's page; a process's
  `Runtime` (`runtime`) is what the routes depend on; `settings` and `schemas` (the
  bodies of its own routes);
- the engine in the database: `coordinator` is the front of `statecache`, `steps`,
  `stale`, `claims` and `leases`; `outbox` relays command notifications,
  `worker_registry` knows the workers, `servers` the server processes, `forwarding`
  sends another shard's requests on, `metrics` the Prometheus metrics;
- no SQL here: every statement is a function of `flowtide.store.pg`.
"""
