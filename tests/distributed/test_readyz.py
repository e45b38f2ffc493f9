"""/readyz tells the truth: a server whose database, NATS or KV is unreachable answers 503
naming that one (the others ok), and 200 again once it is back. A real stack of its own:
a private PostgreSQL server (stopped and started with pg_ctl), a nats-server for the
commands and another for the KV bucket, so each can go away alone."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from natsserver import NatsServer  # tests/kv, on sys.path (conftest.py)

from flowtide.dev.postgres import LocalPostgres
from pgserver import PgServer  # tests/, on sys.path (tests/conftest.py)

from .stack import Stack


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("readyz")
    pg = PgServer.start()
    nats = NatsServer.start(root / "nats")
    kv = NatsServer.start(root / "kv")
    stack = Stack(db=pg.dsn, nats=nats.url, kv=kv.url, root=root)
    try:
        stack.start_server()
        yield {"pg": pg, "nats": nats, "kv": kv, "stack": stack}
    finally:
        stack.stop()
        kv.stop()
        nats.stop()
        pg.stop()


def _ready(url: str) -> tuple[int, dict[str, str]]:
    r = httpx.get(f"{url}/readyz", timeout=30)
    return r.status_code, dict(r.json()["checks"])


def _until(url: str, status: int, timeout: float = 45) -> dict[str, str]:
    """Poll /readyz until it answers `status`; its checks then."""
    deadline = time.monotonic() + timeout
    code, checks = _ready(url)
    while code != status:
        if time.monotonic() > deadline:
            raise AssertionError(f"/readyz still {code} after {timeout}s: {checks}")
        time.sleep(0.2)
        code, checks = _ready(url)
    return checks


ALL_OK = {"database": "ok", "nats": "ok", "kv": "ok"}


def test_each_dependency_down_is_named_and_its_return_seen(parts: dict[str, Any]) -> None:
    url = parts["stack"].url
    assert _ready(url) == (200, ALL_OK)

    # The database: pg_ctl stop (fast shutdown), then start on the same port.
    pg: PgServer = parts["pg"]
    LocalPostgres.stop(pg)
    checks = _until(url, 503)
    assert checks["database"].startswith("error"), checks
    assert checks["nats"] == "ok" and checks["kv"] == "ok", checks
    LocalPostgres.start(pg, durable=False)
    assert _until(url, 200) == ALL_OK

    # NATS (the commands' server): stopped, then started on the same port.
    nats: NatsServer = parts["nats"]
    nats.stop()
    checks = _until(url, 503)
    assert checks == {"database": "ok", "nats": "disconnected", "kv": "ok"}, checks
    nats.restart()
    assert _until(url, 200) == ALL_OK

    # The KV's server.
    kv: NatsServer = parts["kv"]
    kv.stop()
    checks = _until(url, 503)
    assert checks["kv"].startswith("error"), checks
    assert checks["database"] == "ok" and checks["nats"] == "ok", checks
    kv.restart()
    assert _until(url, 200) == ALL_OK
    assert parts["stack"].server.poll() is None, "the server kept running throughout"


def test_readyz_names_no_secret(parts: dict[str, Any]) -> None:
    """The database's error is reported, never its password."""
    pg: PgServer = parts["pg"]
    url = parts["stack"].url
    LocalPostgres.stop(pg)
    try:
        checks = _until(url, 503)
        assert pg.password not in str(checks)
    finally:
        LocalPostgres.start(pg, durable=False)
    _until(url, 200)
