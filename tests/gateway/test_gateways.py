"""The drift guard of phase F: the real gateways — Debian's HAProxy (with Lua) and nginx
(with njs) — configured by `flowtide shards gateway-config`, in front of three stub
servers on loopback, send each of 10,000 requests to the shard `shard_for` names: ids
in paths and in the X-Flowtide-Execution header, at the edges of the 64-bit range too.
They also route as the servers do (`routed_shard`, which every case here is checked
against): the id in the path first, then X-Flowtide-Shard, then X-Flowtide-Execution; an
invalid X-Flowtide-Shard goes to any server, which answers the 400."""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import httpx
import pytest

from flowtide.server.forwarding import BadRoute, routed_shard
from flowtide.sharding import shard_for
from flowtide.wire import CLAIM_PATH, EXECUTION_HEADER, HEARTBEAT_PATH, REPORTS_PATH, SHARD_HEADER

from .launch import start as _start

SHARDS = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stub(index: int) -> ThreadingHTTPServer:
    """A server of shard `index`: answers every request with its index and the path."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            # Headers and body go out as two writes: without this, Nagle's algorithm
            # holds the body for the peer's delayed ACK (40 ms a request).
            self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def _answer(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            if length:
                self.rfile.read(length)
            body = json.dumps({"shard": index, "path": self.path}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = _answer  # noqa: N815 - http.server's names
        do_POST = _answer  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    class Server(ThreadingHTTPServer):
        def handle_error(self, request: object, client_address: object) -> None:
            pass  # HAProxy's health checks connect and hang up: not an error here

    server = Server(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module", params=["haproxy", "nginx"])
def gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    kind = request.param
    stubs = [_stub(i) for i in range(SHARDS)]
    folder = tmp_path_factory.mktemp(kind)
    port = _free_port()
    backends = [
        arg
        for i, stub in enumerate(stubs)
        for arg in ("--backend", f"{i}=http://127.0.0.1:{stub.server_address[1]}")
    ]
    try:
        proc = _start(kind, folder, port, backends)
    except BaseException:
        for stub in stubs:
            stub.shutdown()
            stub.server_close()
        raise
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(f"{url}/api/executions", timeout=1)
                break
            except httpx.HTTPError:
                assert proc.poll() is None, (folder / f"{kind}.log").read_text()
                assert time.monotonic() < deadline, f"{kind} did not listen"
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        for stub in stubs:
            stub.shutdown()
            stub.server_close()


def _requests(ids: list[int]) -> Iterator[tuple[int, str, str, dict[str, str]]]:
    forms = [
        ("GET", "/api/executions/{id}", {}),
        ("GET", "/api/executions/{id}/events?after=0", {}),
        ("GET", "/api/internal/executions/{id}/result", {}),
        ("GET", "/api/vars/{id}", {}),
        ("POST", "/api/commands/claim", {"X-Flowtide-Execution": "{id}"}),
    ]
    for n, execution_id in enumerate(ids):
        method, path, headers = forms[n % len(forms)]
        yield (
            execution_id,
            method,
            path.format(id=execution_id),
            {k: v.format(id=execution_id) for k, v in headers.items()},
        )


def test_ten_thousand_ids_land_on_their_shard(gateway: str) -> None:
    rng = random.Random(17)
    edges = [0, 1, -1, 42, 2**63 - 1, -(2**63), 384047186877669376]
    ids = edges + [rng.randint(-(2**63), 2**63 - 1) for _ in range(10_000 - len(edges))]
    wrong = []
    seen = set()
    with httpx.Client(base_url=gateway, timeout=10) as client:
        for execution_id, method, path, headers in _requests(ids):
            r = client.request(
                method, path, headers=headers, content=b"{}" if method == "POST" else None
            )
            assert r.status_code == 200, (path, r.text)
            got = r.json()["shard"]
            seen.add(got)
            if got != shard_for(execution_id, SHARDS):
                wrong.append((execution_id, path, got))
    assert not wrong, wrong[:5]
    assert seen == set(range(SHARDS))


def test_requests_without_an_execution_go_to_any_server(gateway: str) -> None:
    shards = set()
    with httpx.Client(base_url=gateway, timeout=10) as client:
        for path in ["/api/executions", "/api/catalog/list", "/api/execute"] * 6:
            r = client.get(path)
            assert r.status_code == 200
            shards.add(r.json()["shard"])
        # Not an id (out of range, not digits): as if none was named.
        for bad in ["9223372036854775808", "12abc"]:
            r = client.get(f"/api/executions/{bad}")
            assert r.status_code == 200
            r = client.post("/api/commands/claim", headers={"X-Flowtide-Execution": bad})
            assert r.status_code == 200
    assert shards == set(range(SHARDS))  # round robin over every server


Headers = list[tuple[str, str]]
#: A request, and the shard it must land on (None: any server, round robin).
Case = tuple[str, str, Headers, int | None]


def _routed(path: str, headers: Headers) -> int | None:
    """Where flowtide's servers send the request (None: the server that receives it
    answers it, 400 for a bad header): the path as uvicorn gives it, percent-decoded, and
    the last of repeated headers."""
    raw = {name.lower().encode(): value.strip().encode() for name, value in headers}
    try:
        shard: int | None = routed_shard(unquote(path.partition("?")[0]), raw, SHARDS)
    except BadRoute:
        return None
    return shard


def _landed(client: httpx.Client, method: str, path: str, headers: Headers) -> int:
    r = client.request(method, path, headers=headers, content=b"{}" if method == "POST" else None)
    assert r.status_code == 200, (method, path, headers, r.status_code, r.text)
    assert r.json()["path"] == path  # passed on as it came
    return int(r.json()["shard"])


def _check(gateway: str, cases: list[Case]) -> None:
    """Each case is routed by the servers as it says, and lands there through the gateway:
    on its shard, or (None) on every server in turn."""
    disagree = [(path, h, want) for _, path, h, want in cases if _routed(path, h) != want]
    assert not disagree, ("the servers route these otherwise", disagree[:5])
    wrong = []
    with httpx.Client(base_url=gateway, timeout=10) as client:
        for method, path, headers, want in cases:
            if want is None:
                got: object = {_landed(client, method, path, headers) for _ in range(2 * SHARDS)}
                if got != set(range(SHARDS)):
                    wrong.append((path, headers, got))
            else:
                got = _landed(client, method, path, headers)
                if got != want:
                    wrong.append((path, headers, got))
    assert not wrong, wrong[:5]


def _ids_by_shard(rng: random.Random, each: int = 20) -> dict[int, list[int]]:
    ids: dict[int, list[int]] = {i: [] for i in range(SHARDS)}
    while min(len(v) for v in ids.values()) < each:
        execution_id = rng.randint(-(2**63), 2**63 - 1)
        ids[shard_for(execution_id, SHARDS)].append(execution_id)
    return ids


def test_the_shard_header_names_the_backend(gateway: str) -> None:
    rng = random.Random(23)
    by_shard = _ids_by_shard(rng)
    # No execution id in the path, as the server reads it: the header decides.
    paths = [
        CLAIM_PATH,
        REPORTS_PATH,
        HEARTBEAT_PATH,
        "/api/executions",
        "/api/executions/12abc",
        "/api/executions/" + "1" * 21,
    ]
    forms = ["{k}", "+{k}", "00{k}", "0_{k}"]  # what int() reads
    cases: list[Case] = []
    for n in range(300):
        k = n % SHARDS
        headers = [(SHARD_HEADER, rng.choice(forms).format(k=k))]
        if n % 2:  # an X-Flowtide-Execution of another shard: X-Flowtide-Shard comes first
            headers.append((EXECUTION_HEADER, str(rng.choice(by_shard[(k + 1) % SHARDS]))))
        cases.append(("POST", rng.choice(paths), headers, k))
    cases += [
        ("POST", CLAIM_PATH, [(SHARD_HEADER, "-0")], 0),
        # Repeated: the last one counts.
        ("POST", CLAIM_PATH, [(SHARD_HEADER, "x"), (SHARD_HEADER, "1")], 1),
        ("POST", CLAIM_PATH, [(SHARD_HEADER, "2"), (SHARD_HEADER, "0")], 0),
    ]
    _check(gateway, cases)


def test_an_invalid_shard_header_goes_to_any_server(gateway: str) -> None:
    """The server that receives it answers 400; the execution header is not looked at."""
    execution = str(_ids_by_shard(random.Random(29), 1)[0][0])
    bad = ["", "x", "1.0", "0x1", "1_", "_1", "1__0", "1 2", "1,2", "-", "+", "-1"]
    bad += [str(SHARDS), "99", "2147483648", str(2**64)]  # out of range
    cases: list[Case] = []
    for value in bad:
        headers = [(SHARD_HEADER, value), (EXECUTION_HEADER, execution)]
        with pytest.raises(BadRoute):
            routed_shard(CLAIM_PATH, {k.lower().encode(): v.encode() for k, v in headers}, SHARDS)
        cases.append(("POST", CLAIM_PATH, headers, None))
    cases.append(("POST", CLAIM_PATH, [(SHARD_HEADER, "1"), (SHARD_HEADER, "x")], None))
    _check(gateway, cases)


def test_the_path_comes_before_the_headers(gateway: str) -> None:
    rng = random.Random(31)
    by_shard = _ids_by_shard(rng)
    edges = [0, 1, -1, 2**63 - 1, -(2**63)]
    ids = edges + [rng.randint(-(2**63), 2**63 - 1) for _ in range(300 - len(edges))]
    forms = [
        ("GET", "/api/executions/{id}"),
        ("GET", "/api/executions/{id}/events?after=0"),
        ("POST", "/api/internal/executions/{id}/result"),
        ("GET", "/api/vars/{id}"),
    ]

    def conflicting(n: int, shard: int) -> Headers:
        """Headers naming other shards: X-Flowtide-Shard, X-Flowtide-Execution or both."""
        other = str((shard + 1) % SHARDS)
        execution = str(rng.choice(by_shard[(shard + 2) % SHARDS]))
        return [
            [(SHARD_HEADER, other)],
            [(EXECUTION_HEADER, execution)],
            [(SHARD_HEADER, other), (EXECUTION_HEADER, execution)],
        ][n % 3]

    cases: list[Case] = []
    for n, execution_id in enumerate(ids):
        method, path = forms[n % len(forms)]
        shard = shard_for(execution_id, SHARDS)
        cases.append((method, path.format(id=execution_id), conflicting(n, shard), shard))
    # The path as the server reads it: percent-decoded, leading zeros, and Python's `$`
    # that also passes a last newline.
    read = [
        ("/api/executions/%31%32%33", 123),
        ("/api/vars/%2D5", -5),
        ("/api/executions%2F77/events", 77),
        ("/api/internal/executions/0000000000000000042/result", 42),
        ("/api/executions/7%0A", 7),
    ]
    for n, (path, execution_id) in enumerate(read):
        shard = shard_for(execution_id, SHARDS)
        cases.append(("GET", path, conflicting(n, shard), shard))
    # An id in the path outside the 64-bit range names no shard, whatever the headers say.
    for path in [
        "/api/executions/9223372036854775808",
        "/api/vars/-9223372036854775809",
        "/api/executions/99999999999999999999/events",
    ]:
        cases.append(("GET", path, [(SHARD_HEADER, "1"), (EXECUTION_HEADER, "42")], None))
    _check(gateway, cases)


def test_gateway_config_refuses_what_cannot_work(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "flowtide.cli",
                "shards",
                "gateway-config",
                "--out",
                str(tmp_path),
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )

    gap = run("--backend", "0=http://a:1", "--backend", "2=http://c:1")
    assert gap.returncode == 2 and "shards [0, 2]" in gap.stderr
    bad = run("--backend", "zero=http://a:1")
    assert bad.returncode == 2 and "expected SHARD=URL" in bad.stderr
    tls = run("--backend", "0=https://a:1")
    assert tls.returncode == 2 and "--ca" in tls.stderr
    nginx_tls = run("--format", "nginx", "--backend", "0=https://a:1")
    assert nginx_tls.returncode == 2 and "proxies http only" in nginx_tls.stderr
    other = run("--format", "traefik", "--backend", "0=http://a:1")
    assert other.returncode == 2 and "expected haproxy or nginx" in other.stderr
