"""A small client of the flowtide server's HTTP API, for the command line (`--server`).

    with ServerClient("http://127.0.0.1:8082") as api:
        eid = api.execute(playbook=text, payload={"count": 3})
        for batch in api.follow(eid):
            ...
        doc = api.execution(eid)

Every failure is a `ServerError` carrying the server's own message (the API answers errors
as {"error": {"status", "message", ...}}) or saying the server cannot be reached.

Every call carries `Authorization: Bearer <token>`: the token given, else FLOWTIDE_TOKEN,
FLOWTIDE_TOKEN_FILE or the dev stack's (see flowtide.auth.login).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import httpx

from flowtide.errors import ServerError
from flowtide.urls import redact_url

__all__ = ["ServerClient", "ServerError"]

TERMINAL = ("completed", "failed", "cancelled")
T = TypeVar("T")


class ServerClient:
    """Synchronous calls to one flowtide server."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 30.0,
        token: str | None = None,
        ca: str | None = None,
    ) -> None:
        """`token`: see flowtide.auth.login; `ca`: the CA file that signed an https
        server's certificate (default FLOWTIDE_CA, or the system's; see flowtide.tls)."""
        from flowtide.auth.login import resolve_token
        from flowtide.errors import FlowtideError
        from flowtide.tls import client_tls

        self.url = url.rstrip("/")
        try:
            self.token = resolve_token(self.url, token)
            self._tls = client_tls(self.url, ca=ca)
            verify = self._tls.context()
        except FlowtideError as exc:
            raise ServerError(str(exc)) from None
        headers = {"authorization": f"Bearer {self.token}"} if self.token else {}
        self._http = httpx.Client(
            base_url=self.url, timeout=timeout, headers=headers, verify=verify
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ServerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ------------------------------------------------------------------------

    def _unreachable(self, exc: httpx.HTTPError) -> ServerError:
        """The error of a call that got no answer, with what to do when TLS is why."""
        text = str(exc) or type(exc).__name__
        hint = ""
        if self.url.startswith("https://"):
            if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
                hint = (
                    "; the server's certificate is not signed by a CA this client trusts:"
                    " give the CA's file with --ca FILE or FLOWTIDE_CA (the dev stack's is"
                    " HOME/dev/tls/ca.pem, found on its own with --home HOME)"
                )
            elif self._tls.cert is None and isinstance(
                exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.ConnectError)
            ):
                hint = (
                    "; if the server requires mutual TLS, show a client certificate:"
                    " FLOWTIDE_CLIENT_CERT and FLOWTIDE_CLIENT_KEY (for the dev stack,"
                    " --home HOME finds HOME/dev/tls/admin.pem and its key on their own)"
                )
        return ServerError(f"cannot reach the server at {redact_url(self.url)}: {text}{hint}")

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            r = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        if r.status_code >= 400:
            self._raise_for(r)
        return r.json()

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        """One call of the API (`path` from `/api/...`): its JSON answer, None for 204.
        Raises ServerError like every call here."""
        try:
            r = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        if r.status_code >= 400:
            self._raise_for(r)
        return None if r.status_code == 204 else r.json()

    def _raise_for(self, r: httpx.Response) -> None:
        try:
            message = str(r.json()["error"]["message"])
        except (ValueError, KeyError, TypeError):
            message = r.text.strip() or r.reason_phrase
        if r.status_code == 401:
            message += (
                " (no token was sent: export FLOWTIDE_TOKEN=... or FLOWTIDE_TOKEN_FILE=PATH;"
                " an admin creates one with `flowtide token create`)"
                if not self.token
                else " (the token in use was refused: is it revoked or expired?)"
            )
        raise ServerError(message, r.status_code)

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

    def list_executions(
        self, *, status: str | None = None, limit: int = 50, trigger: str | None = None
    ) -> list[Any]:
        params: dict[str, Any] = {"limit": limit}
        if status:
            params["status"] = status
        if trigger:
            params["trigger"] = trigger
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

    def follow(
        self, execution_id: int, *, reconnect_for: float = 120.0
    ) -> Iterator[list[dict[str, Any]]]:
        """Events as the server logs them, in log order, until the execution has ended
        (the server's SSE stream `GET /api/executions/{id}/events/stream`).

        A dropped connection (a server restart) is resumed from the last event seen
        (`Last-Event-ID`): nothing is missed or repeated. After `reconnect_for` seconds
        without a server, `ServerError` is raised.
        """
        import json

        for _id, data in self._stream(execution_id, reconnect_for=reconnect_for):
            yield [json.loads(data)]

    def logs(
        self, execution_id: int, step: str | None = None, follow: bool = False
    ) -> Iterator[dict[str, Any]]:
        """What the execution's steps wrote (`GET /api/executions/{id}/logs`), piece by
        piece; with `follow`, as they write it, until the execution ends."""
        import json

        params: dict[str, Any] = {"follow": "true" if follow else "false"}
        if step is not None:
            params["step"] = step
        with self._http.stream(
            "GET",
            f"/api/executions/{execution_id}/logs",
            params=params,
            timeout=httpx.Timeout(30.0, read=90.0),
        ) as r:
            if r.status_code >= 400:
                r.read()
                self._raise_for(r)
            for line in r.iter_lines():
                if line.strip():
                    yield json.loads(line)

    def wait(self, execution_id: int, *, reconnect_for: float = 120.0) -> dict[str, Any]:
        """Block until the execution ends; its document. The end is noticed on the event
        stream (as `follow` reads it: a server restart is ridden out), and the document,
        which holds every result, is fetched once, after it."""
        for _ in self._stream(execution_id, reconnect_for=reconnect_for):
            pass
        return self.final(execution_id)

    def final(self, execution_id: int, *, poll: float = 0.5) -> dict[str, Any]:
        """The document of an execution that has ended (its stream said so): one fetch.
        Should the document not be terminal yet, it is asked again until it is."""
        delay = 0.05
        while True:
            doc = self._retrying(lambda: self.execution(execution_id))
            if doc["status"] in TERMINAL:
                return doc
            time.sleep(delay)
            delay = min(delay * 2, poll)

    # -- following -----------------------------------------------------------------------

    #: Answers of a server that is starting or stopping (or of a proxy in front of one):
    #: asked again, as a connection refused is.
    _UNAVAILABLE = frozenset({502, 503, 504})

    def _retrying(self, call: Callable[[], T], *, reconnect_for: float = 120.0) -> T:
        """`call`, asked again while the server cannot be reached or is unavailable, for
        up to `reconnect_for` seconds."""
        down_since: float | None = None
        while True:
            try:
                return call()
            except ServerError as exc:
                if exc.status and exc.status not in self._UNAVAILABLE:
                    raise
                down_since = down_since or time.monotonic()
                if time.monotonic() - down_since > reconnect_for:
                    raise
            time.sleep(1.0)

    def _stream(self, execution_id: int, *, reconnect_for: float) -> Iterator[tuple[str, str]]:
        """(event id, data) of each event on the execution's SSE stream, in log order,
        until its `end`. Reconnects with `Last-Event-ID` when the stream drops."""
        last: str | None = None
        down_since: float | None = None
        delay = 0.1
        while True:
            headers = {"accept": "text/event-stream"}
            if last is not None:
                headers["last-event-id"] = last
            try:
                with self._http.stream(
                    "GET",
                    f"/api/executions/{execution_id}/events/stream",
                    headers=headers,
                    timeout=httpx.Timeout(30.0, read=90.0),
                ) as r:
                    if r.status_code >= 400:
                        r.read()
                        if r.status_code not in self._UNAVAILABLE:
                            self._raise_for(r)
                        raise httpx.TransportError(f"{r.status_code} {r.reason_phrase}")
                    down_since, delay = None, 0.1
                    kind, event_id, data = "message", "", list[str]()
                    for line in r.iter_lines():
                        if line == "":
                            if kind == "end":
                                return
                            if data:
                                last = event_id or last
                                yield event_id, "\n".join(data)
                            kind, event_id, data = "message", "", list[str]()
                        elif line.startswith("data:"):
                            data.append(line[5:].lstrip())
                        elif line.startswith("id:"):
                            event_id = line[3:].strip()
                        elif line.startswith("event:"):
                            kind = line[6:].strip()
                # The stream ended without `end`: the server went away mid-stream.
            except httpx.HTTPError as exc:
                now = time.monotonic()
                down_since = down_since or now
                if now - down_since > reconnect_for:
                    raise ServerError(
                        f"lost the server at {redact_url(self.url)} for {reconnect_for:.0f}s: {exc}"
                    ) from None
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

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

    # -- credentials and tokens (admin) --------------------------------------------------

    def set_credential(self, name: str, data: dict[str, Any], kind: str = "generic") -> Any:
        body = {"name": name, "data": data, "kind": kind}
        return self._call("POST", "/api/credentials", json=body)

    def list_credentials(self) -> list[Any]:
        return list(self._call("GET", "/api/credentials"))

    def delete_credential(self, name: str) -> Any:
        return self._call("DELETE", f"/api/credentials/{name}")

    def add_hook(self, body: dict[str, Any]) -> dict[str, Any]:
        """Add (or replace) a webhook: name, playbook, version, workload, rate and secret
        or secret_credential (`POST /api/hooks`)."""
        return dict(self._call("POST", "/api/hooks", json=body))

    def list_hooks(self) -> list[Any]:
        return list(self._call("GET", "/api/hooks")["items"])

    def get_hook(self, name: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/api/hooks/{name}"))

    def delete_hook(self, name: str) -> Any:
        return self._call("DELETE", f"/api/hooks/{name}")

    def create_token(
        self,
        role: str,
        *,
        name: str | None = None,
        pool: str | None = None,
        expires_in: float | None = None,
    ) -> dict[str, Any]:
        """A new API token: its record and, under "token", its text (shown this once)."""
        body = {"role": role, "name": name, "pool": pool, "expires_in": expires_in}
        return dict(self._call("POST", "/api/tokens", json=body))

    def list_tokens(self, *, include_inactive: bool = False) -> list[Any]:
        params = {"all": "true"} if include_inactive else {}
        return list(self._call("GET", "/api/tokens", params=params)["items"])

    def revoke_token(self, id_or_name: str) -> dict[str, Any]:
        return dict(self._call("DELETE", f"/api/tokens/{id_or_name}"))

    def whoami(self) -> dict[str, Any]:
        return dict(self._call("GET", "/api/whoami"))
