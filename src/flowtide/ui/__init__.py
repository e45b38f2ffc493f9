"""The web UI: its static page (`static/`, plain JavaScript modules and CSS, no build)
and the routes that serve it (`pages`, which the server mounts too), and `flowtide ui`'s
app over the local store: its wiring (`local`: its own token, a Host check), its side of
the executions API (`reads`: the store, the runtime that runs the page's runs) and the
states it folds incrementally (`fold`). The documents the page reads are
`flowtide.documents`; the routes that serve them, `flowtide.web`.

Never imports `flowtide.server` (tests/unit/test_imports.py).
"""
