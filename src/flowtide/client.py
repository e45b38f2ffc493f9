"""A small client of the flowtide server's HTTP API, for the command line (`--server`).

    with ServerClient("http://127.0.0.1:8082") as api:
        eid = api.execute(playbook=text, payload={"count": 3})
        for batch in api.follow(eid):
            ...
        doc = api.execution(eid)

Every failure is a `ServerError` carrying the server's own message (the API answers errors
as {"error": {"status", "message", ...}}) or saying the server cannot be reached.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx

from flowtide.urls import redact_url

__all__ = ["ServerClient", "ServerError"]

TERMINAL = ("completed", "failed", "cancelled")


class ServerError(Exception):
    """The server refused a request (`status` is its HTTP status) or is unreachable (0)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class ServerClient:
    """Synchronous calls to one flowtide server."""

    def __init__(self, url: str, *, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ServerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ------------------------------------------------------------------------

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            r = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ServerError(f"cannot reach the server at {redact_url(self.url)}: {exc}") from None
        if r.status_code >= 400:
            try:
                message = r.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = r.text.strip() or r.reason_phrase
            raise ServerError(str(message), r.status_code)
        return r.json()

    # -- executions ----------------------------------------------------------------------

    def execute(
        self,
        *,
        playbook: str | None = None,
        catalog_id: str | None = None,
        payload: dict[str, Any] | None = None,
        pool: str | None = None,
    ) -> int:
        """Start an execution of inline YAML or of a catalog entry (`path` or `path@version`);
        its id."""
        body: dict[str, Any] = {"payload": payload or {}}
        if playbook is not None:
            body["playbook"] = playbook
        if catalog_id is not None:
            body["catalog_id"] = catalog_id
        if pool:
            body["pool"] = pool
        return int(self._call("POST", "/api/execute", json=body)["execution_id"])

    def execution(self, execution_id: int) -> dict[str, Any]:
        """The execution's document (the same as `flowtide run --json` prints)."""
        return dict(self._call("GET", f"/api/executions/{execution_id}"))

    def list_executions(self, *, status: str | None = None, limit: int = 50) -> list[Any]:
        params: dict[str, Any] = {"limit": limit}
        if status:
            params["status"] = status
        return list(self._call("GET", "/api/executions", params=params)["items"])

    def cancel(self, execution_id: int, reason: str) -> dict[str, Any]:
        return dict(
            self._call("POST", f"/api/executions/{execution_id}/cancel", json={"reason": reason})
        )

    def events(
        self, execution_id: int, *, after: int | None = None, limit: int = 1000
    ) -> list[dict[str, Any]]:
        """One page of the execution's events in log order, after event `after`."""
        params: dict[str, Any] = {"limit": limit}
        if after is not None:
            params["after"] = after
        return list(self._call("GET", f"/api/executions/{execution_id}/events", params=params))

    def all_events(self, execution_id: int) -> Iterator[dict[str, Any]]:
        """Every event logged so far, page by page."""
        after: int | None = None
        while True:
            page = self.events(execution_id, after=after, limit=5000)
            yield from page
            if len(page) < 5000:
                return
            after = int(page[-1]["event_id"])

    def follow(self, execution_id: int, *, poll: float = 0.25) -> Iterator[list[dict[str, Any]]]:
        """Batches of new events as they are logged, until the execution has ended and
        every event has been seen."""
        after: int | None = None
        delay = 0.02
        while True:
            page = self.events(execution_id, after=after, limit=5000)
            if page:
                after = int(page[-1]["event_id"])
                yield page
                delay = 0.02
                if len(page) == 5000:
                    continue
            status = self._call("GET", f"/api/executions/{execution_id}/status")["status"]
            if status in TERMINAL:
                tail = self.events(execution_id, after=after, limit=5000)
                while tail:
                    yield tail
                    after = int(tail[-1]["event_id"])
                    tail = self.events(execution_id, after=after, limit=5000)
                return
            time.sleep(delay)
            delay = min(delay * 1.5, poll)

    def wait(self, execution_id: int, *, poll: float = 0.5) -> dict[str, Any]:
        """Block until the execution ends; its document."""
        delay = 0.02
        while True:
            doc = self.execution(execution_id)
            if doc["status"] in TERMINAL:
                return doc
            time.sleep(delay)
            delay = min(delay * 1.5, poll)

    # -- catalog -------------------------------------------------------------------------

    def register_playbook(self, content: str) -> dict[str, Any]:
        """Validate and record a playbook under its metadata.path; path, version, catalog_id."""
        return dict(self._call("POST", "/api/catalog/register", json={"content": content}))

    def list_playbooks(self) -> list[Any]:
        doc = self._call("GET", "/api/catalog/list")
        return list(doc["items"] if isinstance(doc, dict) else doc)

    def get_playbook(self, path: str, version: int | None = None) -> dict[str, Any]:
        params = {"version": version} if version else {}
        return dict(self._call("GET", f"/api/catalog/{path}", params=params))
