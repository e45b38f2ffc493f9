"""The HTTP edge that both apps mount (`flowtide server` and `flowtide ui`), so a route
or a page is written once for both.

- `access`: who may call what (the Gate middleware, the authenticator, the route rules).
- `errors`, `problems`: how exceptions become error documents (`RequestError` is how a
  route refuses a request), and their description in OpenAPI.
- `fields`: the types of request fields; `bodies`: the request bodies both apps accept;
  `queries`: the list's and the events page's query parameters.
- `openapi`: the OpenAPI document, made to say what the API does.
- `session`: signing a browser in (the session cookie) and `whoami`.
- `reads`: the read port each app implements (`ExecutionReads`: the server over
  PostgreSQL in `flowtide.server.reads`, `flowtide ui` over SQLite in `flowtide.ui.reads`).
- `executions`: the one executions API router over that port; `catalog`: the catalog's;
  `hooks`: webhooks' (management, and the signed public delivery that starts a run; a
  cluster's delivery goes to the hook's shard through `hooks.ShardedReads`).

It imports `flowtide.documents`, the store port and the engine, never `flowtide.server`
or `flowtide.ui` (tests/unit/test_imports.py).
"""
