"""`flowtide run --server` follows a run on the server's event stream (SSE) and fetches
the execution's document once, at the end: against a scripted server (httpx's mock
transport), a stream that drops is resumed after the last event seen (`Last-Event-ID`),
without gaps or repeats, a server that is restarting (503, refused connections) is
waited for, and the document is asked for once however long the run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from flowtide.cli import run as run_cli
from flowtide.client import ServerClient, ServerError

EID = 42


def _event(i: int, type_: str = "command.completed") -> dict[str, Any]:
    return {
        "event_id": str(1000 + i),
        "execution_id": str(EID),
        "type": type_,
        "step": "work",
        "status": "ok",
        "payload": {"loop_index": i},
        "error": None,
        "parent_event_id": None,
        "command_id": None,
        "worker_id": None,
        "time": 1_700_000_000.0 + i,
    }


def _sse(event: dict[str, Any]) -> bytes:
    data = json.dumps(event, separators=(",", ":"))
    return f"id: {event['event_id']}\nevent: {event['type']}\ndata: {data}\n\n".encode()


END = b'event: end\ndata: {"execution_id":"42","status":"completed","error":null}\n\n'


class Dropped(httpx.ReadError):
    pass


class Server:
    """A scripted flowtide server: `events` are streamed, `cuts` are the numbers of events
    after which a connection breaks (one cut per connection), `unavailable` connections
    are answered 503 first. The run ends when a stream has sent its end, or (for a client
    that polls) at the fifth request of the document."""

    def __init__(self, events: list[dict[str, Any]], cuts: list[int], unavailable: int = 0):
        self.events = events
        self.cuts = list(cuts)
        self.unavailable = unavailable
        self.streams: list[str | None] = []
        self.documents = 0
        self.paths: list[str] = []
        self.ended = False

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        if request.url.path == f"/api/executions/{EID}/events/stream":
            if self.unavailable:
                self.unavailable -= 1
                return httpx.Response(503, json={"error": {"status": 503, "message": "starting"}})
            after = request.headers.get("last-event-id")
            self.streams.append(after)
            start = (
                0
                if after is None
                else 1 + next(i for i, e in enumerate(self.events) if e["event_id"] == after)
            )
            cut = self.cuts.pop(0) if self.cuts else None
            return httpx.Response(
                200,
                headers={"content-type": "text/event-stream"},
                stream=_Body(self, start, cut),
            )
        if request.url.path == f"/api/executions/{EID}":
            self.documents += 1
            self.ended = self.ended or self.documents >= 5
            return httpx.Response(
                200,
                json={
                    "execution_id": str(EID),
                    "status": "completed" if self.ended else "running",
                    "error": None,
                    "result": {"n": len(self.events)},
                    "steps": {},
                    "playbook": "loop.yaml",
                },
            )
        if request.url.path == "/api/execute":
            return httpx.Response(200, json={"execution_id": str(EID)})
        return httpx.Response(404, json={"error": {"status": 404, "message": "no"}})


class _Body(httpx.SyncByteStream):
    def __init__(self, server: Server, start: int, cut: int | None) -> None:
        self.server, self.start, self.cut = server, start, cut

    def __iter__(self) -> Iterator[bytes]:
        yield b"retry: 1000\n\n: keepalive\n\n"
        for n, event in enumerate(self.server.events[self.start :], start=1):
            yield _sse(event)
            if self.cut is not None and n == self.cut:
                raise Dropped("connection reset by peer")
        self.server.ended = True
        yield END


@pytest.fixture(autouse=True)
def _no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("flowtide.client.time.sleep", lambda _s: None)


def _client(server: Server) -> ServerClient:
    api = ServerClient("http://flowtide.test", token="t")
    api._http.close()
    api._http = httpx.Client(base_url=api.url, transport=httpx.MockTransport(server))
    return api


def test_a_dropped_stream_is_resumed_after_the_last_event_seen() -> None:
    events = [_event(i) for i in range(10)]
    server = Server(events, cuts=[3, 4], unavailable=2)
    with _client(server) as api:
        seen = [doc for page in api.follow(EID) for doc in page]
    assert [e["event_id"] for e in seen] == [e["event_id"] for e in events]
    # Three connections: from the start, after the 3rd event, after the 7th.
    assert server.streams == [None, "1002", "1006"]


def test_wait_fetches_the_document_once_at_the_end() -> None:
    server = Server([_event(i) for i in range(500)], cuts=[100])
    with _client(server) as api:
        doc = api.wait(EID)
    assert doc["status"] == "completed" and doc["result"] == {"n": 500}
    assert server.documents == 1
    assert server.streams == [None, "1099"]


def test_a_refusal_is_not_retried() -> None:
    server = Server([], cuts=[])
    with _client(server) as api, pytest.raises(ServerError) as caught:
        api.wait(EID + 1)
    assert caught.value.status == 404


def test_a_server_gone_for_good_ends_the_wait() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    api = ServerClient("http://flowtide.test", token="t")
    api._http = httpx.Client(base_url=api.url, transport=httpx.MockTransport(down))
    with api, pytest.raises(ServerError, match="lost the server"):
        api.wait(EID, reconnect_for=0.0)


@pytest.mark.parametrize("progress", [False, True])
def test_run_on_a_server_prints_the_document_fetched_once(
    progress: bool,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    playbook = tmp_path / "loop.yaml"
    playbook.write_text(
        "apiVersion: noetl.io/v2\nkind: Playbook\nworkflow:\n"
        "  - step: work\n    tool: {kind: python, code: 'result = 1'}\n"
    )
    events = [_event(0, "playbook.initialized")] + [_event(i) for i in range(1, 300)]
    events[0]["payload"] = {"workload": {}}
    events[0]["step"] = None
    server = Server(events, cuts=[120])
    monkeypatch.setattr(run_cli, "server_client", lambda _url: _client(server))
    monkeypatch.setattr(run_cli, "_show_progress", lambda as_json: progress and not as_json)
    code = run_cli._run_remote(
        "http://flowtide.test", str(playbook), {}, as_json=not progress, pool=None
    )
    assert code == 0
    captured = capsys.readouterr()
    out = captured.out
    if progress:
        # Off a terminal the status line goes to stderr, the result (JSON) to stdout.
        assert "completed" in captured.err and json.loads(out) == {"n": 300}
    else:
        assert json.loads(out)["result"] == {"n": 300}
    assert server.documents == 1
    assert server.paths.count(f"/api/executions/{EID}/events/stream") == 2
