"""Fixtures of the distributed tests: one stack per module (server + 2 workers), on a
nats-server with flowtide's users and subject permissions (as `flowtide dev up` runs it)."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kv"))

from natsserver import NatsServer  # noqa: E402

from .stack import Stack  # noqa: E402

_names = itertools.count()


@pytest.fixture(scope="module")
def stack(
    pg_server: Any, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Stack]:
    """The module's stack; a module sets STACK_WORKERS to start other than 2 workers, and
    STACK_CONCURRENCY for other than 8 slots each."""
    workers = getattr(request.module, "STACK_WORKERS", 2)
    concurrency = getattr(request.module, "STACK_CONCURRENCY", 8)
    root = tmp_path_factory.mktemp("stack")
    name = f"dist_{next(_names)}"
    db = pg_server.create_database(name)
    # "nokey": a worker started by tests/distributed/test_access.py.
    nats = NatsServer.start_secured(root / "nats", pools=("default", "nokey"))
    stack = Stack(db=db, nats=nats.url, root=root, nats_users=nats.users)
    try:
        stack.start_server()
        for _ in range(workers):
            stack.start_worker(concurrency=concurrency)
        yield stack
    finally:
        stack.stop()
        nats.stop()
        pg_server.drop_database(name)
