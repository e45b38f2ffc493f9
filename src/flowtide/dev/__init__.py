"""`flowtide dev up|down|status`: a complete distributed stack on this machine, on
loopback; the tests start their PostgreSQL and nats-server through it too.

`stack` is the front: `DevStack`, which starts the stack's processes (`up`), stops them
(`down`) and reports on them (`status`). Beside it, each part of the job:

- `config`: what `up` chose, kept in stack.json (`StackConfig`), and the ports of a
  sharded stack's servers.
- `layout`: where each part is and how it is reached (`StackLayout`: the PostgreSQL
  servers and their databases, the flowtide servers, URLs, the CA, requests as the
  stack's admin); `DevStack` is one.
- `tokens`: the stack's admin and worker API tokens (tokens.json).
- `status`: what `status` shows (`Component`), per part and per shard.
- `processes`: each program in its own session, its pid and log, stopping it.
- `postgres` (a PostgreSQL cluster through initdb and pg_ctl; `pgroles`, its roles and
  who may log in as which), `nats` (nats-server, its
  users and their permissions), `tls` (the stack's local CA).
"""
