"""Fixtures for the tool tests: a real PostgreSQL, a real HTTP stub and a credential vault.

Nothing is mocked except the vault's store (a dict stands in for the SQLite store).
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request, Response
from fastapi.responses import (
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    StreamingResponse,
)

from flowtide.credentials import CredentialVault
from flowtide.errors import NotFoundError
from flowtide.tools.base import ToolContext

try:
    from tests.pgserver import PgServer, PgServerError, find_pg_bin
except ImportError:  # tests/ is not a package: import the helper by its directory
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from pgserver import PgServer, PgServerError, find_pg_bin  # type: ignore[no-redef]


# ---------------------------------------------------------------------------------------
# Credential vault over a dict store
# ---------------------------------------------------------------------------------------


class DictStore:
    """In-memory stand-in for the SQLite store's credential table."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[str, bytes, float]] = {}

    def put_credential(self, name: str, kind: str, ciphertext: bytes, *, updated: float) -> None:
        self.rows[name] = (kind, ciphertext, updated)

    def get_credential(self, name: str) -> tuple[str, bytes]:
        try:
            kind, ciphertext, _ = self.rows[name]
        except KeyError:
            raise NotFoundError(f"no credential {name!r}") from None
        return kind, ciphertext

    def list_credentials(self) -> list[dict[str, Any]]:
        return [
            {"name": name, "kind": kind, "updated": updated}
            for name, (kind, _, updated) in self.rows.items()
        ]

    def delete_credential(self, name: str) -> None:
        if self.rows.pop(name, None) is None:
            raise NotFoundError(f"no credential {name!r}")


@pytest.fixture
def store() -> DictStore:
    return DictStore()


@pytest.fixture
def vault(store: DictStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CredentialVault:
    monkeypatch.delenv("FLOWTIDE_MASTER_KEY", raising=False)
    return CredentialVault(store, tmp_path / "home")


@pytest.fixture
def make_ctx(vault: CredentialVault, tmp_path: Path) -> Any:
    """Factory for ToolContexts that resolve credentials through `vault`."""

    def make(**overrides: Any) -> ToolContext:
        fields: dict[str, Any] = {
            "execution_id": 1,
            "step": "test_step",
            "task": "test_task",
            "base_dir": tmp_path,
            "credentials": vault,
        }
        fields.update(overrides)
        return ToolContext(**fields)

    return make


# ---------------------------------------------------------------------------------------
# PostgreSQL
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pg() -> Iterator[PgServer]:
    """A throw-away PostgreSQL cluster on 127.0.0.1 for the whole session."""
    if find_pg_bin() is None:
        pytest.skip("PostgreSQL server binaries not found; run scripts/ensure-postgres.sh")
    try:
        server = PgServer.start()
    except PgServerError as exc:
        pytest.fail(f"cannot start the test PostgreSQL: {exc}")
    try:
        yield server
    finally:
        # Pools first: their connections would otherwise be cut by the shutdown.
        from flowtide.tools.postgres import close_pools

        close_pools()
        server.stop()


@pytest.fixture
def pg_alias(pg: PgServer, vault: CredentialVault) -> str:
    """Alias `pg_test` in the test vault pointing at the session server."""
    vault.set("pg_test", pg.credential(), kind="postgres")
    return "pg_test"


# ---------------------------------------------------------------------------------------
# HTTP stub server
# ---------------------------------------------------------------------------------------


def _build_stub_app() -> FastAPI:
    # FastAPI resolves the (string) annotations below in this module's globals, which is
    # why its classes are imported at module level.
    app = FastAPI()
    probe = {"active": 0, "max_active": 0, "lock": threading.Lock()}

    @app.get("/json")
    async def json_ok() -> dict[str, Any]:
        return {"message": "hello", "items": [1, 2, 3]}

    @app.get("/text")
    async def text_ok() -> Response:
        return PlainTextResponse("plain text body")

    @app.get("/endless")
    async def endless() -> Response:
        # A body with no Content-Length that goes on (up to 64 MiB): a reader has to stop.
        async def chunks() -> Any:
            for _ in range(1024):
                yield b"x" * 65536

        return StreamingResponse(chunks(), media_type="text/plain")

    @app.get("/empty-json")
    async def empty_json() -> Response:
        return Response(content=b"", media_type="application/json")

    @app.get("/bad-json")
    async def bad_json() -> Response:
        return Response(content=b"{not json", media_type="application/json")

    @app.get("/non-finite")
    async def non_finite() -> Response:
        # What some servers send, and Python's json parser accepts.
        body = b'{"nan": NaN, "inf": Infinity, "minus_inf": -Infinity, "n": 1.5}'
        return Response(content=body, media_type="application/json")

    @app.get("/headers")
    async def custom_headers() -> Response:
        return JSONResponse({"ok": True}, headers={"X-Custom-Thing": "yes"})

    @app.api_route("/echo", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def echo(request: Request) -> dict[str, Any]:
        body = await request.body()
        return {
            "method": request.method,
            "query": dict(request.query_params),
            "headers": dict(request.headers),
            "body": body.decode(),
        }

    @app.get("/status/{code}")
    async def status(code: int) -> Response:
        headers = {}
        if code == 429:
            headers["Retry-After"] = "7"
        elif code == 503:
            headers["Retry-After"] = "3"
        return JSONResponse({"error": f"status {code}"}, status_code=code, headers=headers)

    @app.get("/slow")
    async def slow(seconds: float = 2.0) -> dict[str, Any]:
        await asyncio.sleep(seconds)
        return {"slow": True}

    @app.get("/redirect")
    async def redirect() -> Response:
        return RedirectResponse("/json", status_code=302)

    @app.get("/probe")
    async def concurrency_probe(delay: float = 0.2) -> dict[str, Any]:
        with probe["lock"]:
            probe["active"] += 1
            probe["max_active"] = max(probe["max_active"], probe["active"])
        try:
            await asyncio.sleep(delay)
        finally:
            with probe["lock"]:
                probe["active"] -= 1
        return {"ok": True}

    @app.get("/records")
    async def records(n: int = 10) -> dict[str, Any]:
        # Nested records under data.items, as paginated APIs return them (transfer tests).
        items = [
            {"id": i, "user": {"id": i % 3, "name": f"u{i}"}, "title": f"it's {i}", "tags": ["a"]}
            for i in range(1, n + 1)
        ]
        return {"data": {"items": items}, "count": n}

    @app.get("/probe/stats")
    async def probe_stats() -> dict[str, Any]:
        return {"active": probe["active"], "max_active": probe["max_active"]}

    @app.post("/probe/reset")
    async def probe_reset() -> dict[str, Any]:
        probe["max_active"] = 0
        return {"ok": True}

    return app


class StubServer:
    """uvicorn serving the stub app on a free 127.0.0.1 port in a background thread."""

    def __init__(self) -> None:
        import uvicorn

        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        self.port = int(self._socket.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            _build_stub_app(),
            log_level="warning",
            access_log=False,
            lifespan="off",
            loop="asyncio",
            http="h11",
            ws="none",
            # The slow endpoint may still be sleeping when the session ends.
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + 15
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the HTTP stub server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=15)
        self._socket.close()


@pytest.fixture(scope="session")
def http_stub() -> Iterator[StubServer]:
    """Base URL holder of the running stub (`http_stub.url`)."""
    server = StubServer()
    server.start()
    try:
        yield server
    finally:
        from flowtide.tools.http import close_clients

        close_clients()
        server.stop()
