"""The `flowtide` command line. Thin: every command calls the runtimes or the store.

One module per command group, registered on the root app in `root` (named so that
`flowtide.cli.app` stays the Typer app itself):

- `run`: run, resume, validate, execute, cancel (embedded through
  `flowtide.embedded.run_to_end`, or on a server);
- `executions`: status, events, list;
- `data`: a spark step's rows (read by `flowtide.spark.outputs`);
- `catalog`, `credential`, `db`, `kv`, `token`, `dev`: the groups of those names;
- `server`: the server and worker processes;
- `options` (exit codes, option types, printing) and `backends` (opening the store, a
  server client, the KV) are what the groups share.

Heavy modules (pyspark, fastapi, nats, duckdb, psycopg, rich) are imported inside the
commands that use them, so that `flowtide --help` and start-up stay fast.
"""

from flowtide.cli.root import app, main

__all__ = ["app", "main"]
