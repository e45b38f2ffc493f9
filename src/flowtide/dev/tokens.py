"""The dev stack's API tokens: an admin token and a worker token for its pool, created in
its database on `up` and kept in tokens.json (mode 0600), where the CLI finds the admin's
for the stack's URL (flowtide.auth.login) and `up` the workers'.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from flowtide.dev.config import write_private
from flowtide.dev.layout import StackLayout
from flowtide.dev.processes import DevStackError
from flowtide.errors import FlowtideError

__all__ = ["ensure_tokens"]


def ensure_tokens(layout: StackLayout, progress: Callable[[str], None]) -> None:
    """An admin token and a worker token for the stack's pool, kept in tokens.json
    (mode 0600); the ones of an earlier `up` are reused while the database takes them.
    With shards they live in the cluster database (opening it with shard 0's brings
    both schemas up to date; each server upgrades its own shard's).

    Raises:
        DevStackError: the database refused (the message says why).
    """
    from flowtide.auth.tokens import TokenStore
    from flowtide.errors import AuthError
    from flowtide.store.postgres import PostgresStore

    pool = layout.config.pool
    doc = layout.tokens()
    shard0 = layout.shard_urls[0]
    cluster = None if shard0 == layout.db_url else layout.db_url
    try:
        with PostgresStore(shard0, cluster_dsn=cluster, max_size=2) as store:
            tokens = TokenStore(store)

            def usable(text: object) -> bool:
                try:
                    return isinstance(text, str) and bool(tokens.verify(text))
                except AuthError:
                    return False

            admin = doc.get("admin")
            workers = dict(doc.get("workers") or {})
            if not usable(admin):
                admin = _new_token(tokens, "admin", "dev-admin", None)
                progress("tokens: created an admin token")
            if not usable(workers.get(pool)):
                workers[pool] = _new_token(tokens, "worker", f"dev-worker-{pool}", pool)
                progress(f"tokens: created a worker token for pool {pool}")
    except FlowtideError as exc:
        raise DevStackError(f"tokens: {exc}") from None
    doc = {"server_url": layout.server_url, "admin": admin, "workers": workers}
    if layout.config.shards > 1:
        # The CLI finds the token of `server_url` on its own (flowtide.auth.login);
        # the other shards' servers take the same token.
        doc["server_urls"] = [s.url for s in layout.servers()]
    write_private(layout.tokens_path, doc)


def _new_token(tokens: Any, role: str, name: str, pool: str | None) -> str:
    from flowtide.errors import NotFoundError

    # A token of this name from an earlier stack (its text lost): replaced.
    with contextlib.suppress(NotFoundError):
        tokens.revoke(name)
    text, _ = tokens.create(role=role, name=name, pool=pool)
    return str(text)
